#include "base/gpu.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <mutex>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda.h>  // types only: the driver is reached through cudaDriverEntry, never linked

#include "base/cuda_check.hpp"
#endif

namespace gdx {

#if defined(GDX_HAVE_CUDA)
namespace {

// Streams share the device's hardware work queues (8 by default): the proxy's staging copies could then wait in a
// queue behind an application kernel that is itself queued behind a kernel waiting for those copies, a deadlock.
// With the most queues (32) the few streams of a process get a queue each. The driver reads the variable when it
// creates a context, so setting it helps only before the process's first use of CUDA; a value set wins.
//
// Once the CUDA driver is loaded (PyTorch, or the application, used CUDA first) the environment is left alone:
// setting the variable can no longer take effect, and setenv() in a process whose other threads (the driver's, the
// framework's) may read the environment is not safe: a variable added reallocates the environ array and frees the
// old one under a concurrent getenv() (glibc), which then reads freed memory.
void defaultMaxConnections() {
  if (const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"); v && *v) return;
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {  // only finds an already loaded driver
    dlclose(driver);
    static std::once_flag once;
    std::call_once(once, [] {
      GDX_WARN(
          "CUDA was used before gdx in this process and CUDA_DEVICE_MAX_CONNECTIONS is unset (CUDA's default of 8 "
          "hardware queues): the proxy's GPU staging copies (TCP, verbs without GPUDirect) may wait behind kernels "
          "queued on the application's streams; export CUDA_DEVICE_MAX_CONNECTIONS=32 in the launcher (README, "
          "Environment)");
    });
    return;
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

}  // namespace
#endif

GpuInfo selectGpu() {
  GpuInfo info;
#if defined(GDX_HAVE_CUDA)
  defaultMaxConnections();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return info;
  }
  int device = static_cast<int>(envInt("GDX_CUDA_DEVICE", -1));
  if (device >= count)
    throw Error(ErrorCode::kInvalidArgument, "GDX_CUDA_DEVICE=" + std::to_string(device) + " but only " +
                                                 std::to_string(count) + " GPUs are visible");
  if (device >= 0)
    GDX_CUDA_CHECK(cudaSetDevice(device));
  else
    GDX_CUDA_CHECK(cudaGetDevice(&device));
  char bus[32] = {0};
  GDX_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  cudaDeviceProp prop{};
  GDX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  (void)cudaThreadDevice();  // resolves its driver entry points once, here, on a thread that has its context
  info.device = device;
  info.pciBusId = bus;
  for (char& c : info.pciBusId) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  info.name = prop.name;
#endif
  return info;
}

void* cudaDriverEntry(const char* name, unsigned version) {
#if defined(GDX_HAVE_CUDA)
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
#else
  (void)name, (void)version;
  return nullptr;
#endif
}

int cudaThreadDevice() {
#if defined(GDX_HAVE_CUDA)
  using GetCurrent = CUresult (*)(CUcontext*);
  using GetDevice = CUresult (*)(CUdevice*);
  static const auto current = reinterpret_cast<GetCurrent>(cudaDriverEntry("cuCtxGetCurrent", 12000));
  static const auto device = reinterpret_cast<GetDevice>(cudaDriverEntry("cuCtxGetDevice", 12000));
  if (!current || !device) {  // no driver entry points (no driver): the runtime's answer, as before
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return d;
  }
  CUcontext ctx = nullptr;
  if (current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return -1;
  CUdevice dev = -1;
  if (device(&dev) != CUDA_SUCCESS) return -1;
  return static_cast<int>(dev);
#else
  return -1;
#endif
}

bool cudaAllocationRange(const void* p, uintptr_t* base, size_t* bytes) {
#if defined(GDX_HAVE_CUDA)
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const auto range = reinterpret_cast<GetAddressRange>(cudaDriverEntry("cuMemGetAddressRange", 12000));
  CUdeviceptr b = 0;
  size_t n = 0;
  if (!range || range(&b, &n, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
  *base = static_cast<uintptr_t>(b);
  *bytes = n;
  return true;
#else
  (void)p, (void)base, (void)bytes;
  return false;
#endif
}

}  // namespace gdx
