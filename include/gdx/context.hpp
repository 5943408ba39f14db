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

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdx/channel.hpp"
#include "gdx/channel_device.hpp"
#include "gdx/detail/bootstrap.hpp"
#include "gdx/detail/context_link.hpp"
#include "gdx/detail/gpu.hpp"
#include "gdx/detail/host_buffer.hpp"
#include "gdx/detail/proxy.hpp"
#include "gdx/detail/transport.hpp"
#include "gdx/detail/window_registry.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "gdx/window.hpp"

namespace gdx {

class DirectPaths;
class Relay;

struct ContextOptions {
  Proxy::Options proxy;                    ///< threads, rings, ring size, in-flight cap, placement
  uint32_t numSignals = 1024;              ///< GDX_NUM_SIGNALS (at most kMaxSignals)
  std::string transport = "tcp";           ///< GDX_TRANSPORT: tcp, verbs (built with rdma-core), loopback (one rank)
  int tcpSockets = 4;                      ///< GDX_TCP_SOCKETS
  uint64_t timeoutNs = kDefaultTimeoutNs;  ///< every wait's bound (GDX_TIMEOUT_MS), passed to all the context builds
  /// Reads the variables above; placement from GDX_NUMA_NODE or the calling thread's node.
  static ContextOptions fromEnv();
};

/// Whether a window registered without a name may have another size on other ranks (Context::registerWindow).
enum class WindowSizes : uint8_t { kEqual, kMayDiffer };

class Context {
 public:
  /// Joins the job described by the environment (BootstrapConfig::fromEnv()).
  explicit Context(const ContextOptions& options = ContextOptions::fromEnv());
  Context(const BootstrapConfig& bootstrap, const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return bootstrap_->rank(); }
  int worldSize() const { return bootstrap_->worldSize(); }
  Bootstrap& bootstrap() { return *bootstrap_; }
  Proxy& proxy() { return *proxy_; }
  Transport& transport() { return *transport_; }
  const ContextOptions& options() const { return options_; }
  /// What objects that may outlive this Context keep of it (detail/context_link.hpp), as Window and Channel do:
  /// through it a later use finds the Context gone and throws kShutdown instead of touching freed memory.
  const std::shared_ptr<detail::ContextLink>& link() const { return link_; }

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
  /// over the rings (channel_device.hpp).
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
  const GpuInfo& gpu() const { return gpu_; }

  uint32_t numSignals() const { return options_.numSignals; }
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
  /// Collective; checked against the other ranks' calls like registerWindow.
  void barrier() { bootstrap_->barrier(); }

 private:
  friend class Window;
  friend class Channel;
  void init();
  void shutdownThreads() noexcept;
  /// Waits (bounded) until the commands already in the rings (host threads' and kernels') completed; logs at ERROR
  /// what was lost, per ring, peer and kind, naming `occasion`. `closing` (~Context): also reports rings that had
  /// failed, for callers that never flushed.
  void drainRings(const std::string& occasion, bool closing) noexcept;
  /// Logs at ERROR the peers whose commands on `ring` (called `ringName`) failed (for ~Context).
  void reportFaults(const std::string& ringName, const CommandRing& ring) const;
  void deregister(uint32_t id) noexcept;
  /// The collective half of deregister for windows peers may have mapped: returns once every rank forgot window `id`.
  void fenceDeregistration(uint32_t id) noexcept;
  /// Window::peerData for another rank: the direct path's mapping of `peer`'s window `id`, null when none.
  void* directWindowBase(int peer, uint32_t id) const;
  void onImm(const RemoteWrite& w);
  void onMessage(const RemoteMessage& m);
  /// A channel (device handle) to `peer`; forwardTo >= 0: a relayed one, `peer` being the relay.
  Channel makeChannel(int peer, int ringIndex, int forwardTo);
  ChannelDeviceHandle makeDeviceChannel(int peer, int ringIndex, int forwardTo);
  void onPeerFailure(int peer, const std::string& why);
  /// The loop of waitStatus() and waitFromStatus(): `ended()` is checked with every poll of the signal.
  template <typename Ended>
  Status waitLoop(uint32_t id, uint64_t value, uint64_t timeoutNs, Ended&& ended) const;
  /// The message of a wait that returned `s` (names the peers that failed).
  std::string waitError(const char* what, uint32_t id, uint64_t value, Status s, uint64_t startNs) const;

  ContextOptions options_;
  // Shared with every Window and Channel handed out; cleared by ~Context (detail/context_link.hpp).
  std::shared_ptr<detail::ContextLink> link_ = std::make_shared<detail::ContextLink>();
  std::unique_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<WindowRegistry> registry_;
  std::unique_ptr<HostBuffer> signals_;
  std::unique_ptr<Proxy> proxy_;
  std::unique_ptr<DirectPaths> direct_;  // same-host GPU peers reached without the proxy (runtime/direct_path.hpp)
  // Relayed channels (runtime/relay.hpp); after direct_, so its forwarding queue is destroyed (drained) before the
  // IPC mappings it writes through are released.
  std::unique_ptr<Relay> relay_;
  // What the transport's failure handler may touch, published by init() under failureMutex_.
  uint32_t* failureWord_ = nullptr;
  uint32_t* peerWords_ = nullptr;
  std::mutex windowMutex_;
  std::vector<bool> windowInUse_;
  std::vector<bool> fenceOnDeregister_;  // per window id: some rank's record carried a direct-path mapping
  GpuInfo gpu_;
  // Host-mapped Status words (kernels read them): failed_ is set once any peer failed, peerStatus_[p] once peer p did.
  uint32_t* failed_ = nullptr;
  uint32_t* peerStatus_ = nullptr;
  std::atomic<int> failedPeers_{0};  // other ranks that failed: when all did, nobody is left to raise a signal
  mutable std::mutex failureMutex_;
  std::string failure_;                   // the first peer failure
  std::vector<std::string> peerFailure_;  // by peer: its first failure, empty while healthy
};

}  // namespace gdx
