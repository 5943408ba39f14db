// The pieces of the extension module gdx._gdx, each bound in its own file. The module takes raw pointers (as
// Python ints), sizes, dtypes and CUDA stream handles only; the pure-Python package (python/gdx/) turns tensors and
// arrays into them, so the extension never links a framework and one build serves every torch version.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace gdx::python {

namespace py = pybind11;

/// gdx::Error -> the gdx.Error subclass for its code (registered by gdx/errors.py through _set_error_classes).
void bindErrors(py::module_& m);
/// _Context, _Window, _Channel: the host API.
void bindHostApi(py::module_& m);
/// _EpBuffer and its argument structs (the MoE layer); only in builds with CUDA, else ep_available() is False.
void bindEp(py::module_& m);
/// The low-latency mode's LowLatencyBuffer, handle and hook, into the ep submodule (bindEp calls it).
void bindEpLowLatency(py::module_& ep);
/// _Endpoint (gdx::p2p::Endpoint), _UrlTransport, _RegisteredMemory, _Future: the P2P layer.
void bindP2p(py::module_& m);

/// A pointer from the Python int the package passes (0: null).
inline void* pointerFrom(uintptr_t address) {
  return reinterpret_cast<void*>(address);
}
inline uintptr_t addressOf(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

}  // namespace gdx::python
