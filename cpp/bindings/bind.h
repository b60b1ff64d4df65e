// The parts of the module pyspec._core, one per room of cpp/; module.cpp calls
// them in this order (later signatures name earlier classes).
#pragma once

#include <pybind11/pybind11.h>

void bind_sampling(pybind11::module_& m);  // core/: the sampling maths (_core.sampling)
void bind_model(pybind11::module_& m);     // model/: ModelParams, Model
void bind_drafters(pybind11::module_& m);  // drafters/
void bind_policies(pybind11::module_& m);  // policies/
void bind_constraint(pybind11::module_& m);  // constraint/: grammars (llguidance)
void bind_engine(pybind11::module_& m);    // engine/: parameters, results, Engine, BatchSession
void bind_embedder(pybind11::module_& m);  // model/embedder.h: EmbedderParams, Embedder (after engine/: its CancelToken)
void bind_info(pybind11::module_& m);      // llama.cpp's build facts
void bind_tools(pybind11::module_& m);     // tools/: agreement, quantize
#ifdef PYSPEC_SANITIZER_PROBE
void bind_sanitizer_probe(pybind11::module_& m);  // deliberate bugs: .ci/sanitize's negative control
#endif
