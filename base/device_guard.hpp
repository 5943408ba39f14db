// DeviceGuard: makes `device` current for the lifetime of the guard and restores the caller's device after, so
// library calls made from any thread (proxy threads, transport threads) never change the user's current device.
#pragma once

#include <cuda_runtime_api.h>

namespace gdx {

struct DeviceGuard {
  int previous = -1;
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous) cudaSetDevice(previous);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace gdx
