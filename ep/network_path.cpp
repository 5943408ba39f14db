// ep/network_path.hpp.
#include "ep/network_path.hpp"

#include <cstring>
#include <vector>

#include "base/cuda_check.hpp"
#include "gdx/ep/buffer.hpp"

namespace gdx::ep::detail {

void mapHostWindow(Context& context, size_t bytes, size_t zeroBytes, const std::string& name, HostWindowMemory* out) {
  GDX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&out->host), bytes, cudaHostAllocMapped));
  std::memset(out->host, 0, zeroBytes);
  GDX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&out->device), out->host, 0));
  out->window = context.registerWindow(out->host, bytes, MemoryKind::kHost, name);
}

ChannelDeviceHandle* uploadNetChannels(Context& context, uint32_t remoteMask, int numRanks, const uint64_t** signals) {
  std::vector<ChannelDeviceHandle> net(kMaxRanks);
  for (int r = 0; r < numRanks; ++r) {
    if (!((remoteMask >> r) & 1u)) continue;
    net[r] = context.deviceChannel(r, r % context.numDeviceRings());
    *signals = net[r].signals;
  }
  ChannelDeviceHandle* device = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device), kMaxRanks * sizeof(ChannelDeviceHandle)));
  GDX_CUDA_CHECK(cudaMemcpy(device, net.data(), kMaxRanks * sizeof(ChannelDeviceHandle), cudaMemcpyHostToDevice));
  return device;
}

}  // namespace gdx::ep::detail
