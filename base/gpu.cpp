#include "gdx/detail/gpu.hpp"

#include <cctype>

#include "gdx/config.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include "gdx/detail/cuda_check.hpp"
#endif

namespace gdx {

GpuInfo selectGpu() {
  GpuInfo info;
#if defined(GDX_HAVE_CUDA)
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
  info.device = device;
  info.pciBusId = bus;
  for (char& c : info.pciBusId) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  info.name = prop.name;
#endif
  return info;
}

}  // namespace gdx
