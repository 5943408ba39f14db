// What the MoE bindings (ep_api.cpp, ep_low_latency_api.cpp) share: streams and pointer fields as Python ints.
// Builds with CUDA only.
#pragma once

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "python/src/bindings.hpp"

namespace gdx::python {

inline cudaStream_t streamFrom(uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

/// A typed pointer from the Python int the package passes (0: null), for the argument structs' constructors.
template <typename T>
T* typedPointer(uintptr_t address) {
  return static_cast<T*>(pointerFrom(address));
}

/// A pointer member of an argument struct as a Python int property.
template <typename C, typename T>
void pointerField(py::class_<C>& cls, const char* name, T* C::*member) {
  cls.def_property(
      name, [member](const C& c) { return addressOf(c.*member); },
      [member](C& c, uintptr_t v) { c.*member = static_cast<T*>(pointerFrom(v)); });
}

}  // namespace gdx::python
