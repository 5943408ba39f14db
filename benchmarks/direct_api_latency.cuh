// The direct path's device API on one GPU: the put-with-signal ping-pong of benchmark_nvlink (each form, and the
// 8-byte put written out by hand) between two blocks of one kernel, through a ChannelDeviceHandle whose DirectPeer
// table names this GPU's own buffers. No interconnect and no second process (two processes on one GPU would
// time-slice, not run side by side): what it shows is what the device API adds to the loads and stores it makes,
// so a change to gdx/device/channel.hpp can be measured on a one-GPU machine. benchmark_nvlink measures the same
// kernels between two GPUs over NVLink.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/cuda_check.hpp"
#include "benchmarks/nvlink_latency.cuh"
#include "gdx/device/channel.hpp"
#include "gdx/error.hpp"

namespace gdx::bench {

struct DirectApiLatency {
  std::string what;
  double oneWayUs;
};

/// One way (half a round trip) per case, microseconds.
inline std::vector<DirectApiLatency> directApiLatencyOneGpu() {
  constexpr uint32_t kSrcWindow = 3, kDstWindow = 5, kSignals = 64;
  constexpr size_t kBytes = size_t{1} << 20;
  void *src = nullptr, *dst = nullptr;
  uint64_t* deviceSignals = nullptr;
  DirectPeer* table = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&src, kBytes));
  GDX_CUDA_CHECK(cudaMalloc(&dst, kBytes));
  GDX_CUDA_CHECK(cudaMalloc(&deviceSignals, kSignals * sizeof(uint64_t)));
  GDX_CUDA_CHECK(cudaMalloc(&table, sizeof(DirectPeer)));
  GDX_CUDA_CHECK(cudaMemset(src, 7, kBytes));
  GDX_CUDA_CHECK(cudaMemset(deviceSignals, 0, kSignals * sizeof(uint64_t)));
  DirectPeer t;
  std::memset(&t, 0, sizeof t);
  t.peerBase[kDstWindow] = static_cast<char*>(dst);
  t.peerBytes[kDstWindow] = kBytes;
  t.localBase[kSrcWindow] = static_cast<char*>(src);
  t.localBytes[kSrcWindow] = kBytes;
  t.peerSignals = deviceSignals;
  t.peerNumSignals = kSignals;
  GDX_CUDA_CHECK(cudaMemcpy(table, &t, sizeof t, cudaMemcpyHostToDevice));
  // Host-mapped words the handle's waits also read (proxied signals, the peer's failure word, the ring's error word):
  // zero throughout, as on a healthy channel.
  uint64_t* host = nullptr;
  GDX_CUDA_CHECK(cudaHostAlloc(&host, 4096, cudaHostAllocMapped));
  std::memset(host, 0, 4096);
  uint64_t* elapsed = host + 256;
  uint32_t* status = reinterpret_cast<uint32_t*>(host + 257);
  uint32_t* failure = reinterpret_cast<uint32_t*>(host + 258);
  uint32_t* error = reinterpret_cast<uint32_t*>(host + 259);
  ChannelDeviceHandle ch{};
  ch.ring.error = error;
  ch.ring.timeoutNs = uint64_t{10} * 1000 * 1000 * 1000;
  ch.signals = host;
  ch.failure = failure;
  ch.numSignals = kSignals;
  ch.peer = 0;
  ch.lastPosition = ~uint64_t{0};
  ch.direct = table;
  ch.deviceSignals = deviceSignals;
  ch.forwardTo = -1;
  ch.directSignals = deviceSignals;
  ch.directNumSignals = kSignals;

  struct Case {
    Form form;
    uint64_t bytes;
    int iters;
  };
  const Case cases[] = {{Form::kSignal, 0, 20000},     {Form::kThread, 8, 20000},       {Form::kWarp, 8, 20000},
                        {Form::kBlock, 8, 20000},      {Form::kThread, 4096, 5000},     {Form::kWarp, 4096, 20000},
                        {Form::kBlock, 4096, 20000},   {Form::kThreadBound, 8, 20000},  {Form::kWarpBound, 8, 20000},
                        {Form::kBlockBound, 8, 20000}, {Form::kThreadBound, 4096, 5000}};
  std::vector<DirectApiLatency> out;
  uint32_t id = 0;
  auto finish = [&](const std::string& what, int iters) {
    GDX_CUDA_CHECK(cudaDeviceSynchronize());
    if (*status != 0)
      throw Error(ErrorCode::kInternal,
                  "direct-path ping-pong on one GPU (" + what + "): " + statusName(static_cast<Status>(*status)));
    out.push_back(DirectApiLatency{what, double(*elapsed) / iters / 2 / 1000});
  };
  for (const Case& c : cases) {
    launchPingPong(c.form, ch, kDstWindow, kSrcWindow, c.bytes, c.iters, 100, true, id, id + 1, elapsed, status, 2);
    id += 2;
    finish(std::string(formName(c.form)) + " form, " + std::to_string(c.bytes) + " B", c.iters);
  }
  // The 8-byte put written out from the table once, before the loop: the floor for the forms above.
  const int iters = 20000;
  pingPongEncoding<<<2, 1>>>(ch, kDstWindow, kSrcWindow, iters, 100, true, id, id + 1, Encoding::kReleaseStore, elapsed,
                             status);
  GDX_CUDA_CHECK(cudaGetLastError());
  finish("8 B put written out by hand", iters);
  cudaFreeHost(host);
  cudaFree(table);
  cudaFree(deviceSignals);
  cudaFree(dst);
  cudaFree(src);
  return out;
}

}  // namespace gdx::bench
