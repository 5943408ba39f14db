// DeviceGuard: makes `device` current for the lifetime of the guard and restores the caller's device after, so
// library calls made from any thread (proxy threads, transport threads) never change the user's current device.
// A thread that had no CUDA context before keeps `device` afterwards: "restoring" the runtime's default device 0
// would create a context on GPU 0 (cudaThreadDevice() in base/gpu.hpp says why that matters).
#pragma once

#include <cuda_runtime_api.h>

#include "base/gpu.hpp"

namespace gdx {

struct DeviceGuard {
  int previous = -1;  ///< the device of the thread's context before the guard; -1: it had none
  explicit DeviceGuard(int device) {
    previous = cudaThreadDevice();
    if (previous != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous) cudaSetDevice(previous);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace gdx
