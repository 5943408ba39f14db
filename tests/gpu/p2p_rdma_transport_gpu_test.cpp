// The seed's RdmaTransport ping-pong (support/rdma_ping_pong_seed.inc) with cudaMalloc memory on GPUs 0 and 1, as
// written and checked byte for byte, both transports in this process (the TCP transport stages GPU memory through
// pinned host buffers). Skips without two GPUs. Runs in the test's own process: CUDA does not survive a fork.
#undef NDEBUG  // the seed's test checks with assert(): it must check in every build
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cassert>
#include <memory>
#include <vector>

#include "gdx/p2p/rdma_transport.hpp"
#include "gpu/gpu_test_support.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace gpu_memory {

using namespace gdx::p2p::compat;  // the seed's `using namespace torch::comms;`
#include "support/rdma_ping_pong_seed.inc"

}  // namespace gpu_memory
namespace {

#define GDX_SKIP_WITHOUT_TWO_GPUS()                                                                      \
  do {                                                                                                   \
    GDX_SKIP_WITHOUT_GPU();                                                                              \
    int gdx_gpus_ = 0;                                                                                   \
    cudaGetDeviceCount(&gdx_gpus_);                                                                      \
    if (gdx_gpus_ < 2) GTEST_SKIP() << "the seed's test uses GPUs 0 and 1; " << gdx_gpus_ << " visible"; \
  } while (0)

TEST(P2pRdmaTransportGpu, SeedPingPongAsWrittenOnGpus0And1) {
  GDX_SKIP_WITHOUT_TWO_GPUS();
  gpu_memory::rdmaPingPong();  // an assert that fails ends the test binary
}

TEST(P2pRdmaTransportGpu, SeedPingPongRandomBytesBothWaysEveryByteChecked) {
  GDX_SKIP_WITHOUT_TWO_GPUS();
  for (size_t bytes : {size_t{8192}, size_t{2}, size_t{(64 << 20) + 7}})
    EXPECT_EQ(gpu_memory::rdmaPingPongChecked(bytes, 700 + bytes), 0) << bytes << " bytes";
}

}  // namespace
}  // namespace gdx::test
