// The GPU a Context drives (Context::gpu()): chosen by GDX_CUDA_DEVICE, else the current CUDA device (torch and most
// launchers set it from LOCAL_RANK). A build without CUDA, or a machine without a GPU, has none.
#pragma once

#include <string>

namespace gdx {

struct GpuInfo {
  int device = -1;       ///< CUDA device ordinal; -1: no GPU
  std::string pciBusId;  ///< "0000:17:00.0", for hwloc placement
  std::string name;
  bool present() const { return device >= 0; }
};

}  // namespace gdx
