#include "model/devices.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>
#if __has_include(<ggml-rpc.h>)
#include <ggml-rpc.h>
#endif

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.h"

namespace pyspec {

namespace {

// ggml-rpc's entry points, by name through its registry (devices.h: never linked).
using AddServerFn = ggml_backend_reg_t (*)(const char* endpoint);
using StartServerFn = void (*)(const char* endpoint, const char* cache_dir, size_t n_threads, size_t n_devices,
                               ggml_backend_dev_t* devices);

ggml_backend_reg_t rpc_reg() { return llama_supports_rpc() ? ggml_backend_reg_by_name("RPC") : nullptr; }

template <class Fn>
Fn rpc_proc(const char* name) {
    ggml_backend_reg_t reg = rpc_reg();
    if (reg == nullptr) {
        throw RpcError("this llama.cpp build has no RPC backend: reinstall llama-cpp-python with "
                       "CMAKE_ARGS=\"-DGGML_RPC=ON\" (docs/distributed.md)");
    }
    auto fn = reinterpret_cast<Fn>(ggml_backend_reg_get_proc_address(reg, name));
    if (fn == nullptr) throw RpcError(std::string("this llama.cpp's RPC backend lacks ") + name);
    return fn;
}

bool is_rpc_device(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = rpc_reg();
    return reg != nullptr && ggml_backend_dev_backend_reg(dev) == reg;
}

bool split_endpoint(const std::string& endpoint, std::string& host, std::string& port) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) return false;
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    for (char c : port) {
        if (c < '0' || c > '9') return false;
    }
    const long n = std::strtol(port.c_str(), nullptr, 10);
    return n >= 1 && n <= 65535;
}

// ---------------------------------------------------------------- faults

std::mutex g_registered_mutex;
std::vector<std::string> g_registered;  // endpoints this process connected to, in order

// ggml's abort callback: an RPC abort becomes one line naming the worker(s)
// that no longer answer, and exit status kRpcLostExit (devices.h).
void on_ggml_abort(const char* message) {
    const std::string text = message ? message : "";
    const bool rpc = text.find("RPC") != std::string::npos || text.find("Failed to connect to") != std::string::npos;
    if (!rpc) return;  // ggml prints it and aborts, as without us
    std::vector<std::string> endpoints;
    {
        std::unique_lock<std::mutex> lock(g_registered_mutex, std::try_to_lock);  // never wait inside an abort
        if (lock.owns_lock()) endpoints = g_registered;
    }
    // A worker killed a moment ago may still hold its listening socket while its
    // connections close: look a few times before saying which one is gone.
    std::string lost;
    for (int attempt = 0; attempt < 4 && lost.empty(); ++attempt) {
        usleep(150 * 1000);
        for (const auto& e : endpoints) {
            if (!endpoint_reachable(e, 0.5)) lost += (lost.empty() ? "" : ", ") + e;
        }
    }
    std::string all;
    for (const auto& e : endpoints) all += (all.empty() ? "" : ", ") + e;
    std::string line = lost.empty()
        ? "pyspec: an RPC worker (" + (all.empty() ? std::string("unknown") : all) + ") broke the connection"
        : "pyspec: lost the RPC worker at " + lost + " (it no longer accepts connections)";
    std::string detail = text;
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
    line += "; the generation stopped [ggml: " + detail + "]\n";
    if (const char* path = std::getenv("PYSPEC_RPC_FAULT_FILE"); path && *path) {
        if (FILE* f = std::fopen(path, "w")) {
            std::fputs(line.c_str(), f);
            std::fclose(f);
        }
    }
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    _exit(kRpcLostExit);  // no destructor may talk to the dead worker again (each would abort)
}

}  // namespace

std::vector<BackendDevice> local_gpus() {
    std::vector<BackendDevice> gpus, igpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (is_rpc_device(dev)) continue;
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_GPU: gpus.push_back(dev); break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU: igpus.push_back(dev); break;
            default: break;
        }
    }
    return gpus.empty() ? igpus : gpus;  // as llama.cpp's default: integrated GPUs only without a discrete one
}

bool has_local_gpu() { return !local_gpus().empty(); }

bool rpc_available() { return llama_supports_rpc(); }

std::string rpc_protocol() {
#if defined(RPC_PROTO_MAJOR_VERSION)
    if (rpc_available()) {
        return std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) + "." +
               std::to_string(RPC_PROTO_PATCH_VERSION);
    }
#endif
    return "";
}

namespace {

// A TCP connection to `endpoint` within timeout_s: its socket (blocking again), or -1.
int connect_with_timeout(const std::string& endpoint, double timeout_s) {
    std::string host, port;
    if (!split_endpoint(endpoint, host, port)) return -1;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) return -1;
    int connected = -1;
    for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const int flags = fcntl(fd, F_GETFL, 0);
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);  // a connect that can time out
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            rc = poll(&p, 1, static_cast<int>(timeout_s * 1000)) == 1 ? 0 : -1;
            int err = 0;
            socklen_t len = sizeof(err);
            if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) rc = -1;
        }
        if (rc == 0) {
            fcntl(fd, F_SETFL, flags);
            connected = fd;
        } else {
            close(fd);
        }
    }
    freeaddrinfo(found);
    return connected;
}

// Reads exactly n bytes before the deadline (poll per read).
bool read_exactly(int fd, uint8_t* out, size_t n, std::chrono::steady_clock::time_point deadline) {
    while (n > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{fd, POLLIN, 0};
        if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
        const ssize_t got = recv(fd, out, n, 0);
        if (got <= 0) return false;
        out += got;
        n -= static_cast<size_t>(got);
    }
    return true;
}

}  // namespace

bool endpoint_reachable(const std::string& endpoint, double timeout_s) {
    const int fd = connect_with_timeout(endpoint, timeout_s);
    if (fd < 0) return false;
    close(fd);
    return true;
}

std::string rpc_worker_problem(const std::string& endpoint, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    const int fd = connect_with_timeout(endpoint, timeout_s);
    const std::string secs = std::to_string(static_cast<int>(timeout_s + 0.5)) + " s";
    if (fd < 0) {
        return "cannot reach the RPC worker at " + endpoint + " (no connection within " + secs +
               "): is `pyspec rpc-server` running there, and the port open?";
    }
    // ggml's HELLO (RPC protocol 7): command 14, an 8-byte size, 24 bytes of
    // transport capabilities (none); the answer: an 8-byte size, then major,
    // minor, patch, padding and the worker's 24 bytes of capabilities.
    constexpr uint8_t kHello = 14;
    constexpr uint64_t kCapsSize = 24;
    uint8_t request[1 + 8 + kCapsSize] = {kHello};
    std::memcpy(request + 1, &kCapsSize, 8);
    uint8_t answer[8 + 4 + kCapsSize] = {};
    const bool sent = send(fd, request, sizeof(request), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(request));
    const bool answered = sent && read_exactly(fd, answer, sizeof(answer), deadline);
    close(fd);
    if (!answered) {
        return "the RPC worker at " + endpoint + " accepted a connection but did not answer within " + secs +
               ": a worker serves one driver at a time (is another pyspec or llama.cpp using it?), or a tunnel "
               "to it is up while the worker behind it is not";
    }
    uint64_t size = 0;
    std::memcpy(&size, answer, 8);
    const int major = answer[8], minor = answer[9], patch = answer[10];
#if defined(RPC_PROTO_MAJOR_VERSION)
    if (size != 4 + kCapsSize || major != RPC_PROTO_MAJOR_VERSION || minor > RPC_PROTO_MINOR_VERSION) {
        return "the RPC worker at " + endpoint + " speaks RPC protocol " + std::to_string(major) + "." +
               std::to_string(minor) + "." + std::to_string(patch) + "; this build speaks " + rpc_protocol() +
               ": run a worker of the same llama.cpp version";
    }
#else
    (void)size, (void)major, (void)minor, (void)patch;
#endif
    return "";
}

std::vector<BackendDevice> rpc_devices(const std::vector<std::string>& endpoints, double timeout_s) {
    auto add_server = rpc_proc<AddServerFn>("ggml_backend_rpc_add_server");
    std::vector<BackendDevice> devices;
    for (const auto& endpoint : endpoints) {
        std::string host, port;
        if (!split_endpoint(endpoint, host, port)) {
            throw RpcError("invalid RPC endpoint '" + endpoint + "': expected HOST:PORT, e.g. 127.0.0.1:50052");
        }
        bool known = false;
        {
            std::lock_guard<std::mutex> lock(g_registered_mutex);
            for (const auto& e : g_registered) known = known || e == endpoint;
        }
        // ggml aborts the process on a worker it cannot reach, and waits forever
        // on one that does not answer: ask first, with a timeout. (A worker this
        // process already holds is ours: ggml reuses that connection.)
        if (!known) {
            const std::string problem = rpc_worker_problem(endpoint, timeout_s);
            if (!problem.empty()) throw RpcError(problem);
            std::lock_guard<std::mutex> lock(g_registered_mutex);
            g_registered.push_back(endpoint);
        }
        ggml_set_abort_callback(&on_ggml_abort);
        // Not registered with ggml (as llama.cpp's --rpc does): the model names its
        // devices, and nothing else in the process (llama-cpp-python's default
        // devices, a device listing) may reach a worker that may since be gone.
        ggml_backend_reg_t reg = add_server(endpoint.c_str());  // cached by ggml per endpoint
        if (reg == nullptr) throw RpcError("the RPC worker at " + endpoint + " offers no device");
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) devices.push_back(ggml_backend_reg_dev_get(reg, i));
    }
    return devices;
}

void rpc_serve(const std::string& endpoint, const std::string& cache_dir, int n_threads) {
    auto start_server = rpc_proc<StartServerFn>("ggml_backend_rpc_start_server");
    std::string host, port;
    if (!split_endpoint(endpoint, host, port)) {
        throw RpcError("invalid endpoint '" + endpoint + "': expected HOST:PORT");
    }
    // As llama.cpp's rpc-server: the accelerators if there are any, else the CPU.
    std::vector<ggml_backend_dev_t> devices = local_gpus();
    if (devices.empty()) {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (cpu == nullptr) throw RpcError("this llama.cpp build has no CPU device to serve");
        devices.push_back(cpu);
    }
    start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(),
                 static_cast<size_t>(n_threads > 0 ? n_threads : 1), devices.size(), devices.data());
}

}  // namespace pyspec
