// PeerCopyQueue: the batched peer-copy kernel as a service. Host threads submit (src, dst, bytes, signal)
// transfers into a host->device descriptor ring; a persistent kernel on the queue's GPU drains it, copies with
// SM loads and 16-byte stores (typically into another GPU of the host over NVLink) spread over its blocks, and
// raises each transfer's signal (a 64-bit word anywhere the GPU can address: a peer's device signal array, host
// mapped memory) with a system-scope release once the transfer's data, and the data of every transfer submitted
// before it, is in place. The relay path uses it to forward what arrived from the network to the other GPUs of
// the host; host code can use it directly (quoted from examples/peer_copy_queue.cu, built and run by the tests):
//
// ```cpp
// gdx::PeerCopyQueue q(/*device=*/srcGpu);  // its kernel runs on srcGpu and must reach src, dst and signal
// // Each submit returns at once; the kernel adds 1 to *signal once that piece (and every earlier one) is in dst.
// for (uint64_t off = 0; off < bytes; off += piece)
//   q.submit(srcBuf.get() + off, dstBuf.get() + off, std::min<uint64_t>(piece, bytes - off), signal, /*value=*/1);
// q.waitCompleted(q.submitted());  // bounded: throws gdx::Error(kTimeout) naming the device and the counts
// ```
//
// The kernel runs only while there is work: after GDX_COPY_QUEUE_IDLE_US (default 1000) without any, it leaves,
// so a cudaDeviceSynchronize() (or a cudaFree/cudaFreeHost, which synchronize too) elsewhere in the process is
// delayed by at most about twice that, never blocked. Its blocks spin while they wait for work: leave that many SMs
// to it when kernels of the process wait for what it delivers. Thread-safe.
//
// Inside (device/copy_queue_layout.hpp): one warp reads the ring in host memory and mirrors published transfers into
// device memory, so the copy blocks never poll PCIe; a transfer is cut into at most `blocks` pieces of at least
// `chunkBytes`, so more blocks never means more pieces than blocks, and consecutive small transfers share one unit
// of work; the block that completes a transfer raises its signal itself when every earlier transfer was signalled,
// else a signalling warp raises the signals of many completed transfers in ticket order behind one fence. A lone
// transfer of at most 8 KiB on an idle queue is copied by the polling warp itself, which saves the hand-over.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "gdx/config.hpp"
#include "gdx/types.hpp"

namespace gdx {

class HostBuffer;

class PeerCopyQueue {
 public:
  struct Options {
    unsigned blocks = 32;      ///< copy blocks of 512 threads (GDX_COPY_QUEUE_BLOCKS); one more polls and signals
    uint32_t capacity = 1024;  ///< transfers in flight (GDX_COPY_QUEUE_DEPTH), rounded up to a power of two
    uint64_t chunkBytes = 64 * 1024;  ///< smallest piece a block copies (GDX_COPY_QUEUE_CHUNK), a multiple of 16: a
                                      ///< transfer is cut into at most `blocks` pieces of at least this
    uint64_t idleNs = 1000 * 1000;    ///< how long the kernel waits for work before leaving
    uint64_t timeoutNs = kDefaultTimeoutNs;  ///< bound of every wait (GDX_TIMEOUT_MS)
    static Options fromEnv();
  };

  /// The kernel runs on CUDA device `device`; src and dst of every transfer must be addressable from it.
  explicit PeerCopyQueue(int device, const Options& options = Options::fromEnv());
  ~PeerCopyQueue();  // waits (bounded) for submitted transfers, then stops the kernel
  PeerCopyQueue(const PeerCopyQueue&) = delete;
  PeerCopyQueue& operator=(const PeerCopyQueue&) = delete;

  /// Enqueues one transfer; returns its ticket (0, 1, 2, ... in submission order). `signal`: a 64-bit word to
  /// update after the data (8-byte aligned; null: none). Blocks (bounded) while `capacity` transfers are in
  /// flight. Throws gdx::Error(kInvalidArgument) for a null src/dst with bytes > 0 or a misaligned signal,
  /// kTimeout when no slot frees up in time, kCuda when the kernel failed.
  uint64_t submit(const void* src, void* dst, uint64_t bytes, uint64_t* signal = nullptr, uint64_t value = 0,
                  SignalOp op = SignalOp::kAdd);
  /// Transfers submitted so far / completed (copied and signalled) so far, in ticket order.
  uint64_t submitted() const;
  uint64_t completed() const;
  /// Waits until `count` transfers completed (tickets < count). Bounded by timeoutNs (0: the queue's timeout);
  /// throws gdx::Error(kTimeout) naming the device, the count and the completed count it saw.
  void waitCompleted(uint64_t count, uint64_t timeoutNs = 0) const;
  /// True while the persistent kernel is launched.
  bool running() const;
  int device() const { return device_; }
  const Options& options() const { return options_; }

 private:
  void launchLocked();
  void stopLocked();
  void idleLoop();
  /// True once the kernel of the last launch has left, false while it runs; throws gdx::CudaError naming `what`
  /// when it failed.
  bool kernelFinished(const char* what) const;

  int device_;
  Options options_;
  std::unique_ptr<HostBuffer> slots_;
  std::unique_ptr<HostBuffer> shared_;
  void* state_ = nullptr;     // device memory: counters, work ring, transfer mirror (copy_queue_layout.hpp)
  unsigned workShift_ = 0;    // the work ring has 2^workShift_ entries
  void* stream_ = nullptr;    // cudaStream_t
  void* finished_ = nullptr;  // cudaEvent_t recorded after each launch
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  uint64_t submitted_ = 0;
  uint64_t lastSubmitNs_ = 0;
  bool running_ = false;
  bool closing_ = false;
  std::thread idle_;
};

}  // namespace gdx
