// _core._sanitizer_probe(kind): a deliberate bug of each kind the sanitizer build
// must report — the negative control of .ci/sanitize, which runs it first and
// fails unless the report appears. Compiled only into sanitizer builds
// (CMakeLists.txt, PYSPEC_SANITIZE), so a release core has no such function.
#include <pybind11/pybind11.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bindings/bind.h"

namespace py = pybind11;

namespace {

// volatile: the optimiser may not prove the bug away before the sanitizer sees it.
int heap_overflow() {
    std::vector<int> v(4, 1);
    volatile int i = 4;
    return v.data()[i];  // one past the end
}

int signed_overflow() {
    volatile int big = INT_MAX;
    return big + 1;
}

int data_race() {
    int shared = 0;  // written by two threads, no lock
    std::thread a([&] { for (int i = 0; i < 1000; ++i) shared = shared + 1; });
    std::thread b([&] { for (int i = 0; i < 1000; ++i) shared = shared + 1; });
    a.join();
    b.join();
    return shared;
}

}  // namespace

void bind_sanitizer_probe(py::module_& m) {
    m.def("_sanitizer_probe", [](const std::string& kind) {
        if (kind == "heap-buffer-overflow") return heap_overflow();
        if (kind == "signed-integer-overflow") return signed_overflow();
        if (kind == "data-race") return data_race();
        throw std::invalid_argument("unknown probe: " + kind);
    }, py::arg("kind"), "A deliberate bug of this kind (sanitizer builds only: .ci/sanitize's negative control).");
}
