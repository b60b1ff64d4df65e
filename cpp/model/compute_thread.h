// One thread computes every llama.cpp graph of the process.
//
// Why: ggml's CPU backend runs a graph's nodes on an OpenMP team, and libgomp
// keeps a team (its worker threads) for every thread that ever started a
// parallel region, until that thread exits. Once two long-lived threads have
// decoded (a server's scheduler and an embedder, chat's warm-up and its turns,
// a test's main thread and a worker), libgomp manages more threads than the
// machine has CPUs and "throttles" its barrier spin: every barrier of every
// graph then sleeps in the kernel, and decoding on any thread runs 25-35 %
// slower on 2 cores. Running every decode here keeps exactly one team alive.
//
// run(f) calls f on the compute thread and returns its result (or rethrows its
// exception) on the caller's; called on the compute thread itself, f runs
// inline. Callers wait while f runs, so callers' own locks keep their meaning;
// f must not wait for a caller (it never needs the GIL: decodes release it).
// Cancellation is unchanged: llama.cpp's abort callback polls the same flags
// from whichever thread computes.
//
// A fork()ed child starts with no compute thread; the first run() there starts
// its own. set_enabled(false) computes on the caller's thread instead (the old
// arrangement: the control of tests/test_compute_thread.py).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace pyspec::compute {

// Runs job on the compute thread and waits for it; rethrows what it threw.
void run_void(const std::function<void()>& job);

template <class F>
auto run(F&& f) -> decltype(f()) {
    using R = decltype(f());
    if constexpr (std::is_void_v<R>) {
        run_void([&] { f(); });
    } else {
        std::optional<R> out;
        run_void([&] { out.emplace(f()); });
        return std::move(*out);
    }
}

void set_enabled(bool on);   // process-wide; tests only
// Distinct OS threads that have run a job (here or inline when disabled):
// 1 when every graph was computed on the compute thread.
int64_t threads_that_computed();

}  // namespace pyspec::compute
