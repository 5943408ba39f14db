// Latency kernels of benchmark_nvlink: the put-with-signal ping-pong between the two ranks in each form of the
// device API (thread, warp, block, and a signal alone), the same 8-byte ping-pong with the signal's release written
// in other PTX encodings (to compare them on the GPUs), and the acknowledging kernel that times PeerCopyQueue's
// forward latency from the host.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cuda/atomic>
#include <string>
#include <vector>

#include "base/cuda_check.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/ptx.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy_queue.hpp"

namespace gdx::bench {

/// How a ping-pong case sends: a signal alone, or putWithSignal in its thread, warp or block form, with window ids
/// (the DirectPeer table read on every put) or with the windows bound once before the loop (BoundWindows).
enum class Form : int { kSignal = 0, kThread, kWarp, kBlock, kThreadBound, kWarpBound, kBlockBound };
inline const char* formName(Form f) {
  switch (f) {
    case Form::kSignal: return "signal";
    case Form::kThread: return "thread";
    case Form::kWarp: return "warp";
    case Form::kBlock: return "block";
    case Form::kThreadBound: return "thread-bound";
    case Form::kWarpBound: return "warp-bound";
    default: return "block-bound";
  }
}
__host__ __device__ constexpr bool isWarpForm(Form f) {
  return f == Form::kWarp || f == Form::kWarpBound;
}
__host__ __device__ constexpr bool isBlockForm(Form f) {
  return f == Form::kBlock || f == Form::kBlockBound;
}
inline unsigned formThreads(Form f) {
  return isWarpForm(f) ? 32 : isBlockForm(f) ? 512 : 1;
}

// Ping-pong: rank 0 sends `bytes` with signal `ping` = i and waits for `pong` >= i; rank 1 the mirror image. One
// thread (signal, thread form), one warp or one block of 512 threads (block form: thread 0 waits, the block follows).
// One instantiation per form, so that each kernel holds only the code (and the registers) of its own form.
// Launched with two blocks, block 0 is the initiator and block 1 the other side, on one GPU (direct_api_latency.cuh).
// The initiator writes the elapsed time.
// Launch bounds: the block form takes 124-128 registers a thread when free to choose, all that 512 threads may have.
template <Form kForm>
__global__ void __launch_bounds__(512, 1)
    pingPong(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint64_t bytes, int iters, int warmup,
             bool initiator, uint32_t ping, uint32_t pong, uint64_t* elapsedNs, uint32_t* status) {
  __shared__ uint32_t waited;
  if (gridDim.x == 2) initiator = blockIdx.x == 0;
  const BoundWindows w = ch.bind(dstWin, srcWin);  // used by the bound forms only
  auto send = [&](uint32_t id, uint64_t i) {
    if constexpr (kForm == Form::kSignal) return ch.signal(id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kThread) return ch.putWithSignal(dstWin, 0, srcWin, 0, bytes, id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kWarp) return ch.putWithSignalWarp(dstWin, 0, srcWin, 0, bytes, id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kBlock)
      return ch.putWithSignalBlock(dstWin, 0, srcWin, 0, bytes, id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kThreadBound) return ch.putWithSignal(w, 0, 0, bytes, id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kWarpBound) return ch.putWithSignalWarp(w, 0, 0, bytes, id, i, SignalOp::kSet);
    if constexpr (kForm == Form::kBlockBound) return ch.putWithSignalBlock(w, 0, 0, bytes, id, i, SignalOp::kSet);
  };
  auto recv = [&](uint32_t id, uint64_t i) {
    if constexpr (isWarpForm(kForm)) return ch.waitWarp(id, i);
    if constexpr (!isBlockForm(kForm)) return ch.wait(id, i);
    if (threadIdx.x == 0) waited = static_cast<uint32_t>(ch.wait(id, i));
    __syncthreads();  // the block sees what the signal announced, and every thread the same status
    const Status s = static_cast<Status>(waited);
    __syncthreads();
    return s;
  };
  Status s = Status::kOk;
  uint64_t t0 = 0;
  for (int i = 1; i <= iters + warmup && s == Status::kOk; ++i) {
    if (i == warmup + 1) t0 = ptx::globalTimerNs();
    if (initiator) {
      s = send(ping, i);
      if (s == Status::kOk) s = recv(pong, i);
    } else {
      s = recv(ping, i);
      if (s == Status::kOk) s = send(pong, i);
    }
  }
  if (threadIdx.x == 0 && initiator) *elapsedNs = ptx::globalTimerNs() - t0;
  if (s != Status::kOk) *status = static_cast<uint32_t>(s);
}

/// `blocks`: 1 (one side of a two-process ping-pong) or 2 (both sides in one kernel).
inline void launchPingPong(Form form, ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint64_t bytes,
                           int iters, int warmup, bool initiator, uint32_t ping, uint32_t pong, uint64_t* elapsedNs,
                           uint32_t* status, int blocks = 1) {
  const unsigned threads = formThreads(form);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, threads>>>(ch, dstWin, srcWin, bytes, iters, warmup, initiator, ping, pong, elapsedNs, status);
  };
  switch (form) {
    case Form::kSignal: launch(pingPong<Form::kSignal>); break;
    case Form::kThread: launch(pingPong<Form::kThread>); break;
    case Form::kWarp: launch(pingPong<Form::kWarp>); break;
    case Form::kBlock: launch(pingPong<Form::kBlock>); break;
    case Form::kThreadBound: launch(pingPong<Form::kThreadBound>); break;
    case Form::kWarpBound: launch(pingPong<Form::kWarpBound>); break;
    default: launch(pingPong<Form::kBlockBound>); break;
  }
  GDX_CUDA_CHECK(cudaGetLastError());
}

/// The signal's release after an 8-byte put, written four ways (the library uses kReleaseStore).
enum class Encoding : int { kReleaseStore = 0, kAcqRelFence = 1, kReleaseFence = 2, kScFence = 3 };
inline const char* encodingName(Encoding e) {
  return e == Encoding::kReleaseStore   ? "st.release.sys (the library's)"
         : e == Encoding::kAcqRelFence  ? "fence.acq_rel.sys + st.relaxed.sys"
         : e == Encoding::kReleaseFence ? "fence.release.sys + st.relaxed.sys"
                                        : "fence.sc.sys + st.relaxed.sys";
}

// The 8-byte thread-form ping-pong with the put written out on the direct path (the handle's DirectPeer table) and
// the signal released as `enc` says. Every encoding keeps the guarantee (the data is visible before the signal);
// which one the hardware makes cheapest is what this measures.
__global__ void pingPongEncoding(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, int iters, int warmup,
                                 bool initiator, uint32_t ping, uint32_t pong, Encoding enc, uint64_t* elapsedNs,
                                 uint32_t* status) {
  if (gridDim.x == 2) initiator = blockIdx.x == 0;
  const DirectPeer* dp = ch.direct;
  if (!dp || !dp->peerBase[dstWin] || !dp->localBase[srcWin] || !dp->peerSignals) {
    *status = static_cast<uint32_t>(Status::kInvalidArgument);
    return;
  }
  uint64_t* dst = reinterpret_cast<uint64_t*>(dp->peerBase[dstWin]);
  const uint64_t* src = reinterpret_cast<const uint64_t*>(dp->localBase[srcWin]);
  auto send = [&](uint32_t id, uint64_t i) {
    *dst = *src;
    uint64_t* w = dp->peerSignals + id;
    switch (enc) {
      case Encoding::kReleaseStore: atomicStore(w, i, kRelease); break;
      case Encoding::kAcqRelFence:
        cuda::atomic_thread_fence(cuda::std::memory_order_acq_rel, cuda::thread_scope_system);
        atomicStore(w, i, kRelaxed);
        break;
      case Encoding::kReleaseFence:
        ptx::fenceReleaseSys();
        atomicStore(w, i, kRelaxed);
        break;
      default:
        cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
        atomicStore(w, i, kRelaxed);
    }
  };
  Status s = Status::kOk;
  uint64_t t0 = 0;
  for (int i = 1; i <= iters + warmup && s == Status::kOk; ++i) {
    if (i == warmup + 1) t0 = ptx::globalTimerNs();
    if (initiator) {
      send(ping, i);
      s = ch.wait(pong, i);
    } else {
      s = ch.wait(ping, i);
      if (s == Status::kOk) send(pong, i);
    }
  }
  if (initiator) *elapsedNs = ptx::globalTimerNs() - t0;
  if (s != Status::kOk) *status = static_cast<uint32_t>(s);
}

// PeerCopyQueue's forward latency: for i = 1..n, waits until `word` >= i (GPU 1 memory raised by the queue, or host
// memory set by the host for the raw round trip) and then writes i into the host-mapped `ack`. Bounded: gives up
// after 10 s without progress and leaves the count it reached in *status.
__global__ void ackKernel(const uint64_t* word, uint64_t* ack, int n, uint64_t* status) {
  for (int i = 1; i <= n; ++i) {
    const uint64_t start = ptx::globalTimerNs();
    while (atomicLoad(const_cast<uint64_t*>(word), kAcquire) < uint64_t(i)) {
      if (ptx::globalTimerNs() - start > 10000000000ull) {
        *status = uint64_t(i);
        return;
      }
    }
    atomicStore(ack, uint64_t(i), kRelease);
  }
}

inline double medianOf(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Medians in microseconds, host clock.
struct ForwardLatency {
  double rawRoundTripUs;  ///< host writes a host-mapped word, a kernel on the destination GPU sees it and acks
  double signalAckUs;     ///< host submits a transfer with a signal, the kernel on the destination GPU sees it and acks
  double completionUs;    ///< host submits a transfer and sees the queue's completion count reach it
};

/// PeerCopyQueue's forward latency of `bytes` (4 KiB by default; a queue of default options on `srcDevice`, copying
/// `src` into `dst` on `dstDevice`), and the raw host -> destination GPU -> host round trip through host-mapped memory
/// in the same run. One transfer at a time: the next is submitted once the previous one was acknowledged.
inline ForwardLatency queueForwardLatency(int srcDevice, int dstDevice, const void* src, void* dst,
                                          uint64_t bytes = 4096, int n = 2000, int warmup = 200) {
  uint64_t* host = nullptr;  // [0]: the raw round trip's word, [16]: the ack, [32]: the ack kernel's status
  GDX_CUDA_CHECK(cudaHostAlloc(&host, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(host, 0, 4096);
  uint64_t *word = host, *ack = host + 16, *status = host + 32, *signal = nullptr;
  GDX_CUDA_CHECK(cudaSetDevice(dstDevice));
  GDX_CUDA_CHECK(cudaMalloc(&signal, 8));
  cudaStream_t stream = nullptr;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto rounds = [&](const uint64_t* polled, auto&& step) {
    GDX_CUDA_CHECK(cudaSetDevice(dstDevice));
    GDX_CUDA_CHECK(cudaMemset(signal, 0, 8));
    GDX_CUDA_CHECK(cudaDeviceSynchronize());
    atomicStore(word, uint64_t{0}, kRelaxed);
    atomicStore(ack, uint64_t{0}, kRelaxed);
    atomicStore(status, uint64_t{0}, kRelaxed);
    ackKernel<<<1, 1, 0, stream>>>(polled, ack, n + warmup, status);
    GDX_CUDA_CHECK(cudaGetLastError());
    std::vector<double> us;
    for (int i = 1; i <= n + warmup; ++i) {
      const uint64_t t0 = nowNs();
      step(uint64_t(i));
      while (atomicLoad(ack, kAcquire) < uint64_t(i)) {
        if (nowNs() - t0 > 5000000000ull)
          throw Error(ErrorCode::kTimeout, "forward latency: GPU " + std::to_string(dstDevice) +
                                               " did not acknowledge round " + std::to_string(i) + " within 5 s (ack " +
                                               std::to_string(atomicLoad(ack, kRelaxed)) + ")");
      }
      if (i > warmup) us.push_back(double(nowNs() - t0) / 1000.0);
    }
    GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
    return medianOf(us);
  };
  ForwardLatency r{};
  r.rawRoundTripUs = rounds(word, [&](uint64_t i) { atomicStore(word, i, kRelease); });
  {
    GDX_CUDA_CHECK(cudaSetDevice(srcDevice));
    PeerCopyQueue q(srcDevice);
    r.signalAckUs = rounds(signal, [&](uint64_t i) { q.submit(src, dst, bytes, signal, i, SignalOp::kSet); });
    std::vector<double> us;
    for (int i = 0; i < n + warmup; ++i) {
      const uint64_t t0 = nowNs();
      q.waitCompleted(q.submit(src, dst, bytes) + 1);
      if (i >= warmup) us.push_back(double(nowNs() - t0) / 1000.0);
    }
    r.completionUs = medianOf(us);
  }
  GDX_CUDA_CHECK(cudaSetDevice(dstDevice));
  cudaStreamDestroy(stream);
  cudaFree(signal);
  cudaFreeHost(host);
  GDX_CUDA_CHECK(cudaSetDevice(srcDevice));
  return r;
}

}  // namespace gdx::bench
