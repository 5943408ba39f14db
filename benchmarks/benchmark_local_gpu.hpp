// benchmark_local's GPU mode (built with CUDA): one GPU, kernel -> ring -> proxy -> loopback transport -> the
// same GPU; plus the raw GPU->CPU->GPU round trip it is compared with and the null-transport command rate.
#pragma once

#include <cstddef>
#include <string>

namespace gdx::bench {

struct GpuModeOptions {
  size_t minBytes = 8;
  size_t maxBytes = size_t{256} << 20;
  std::string json = "benchmark_local.json";
};

/// True when this build has CUDA and a GPU is visible.
bool gpuAvailable();
int runGpuMode(const GpuModeOptions& options);

}  // namespace gdx::bench
