// Where a model's layers live: the local accelerators, or RPC workers (ggml's
// RPC backend: `pyspec rpc-server` or llama.cpp's rpc-server on other machines).
//
// The RPC backend is reached through ggml's backend registry
// (ggml_backend_reg_get_proc_address), never linked, so a libllama built
// without it still loads; rpc_available() says whether it is there.
//
// Faults. ggml-rpc aborts the process on any broken connection (GGML_ABORT in
// its client, some of it on its own dispatcher thread), so a lost worker cannot
// be an exception. What pyspec does instead: it probes each endpoint with a
// timeout before ggml connects (an unreachable worker is an RpcError naming it,
// not an abort), and once a worker is registered it installs ggml's abort
// callback, which turns an RPC abort into one plain line naming the endpoint(s)
// that no longer answer, written to stderr (and to $PYSPEC_RPC_FAULT_FILE when
// set: `pyspec serve`'s supervisor reads it) and exit status kRpcLostExit.
// Nothing is written half-way: the exit skips every writer, and pyspec's files
// are replaced by rename (pyspec/_durable.py).
#pragma once

#include <string>
#include <vector>

struct ggml_backend_device;

namespace pyspec {

using BackendDevice = ggml_backend_device*;

// Exit status of a process whose RPC worker was lost mid-run (EX_TEMPFAIL: try
// again once the worker is back).
constexpr int kRpcLostExit = 75;

// The local accelerators llama.cpp would use by default: its GPUs, else its
// integrated GPUs; never an RPC worker, never the CPU.
std::vector<BackendDevice> local_gpus();
// Whether this build can hold layers on a local accelerator (llama.cpp's
// llama_supports_gpu_offload also says yes for RPC alone).
bool has_local_gpu();

// Whether this libllama has ggml's RPC backend (llama_supports_rpc).
bool rpc_available();
// The RPC protocol version this build speaks ("7.0.0"), "" without RPC.
std::string rpc_protocol();

// The devices of the workers at `endpoints` ("host:port"), in order (each
// endpoint connected once per process; never registered in ggml's device
// list). Throws RpcError naming the endpoint that is
// malformed or that rpc_worker_problem finds wanting, and when this build has
// no RPC backend. Installs the fault handler (above).
std::vector<BackendDevice> rpc_devices(const std::vector<std::string>& endpoints, double timeout_s = 5.0);

// Serves ggml's RPC protocol on `endpoint` from this machine's accelerators
// (else its CPU) until the process ends; returns only when it cannot listen.
// cache_dir: where the worker keeps tensors it was sent ("" = none).
void rpc_serve(const std::string& endpoint, const std::string& cache_dir, int n_threads);

// Whether `endpoint` accepts a TCP connection within timeout_s (a worker busy
// with another driver, or a tunnel to a dead one, still does).
bool endpoint_reachable(const std::string& endpoint, double timeout_s);
// "" when the worker at `endpoint` answers ggml's HELLO within timeout_s with
// this build's protocol; else why not, in a sentence naming it (unreachable,
// silent: busy with another driver or a tunnel's far end down, or another
// protocol version).
std::string rpc_worker_problem(const std::string& endpoint, double timeout_s);

}  // namespace pyspec
