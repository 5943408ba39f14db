// gdx::ep::Buffer and LowLatencyBuffer follow the lifetime rule of Window and Channel: used after its Context is
// gone, each throws kShutdown naming the buffer and saying the Context is gone (before any kernel could touch the
// Context's freed rings and signals), and destroying it afterwards neither crashes nor waits for a barrier nobody
// will join.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "gdx/context.hpp"
#include "gdx/ep/buffer.hpp"
#include "gdx/ep/low_latency.hpp"
#include "gpu_test_support.hpp"

namespace gdx {
namespace {

TEST(EpLifetime, ABufferUsedAfterItsContextThrowsAndIsDestroyedQuietly) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  std::optional<Context> ctx;
  ctx.emplace();
  std::optional<ep::Buffer> buf;
  buf.emplace(*ctx, size_t{64} << 20);
  buf->checkErrors();  // alive: nothing to report
  void* scratch = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&scratch, 4096));
  auto* perRank = static_cast<int32_t*>(scratch);
  auto* perExpert = perRank + 8;
  auto* inRank = reinterpret_cast<bool*>(perRank + 64);
  ctx.reset();
  for (int call = 0; call < 2; ++call) {
    try {
      if (call == 0)
        buf->checkErrors();
      else
        buf->getDispatchLayout(nullptr, 0, 1, 8, perRank, perExpert, inRank, nullptr);
      ADD_FAILURE() << "call " << call << " after ~Context did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kShutdown) << e.what();
      EXPECT_NE(std::string(e.what()).find("gdx::ep::Buffer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Context is gone"), std::string::npos) << e.what();
    }
  }
  buf.reset();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(scratch);
}

TEST(EpLifetime, ALowLatencyBufferUsedAfterItsContextThrowsAndIsDestroyedQuietly) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  std::optional<Context> ctx;
  ctx.emplace();
  constexpr int kTokens = 8, kHidden = 2048, kExperts = 8, kTopk = 2;
  std::optional<ep::LowLatencyBuffer> buf;
  buf.emplace(*ctx, ep::LowLatencyConfig{kTokens, kHidden, kExperts, kTopk});
  ep::LowLatencyHandle h = buf->newHandle();
  void* x = nullptr;
  void* idx = nullptr;
  void* recv = nullptr;
  void* counts = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&x, size_t{kTokens} * kHidden * 2));
  GDX_TEST_CUDA(cudaMalloc(&idx, size_t{kTokens} * kTopk * 8));
  GDX_TEST_CUDA(cudaMemset(idx, 0xFF, size_t{kTokens} * kTopk * 8));  // -1: no expert
  GDX_TEST_CUDA(cudaMalloc(&recv, size_t{kExperts} * kTokens * kHidden * 2));
  GDX_TEST_CUDA(cudaMalloc(&counts, kExperts * 4));
  ctx.reset();
  try {
    ep::LowLatencyDispatchOutputs out{};
    out.recvX = recv;
    out.recvCount = static_cast<int32_t*>(counts);
    buf->lowLatencyDispatch({x, static_cast<const int64_t*>(idx), kTokens, kTopk, false}, out, h, nullptr);
    ADD_FAILURE() << "a dispatch after ~Context did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShutdown) << e.what();
    EXPECT_NE(std::string(e.what()).find("gdx::ep::LowLatencyBuffer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Context is gone"), std::string::npos) << e.what();
  }
  buf.reset();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (void* p : {x, idx, recv, counts}) cudaFree(p);
}

}  // namespace
}  // namespace gdx
