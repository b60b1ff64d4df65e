// C++ error types. bindings/module.cpp translates each into the Python class of the
// same name in pyspec/errors.py, which owns the user-facing hierarchy.
#pragma once

#include <stdexcept>
#include <string>

namespace pyspec {

struct ModelNotFoundError : std::runtime_error { using std::runtime_error::runtime_error; };
struct InvalidModelError : std::runtime_error { using std::runtime_error::runtime_error; };
struct ContextOverflowError : std::runtime_error { using std::runtime_error::runtime_error; };
struct DecodeError : std::runtime_error { using std::runtime_error::runtime_error; };
struct IncompatibleModelsError : std::runtime_error { using std::runtime_error::runtime_error; };
// llama_model_quantize failed (its reason in the message).
struct QuantizeError : std::runtime_error { using std::runtime_error::runtime_error; };
// A JSON schema, grammar or regex that does not compile, or a grammar that
// failed during generation (llguidance's reason in the message).
struct ConstraintError : std::runtime_error { using std::runtime_error::runtime_error; };
// An RPC worker that is malformed, unreachable or missing from the build
// (model/devices.h; a worker lost mid-run ends the process instead).
struct RpcError : std::runtime_error { using std::runtime_error::runtime_error; };
// A decode stopped by the caller's cancel flag (Ctrl-C); the cache is left as before the call.
struct Cancelled : std::runtime_error { using std::runtime_error::runtime_error; };

}  // namespace pyspec
