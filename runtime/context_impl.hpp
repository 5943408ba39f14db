// ContextImpl: the state behind a gdx::Context (a pimpl; gdx/context.hpp is the API). It joins the bootstrap, connects
// the transport to every rank, owns the signal array, the window registry and the proxy, and hands out Windows and
// Channels; Window and Channel reach it through their ContextLink (runtime/context_link.hpp), the library's other
// layers through contextImpl(Context&).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/gpu.hpp"
#include "base/host_buffer.hpp"
#include "base/window_registry.hpp"
#include "bootstrap/bootstrap.hpp"
#include "gdx/channel.hpp"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "gdx/window.hpp"
#include "proxy/proxy.hpp"
#include "runtime/context_link.hpp"
#include "transport/transport.hpp"

namespace gdx {

class DirectPaths;
class Relay;

class ContextImpl {
 public:
  /// `api`: the public Context that owns this one (what ContextRef hands out).
  ContextImpl(Context* api, const BootstrapConfig& bootstrap, const ContextOptions& options);
  ~ContextImpl();
  ContextImpl(const ContextImpl&) = delete;
  ContextImpl& operator=(const ContextImpl&) = delete;

  int rank() const { return bootstrap_->rank(); }
  int worldSize() const { return bootstrap_->worldSize(); }
  Bootstrap& bootstrap() { return *bootstrap_; }
  Proxy& proxy() { return *proxy_; }
  Transport& transport() { return *transport_; }
  const ContextOptions& options() const { return options_; }
  /// What objects that may outlive this Context keep of it (runtime/context_link.hpp), as Window and Channel do:
  /// through it a later use finds the Context gone and throws kShutdown instead of touching freed memory.
  const std::shared_ptr<detail::ContextLink>& link() const { return link_; }
  ContextRef ref() const { return ContextRef(link_); }

  // The public Context's calls (documented in gdx/context.hpp).

  Window registerWindow(void* base, size_t bytes, MemoryKind kind = MemoryKind::kHost, const std::string& name = {},
                        WindowSizes sizes = WindowSizes::kEqual);
  Channel channel(int peer, int ringIndex = -1);
  ChannelDeviceHandle deviceChannel(int peer, int ringIndex = -1);
  int numDeviceRings() const;
  Channel relayChannel(int destination, int relay, int ringIndex = -1);
  ChannelDeviceHandle deviceRelayChannel(int destination, int relay, int ringIndex = -1);
  PeerCopyQueue* forwarder();
  const GpuInfo& gpu() const { return gpu_; }

  uint32_t numSignals() const { return options_.numSignals; }
  bool isDirect(int peer) const;
  uint64_t signalValue(uint32_t id) const;
  void setSignal(uint32_t id, uint64_t value);
  void wait(uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  Status waitStatus(uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  void waitFrom(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  Status waitFromStatus(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs = 0) const;
  std::string failure() const;
  std::string failure(int peer) const;
  bool peerFailed(int peer) const;
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
  // Shared with every Window and Channel handed out; cleared by ~Context (runtime/context_link.hpp).
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
