// Context: one process's membership in a gdx job. It joins the bootstrap, connects the transport to every
// rank, owns the signal array, the window registry and the proxy, and hands out Windows and Channels.
//
// A ring exchange between N ranks, quoted from examples/ring_exchange.cpp (built and run by the tests):
//
// ```cpp
// gdx::Context ctx;  // joins the job: GDX_RANK / RANK, GDX_WORLD_SIZE / WORLD_SIZE, GDX_MASTER_ADDR, ...
// const int next = (ctx.rank() + 1) % ctx.worldSize();
// const int prev = (ctx.rank() + ctx.worldSize() - 1) % ctx.worldSize();
// std::vector<unsigned char> sendBuf(bytes), recvBuf(bytes);
// example::fillPattern(sendBuf.data(), bytes, ctx.rank(), seed);  // the data to send
// // Two windows: prev's put lands in recv while our own put may still be reading send. One window as both
// // would let the incoming data overwrite bytes that are still on their way out.
// gdx::Window send = ctx.registerWindow(sendBuf.data(), bytes);  // collective: same order on every rank
// gdx::Window recv = ctx.registerWindow(recvBuf.data(), bytes);
// gdx::Channel ch = ctx.channel(next);
// ch.putWithSignal(recv, 0, send, 0, bytes, /*signalId=*/0, /*value=*/1);  // next's recv <- our send, then +1
// ctx.wait(/*signalId=*/0, 1);  // prev's data is in recvBuf; bounded: throws gdx::Error naming rank and values
// ch.flush();                   // our put completed at the source: sendBuf may be reused
// ctx.barrier();                // nobody closes its connections while a peer still receives
// ```
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "gdx/bootstrap_config.hpp"
#include "gdx/channel.hpp"
#include "gdx/context_options.hpp"
#include "gdx/error.hpp"
#include "gdx/gpu_info.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "gdx/stats.hpp"
#include "gdx/window.hpp"

namespace gdx {

class Context;
class ContextImpl;
struct ChannelDeviceHandle;  // gdx/device/channel.hpp: the device API, which kernels include
namespace detail {
struct ContextLink;
/// The state behind `context`, for the library's own layers (runtime/context_impl.hpp); not part of the API.
ContextImpl& contextImpl(Context& context);
}  // namespace detail

/// Whether a window registered without a name may have another size on other ranks (Context::registerWindow).
enum class WindowSizes : uint8_t { kEqual, kMayDiffer };

/// A reference to a Context that may outlive it, as Windows, Channels and ep buffers keep one: a use through it
/// either completes before ~Context goes on or finds the Context gone, never a destroyed one.
class ContextRef {
 public:
  /// The Context, pinned for as long as the Use lives (~Context waits for it); empty once the Context is gone.
  class Use {
   public:
    explicit operator bool() const { return context_ != nullptr; }
    Context& operator*() const { return *context_; }
    Context* operator->() const { return context_; }

   private:
    friend class ContextRef;
    std::shared_lock<std::shared_mutex> lock_;
    Context* context_ = nullptr;
  };

  ContextRef() = default;
  Use use() const;
  /// The Context's rank, also after it is gone (for messages); -1 for an empty reference.
  int rank() const;
  /// Throws gdx::Error(kShutdown): `what` (an object and its operation) found the Context gone.
  [[noreturn]] void throwGone(const std::string& what) const;

 private:
  friend class ContextImpl;
  explicit ContextRef(std::shared_ptr<detail::ContextLink> link) : link_(std::move(link)) {}
  std::shared_ptr<detail::ContextLink> link_;
};

class Context {
 public:
  /// Joins the job described by the environment (BootstrapConfig::fromEnv()).
  explicit Context(const ContextOptions& options = ContextOptions::fromEnv());
  Context(const BootstrapConfig& bootstrap, const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const;
  int worldSize() const;
  /// This rank's index among the ranks of its host (LOCAL_RANK, or the emulated host's order).
  int localRank() const;
  /// The ranks that share this host, in rank order; this rank included.
  const std::vector<int>& hostRanks() const;
  const ContextOptions& options() const;
  /// The transport that reaches other hosts' ranks: "tcp", "verbs" or "loopback".
  std::string transportName() const;
  /// What the proxy threads did so far, summed over them (commands, bytes, errors; timings with GDX_PROXY_TIMING).
  ProxyCounters stats() const;
  /// The first error a proxy thread recorded (a command it refused, an operation that failed), empty when none.
  std::string proxyError() const;
  /// A reference that may outlive this Context (ContextRef::use() finds it gone instead of touching freed memory).
  ContextRef ref() const;

  /// Collective: every rank registers its windows in the same order. The ranks check the call against each other
  /// (bootstrap.hpp's CollectiveTag): a rank in another collective (a barrier), at another window id, or with another
  /// non-empty `name` makes the call throw kInvalidArgument on every rank, naming both sides. A window without a
  /// name must have the same size on every rank (two ranks registering unnamed windows in opposite order would pair
  /// them silently), unless `sizes` is WindowSizes::kMayDiffer; named windows are paired by name and may differ.
  /// Throws too when the memory range is empty or when all window ids are in use.
  /// Destroying a GPU window of a job with GPUs is collective too (same order on every rank; kernels that use it
  /// finished on every rank): same-host peers map its memory for their kernels' direct stores, and each unmaps it
  /// before any rank's Window destructor returns, so that the memory may then be freed (window.hpp).
  Window registerWindow(void* base, size_t bytes, MemoryKind kind = MemoryKind::kHost, const std::string& name = {},
                        WindowSizes sizes = WindowSizes::kEqual);
  /// A channel to `peer` on ring `ringIndex` (-1: spread channels over the rings by peer).
  Channel channel(int peer, int ringIndex = -1);
  /// The device handle of a channel to `peer` on device ring `ringIndex` (-1: by peer), for kernels. Needs a GPU.
  ChannelDeviceHandle deviceChannel(int peer, int ringIndex = -1);
  /// Device rings (GDX_PROXY_THREADS x GDX_DEVICE_RINGS_PER_THREAD): kernels with many producing warps spread them
  /// over the rings (gdx/device/channel.hpp).
  int numDeviceRings() const;
  /// A channel to `destination` through `relay`, a rank on the destination's host whose GPU reaches the
  /// destination's GPU directly (NVLink): data goes over the network into the relay's copy of the destination
  /// window and the relay's PeerCopyQueue forwards it (channel.hpp). Throws kInvalidArgument when the two ranks are
  /// not on one host, are the same rank, or the relay is this rank.
  Channel relayChannel(int destination, int relay, int ringIndex = -1);
  /// The device handle of such a channel (proxy path through the relay), for kernels. Needs a GPU.
  ChannelDeviceHandle deviceRelayChannel(int destination, int relay, int ringIndex = -1);
  /// This rank's forwarding queue (created by the first forward request it relays); null until then.
  PeerCopyQueue* forwarder();
  /// The GPU this context drives (present() is false without one).
  const GpuInfo& gpu() const;

  uint32_t numSignals() const;
  /// True when kernels reach `peer` on the direct path (a GPU of this host, through CUDA IPC) rather than the proxy.
  bool isDirect(int peer) const;
  /// Current value of local signal `id` (the larger of its proxy-path and direct-path words).
  uint64_t signalValue(uint32_t id) const;
  /// Sets local signal `id` (to re-arm it between rounds; only safe when no peer is updating it).
  void setSignal(uint32_t id, uint64_t value);
  /// Waits until local signal `id` >= `value`. Bounded by `timeoutNs` (0: the context's timeout); throws
  /// gdx::Error(kTimeout) naming rank, signal, expected and last seen value (and the peers that failed, if any).
  /// A signal does not say who raises it, so a failed peer ends this wait early (kPeerFailed) only when no other
  /// rank is left to raise it; waitFrom() names the peer and ends as soon as that one fails.
  void wait(uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  /// Like wait() but returns the status instead of throwing.
  Status waitStatus(uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  /// wait() for a signal that `peer` raises: also throws kPeerFailed, naming the peer and its first failure, as soon
  /// as that peer failed (and only that peer: waits on healthy peers go on).
  void waitFrom(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  /// Like waitFrom() but returns the status instead of throwing (kInvalidArgument for a peer that does not exist).
  Status waitFromStatus(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  /// Why the job is degraded (the first peer that failed and its cause), empty while every peer is healthy.
  std::string failure() const;
  /// Why `peer` failed (its first failure), empty while it is healthy.
  std::string failure(int peer) const;
  /// Whether `peer` is known to have failed (its connection broke or it died).
  bool peerFailed(int peer) const;
  /// The word kernels of collective operations poll (ep::Buffer): kPeerFailed once any peer failed, as a device
  /// address (host-mapped memory). Channels' device handles poll their own peer's word instead.
  const uint32_t* deviceFailureWord() const;
  /// Collective: every rank contributes a blob and gets all blobs, indexed by rank. Bounded by the timeout. The ranks'
  /// tags are checked against each other (CollectiveTag); a mismatch throws kInvalidArgument on every rank, naming
  /// both sides, and the job goes on.
  std::vector<std::string> allGather(const std::string& mine, const CollectiveTag& tag = CollectiveTag{});
  /// Collective; checked against the other ranks' calls like registerWindow.
  void barrier();

 private:
  friend ContextImpl& detail::contextImpl(Context& context);
  std::unique_ptr<ContextImpl> impl_;
};

}  // namespace gdx
