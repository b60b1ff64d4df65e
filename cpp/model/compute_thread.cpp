#include "model/compute_thread.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

namespace pyspec::compute {

namespace {

struct Job {
    const std::function<void()>* work;
    std::exception_ptr error;
    bool done = false;
};

// Never destroyed: at exit a daemon thread may still be waiting on it, and a
// joined thread in a static destructor can deadlock the interpreter's exit.
class Executor {
  public:
    Executor() : thread_([this] { loop(); }) { thread_.detach(); }

    bool on_this_thread() const { return std::this_thread::get_id() == id_.load(); }

    void submit(Job& job) {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_.push_back(&job);
        work_.notify_one();
        done_.wait(lock, [&] { return job.done; });
    }

  private:
    void loop() {
        id_.store(std::this_thread::get_id());
        // Named for ps/top and tests; OpenMP's workers inherit the name.
        pthread_setname_np(pthread_self(), "pyspec-compute");
        for (;;) {
            Job* job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                work_.wait(lock, [&] { return !queue_.empty(); });
                job = queue_.front();
                queue_.pop_front();
            }
            try {
                (*job->work)();
            } catch (...) {
                job->error = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(mutex_);
            job->done = true;
            done_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable work_, done_;
    std::deque<Job*> queue_;
    std::atomic<std::thread::id> id_{};
    std::thread thread_;
};

std::atomic<bool> g_enabled{true};
std::atomic<Executor*> g_executor{nullptr};
std::mutex g_start_mutex;
std::mutex g_seen_mutex;
std::set<std::thread::id> g_seen;

void note_computing_thread() {
    std::lock_guard<std::mutex> lock(g_seen_mutex);
    g_seen.insert(std::this_thread::get_id());
}

// The child of fork() has none of the parent's threads: it starts its own (the
// old executor is abandoned; its mutex may have been held at the fork).
void forget_executor_in_child() {
    g_executor.store(nullptr);
    new (&g_start_mutex) std::mutex();
    new (&g_seen_mutex) std::mutex();
    g_seen.clear();
}

Executor& executor() {
    if (Executor* e = g_executor.load()) return *e;
    std::lock_guard<std::mutex> lock(g_start_mutex);
    if (Executor* e = g_executor.load()) return *e;
    static const int registered = pthread_atfork(nullptr, nullptr, forget_executor_in_child);
    (void)registered;
    auto* e = new Executor();
    g_executor.store(e);
    return *e;
}

}  // namespace

void run_void(const std::function<void()>& job) {
    const auto counted = [&] {
        note_computing_thread();
        job();
    };
    if (!g_enabled.load()) return counted();
    Executor& e = executor();
    if (e.on_this_thread()) return counted();
    const std::function<void()> work = counted;
    Job j{&work, nullptr, false};
    e.submit(j);
    if (j.error) std::rethrow_exception(j.error);
}

void set_enabled(bool on) { g_enabled.store(on); }

int64_t threads_that_computed() {
    std::lock_guard<std::mutex> lock(g_seen_mutex);
    return static_cast<int64_t>(g_seen.size());
}

}  // namespace pyspec::compute
