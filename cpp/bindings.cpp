// pybind11 module pyspec._core (placeholder; the real one is being written on main).
#include <pybind11/pybind11.h>

namespace py = pybind11;
void bind_sampling(py::module_& m);

PYBIND11_MODULE(_core, m) {
    bind_sampling(m);
}
