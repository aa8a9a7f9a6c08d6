// The _C Python module. Importing it loads this library, whose static
// initializers (in the dirmult_cpu objects linked in) register the dirmult
// op schemas and CPU kernels; the module itself only reports how the package
// was built and which CPU path it runs. It includes no torch header (see
// CMakeLists.txt).
#include <pybind11/pybind11.h>

#include <string>

#include "cpu/per_sample_avx2.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "dirmult_ext native library (op registration and build info)";
  m.def("build_info", [] {
    py::dict info;
    info["version"] = DIRMULT_VERSION;
    info["torch_target_version"] = static_cast<unsigned long long>(DIRMULT_TORCH_TARGET);
    info["cuda_version"] = std::string(DIRMULT_CUDA_VERSION);
    info["cuda_architectures"] = std::string(DIRMULT_CUDA_ARCHS);
    // Chosen at run time on this CPU: the per-sample float32 CPU kernels'
    // eight-lane path, or the scalar one.
    info["cpu_simd"] = std::string(dirmult::cpu::per_sample_avx2_available() ? "avx2" : "none");
    return info;
  }, "How this build of dirmult_ext was compiled.");
}
