// DirectPeer: how a kernel reaches a peer GPU of the same host without the proxy (the direct path). The
// Context fills one table per such peer in device memory at setup and on every window registration: the
// peer's GPU windows mapped here through CUDA IPC, this rank's windows as the GPU addresses them (sources),
// and the peer's device signal array, also IPC-mapped. A put on the direct path is SM loads from the local
// window and stores into the mapped peer window (copy.hpp); a signal is one system-scope release
// atomic on the peer's device signal array, so it is seen after the data of every put this thread (or, after
// a warp/block barrier, its warp/block) made before it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device/impl/command.hpp"

namespace gdx {

struct DirectPeer {
  char* peerBase[kMaxWindows];  ///< peer window w mapped into this process; null: not a GPU window there
  uint64_t peerBytes[kMaxWindows];
  char* localBase[kMaxWindows];  ///< this rank's window w as kernels address it; null: not GPU-addressable
  uint64_t localBytes[kMaxWindows];
  uint64_t* peerSignals;  ///< the peer's device signal array, mapped here
  uint32_t peerNumSignals;
};

static_assert(std::is_trivially_copyable<DirectPeer>::value, "copied to the device as bytes");

}  // namespace gdx
