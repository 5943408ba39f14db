// The pieces of the path to ranks on other hosts that both Buffers (normal and low-latency mode) set up alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"

namespace gdx::ep::detail {

/// Pinned host memory that kernels address (host-mapped) and that the proxy sends from and places into without a
/// CUDA copy (so it never waits behind the application's queued kernels), registered as a host window (collective).
/// The first `zeroBytes` are zeroed. The caller frees `host` (cudaFreeHost) after dropping `window`.
struct HostWindowMemory {
  char* host = nullptr;
  char* device = nullptr;  ///< the same memory as kernels address it
  Window window;
};
void mapHostWindow(Context& context, size_t bytes, size_t zeroBytes, const std::string& name, HostWindowMemory* out);

/// The proxied channel to every rank in `remoteMask`, each on device ring r % numDeviceRings() (so that what is
/// signalled after a rank's data stays on that data's ring), copied into device memory [kMaxRanks] (the caller
/// cudaFrees it). `*signals`: this rank's signal array as those handles see it.
ChannelDeviceHandle* uploadNetChannels(Context& context, uint32_t remoteMask, int numRanks, const uint64_t** signals);

}  // namespace gdx::ep::detail
