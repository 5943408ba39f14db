#include <cxxabi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/log.hpp"
#include "base/timer_slack.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/error.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/direct_path.hpp"
#include "runtime/relay.hpp"
#include "runtime/window_record.hpp"
#include "transport/factory.hpp"

namespace gdx {
namespace {

CollectiveTag tagged(const char* kind) {
  CollectiveTag tag;
  tag.kind = kind;
  return tag;
}

}  // namespace

ContextOptions ContextOptions::fromEnv() {
  // Every variable first, so that one message lists all that are wrong, not only the first one read.
  checkEnvironment();
  ContextOptions o;
  o.proxy = Proxy::Options::fromEnv();
  o.proxy.placement = defaultPlacement();
  o.numSignals = static_cast<uint32_t>(envInt("GDX_NUM_SIGNALS", o.numSignals));  // at most kMaxSignals
  o.transport = envChoice("GDX_TRANSPORT", o.transport);
  o.tcpSockets = static_cast<int>(envInt("GDX_TCP_SOCKETS", o.tcpSockets));
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

namespace {

// The TCP transport opens, and serves with a thread each, one socket per (lane, peer, socket index) in each
// direction. Settings that need more descriptors or threads than this process may have can never connect: say so
// with the variables that ask for them, rather than failing (or stalling) in the middle of connecting.
void checkTcpResources(int world, const ContextOptions& options) {
  const uint64_t sockets = 2ull * static_cast<uint64_t>(options.proxy.threads) * static_cast<uint64_t>(world) *
                           static_cast<uint64_t>(options.tcpSockets);
  const uint64_t headroom = 64;  // the bootstrap, the listener, the program's own files
  auto refuse = [&](const char* what, uint64_t limit, const char* limitName) {
    throw Error(ErrorCode::kInvalidArgument, "GDX_PROXY_THREADS=" + std::to_string(options.proxy.threads) +
                                                 " x GDX_TCP_SOCKETS=" + std::to_string(options.tcpSockets) + " x " +
                                                 std::to_string(world) + " ranks need " + std::to_string(sockets) +
                                                 " " + what + " (one per lane, rank and socket, each way)" +
                                                 " but this process may have " + std::to_string(limit) + " (" +
                                                 limitName + "); lower GDX_PROXY_THREADS or GDX_TCP_SOCKETS");
  };
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY && sockets + headroom > files.rlim_cur)
    refuse("sockets", files.rlim_cur, "RLIMIT_NOFILE");
  rlimit tasks{};
  if (getrlimit(RLIMIT_NPROC, &tasks) == 0 && tasks.rlim_cur != RLIM_INFINITY && sockets + headroom > tasks.rlim_cur)
    refuse("threads", tasks.rlim_cur, "RLIMIT_NPROC");
}

// What can be known to be wrong before joining the job, checked before joining it: a rank that fails here would
// otherwise leave the others waiting at the rendezvous until their timeout, or fail only after it.
void checkBeforeJoining(const BootstrapConfig& bootstrap, const ContextOptions& options) {
  // Variables read later (by the transport, the proxy, the copy queue) are checked now as well.
  checkEnvironment();
  auto invalid = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); };
  if (options.timeoutNs == 0) invalid("ContextOptions::timeoutNs (GDX_TIMEOUT_MS) must be positive");
  if (bootstrap.worldSize > static_cast<int>(kMaxPeers))
    invalid("world size " + std::to_string(bootstrap.worldSize) + " exceeds the " + std::to_string(kMaxPeers) +
            " ranks a command can address");
  if (options.numSignals == 0 || options.numSignals > kMaxSignals)
    invalid("GDX_NUM_SIGNALS=" + std::to_string(options.numSignals) + " is out of range; allowed: [1, " +
            std::to_string(kMaxSignals) + "]");
  if (options.tcpSockets < 1 || options.tcpSockets > 64)
    invalid("GDX_TCP_SOCKETS=" + std::to_string(options.tcpSockets) + " is out of range; allowed: [1, 64]");
  checkTransportKind(options.transport, bootstrap.worldSize);
  options.proxy.validate();
  if (options.transport == "tcp") checkTcpResources(bootstrap.worldSize, options);
}

}  // namespace

ContextImpl::ContextImpl(Context* api, const BootstrapConfig& bootstrap, const ContextOptions& options)
    : options_(options) {
  link_->api = api;
  options_.proxy.timeoutNs = options_.timeoutNs;
  checkBeforeJoining(bootstrap, options_);
  gpu_ = selectGpu();
  // The GPU decides where proxy threads and rings live unless GDX_NUMA_NODE says otherwise.
  if (gpu_.present() && envInt("GDX_NUMA_NODE", -1) < 0) {
    try {
      options_.proxy.placement = placementForPciBusId(gpu_.pciBusId);
    } catch (const Error& e) {
      GDX_WARN("no NUMA placement for GPU " << gpu_.pciBusId << " (" << e.what() << "); using the default");
    }
  }
  if (options_.proxy.placement.reason.empty()) options_.proxy.placement = defaultPlacement();
  // Several rings per thread with a GPU: a ring's producers are served in reservation order, so a thousand warps
  // on one ring wait for each other; four rings per thread keep a many-block kernel at the consumer's rate.
  if (options_.proxy.deviceRingsPerThread < 0)
    options_.proxy.deviceRingsPerThread = gpu_.present() ? kDefaultDeviceRingsPerThread : 0;
  bootstrap_ = std::make_unique<Bootstrap>(bootstrap);
  link_->rank = bootstrap_->rank();
  peerFailure_.assign(static_cast<size_t>(bootstrap_->worldSize()), std::string());
  try {
    init();
  } catch (...) {
    // No destructor runs for a constructor that throws: stop the threads that use this object's members
    // (proxy, transport receivers calling onImm/onPeerFailure) before those members are destroyed.
    shutdownThreads();
    throw;
  }
}

void ContextImpl::shutdownThreads() noexcept {
  try {
    if (proxy_) proxy_->stop();
    if (transport_) transport_->shutdown();
  } catch (const std::exception& e) {
    GDX_ERROR("closing the context: " << e.what());
  }
}

void ContextImpl::init() {
  const int rank = bootstrap_->rank(), world = bootstrap_->worldSize();
  TransportParams params;
  params.rank = rank;
  params.worldSize = world;
  params.secret = bootstrap_->secret();
  params.bindAddress = bootstrap_->localIp();
  params.timeoutNs = options_.timeoutNs;
  params.socketsPerPeer = options_.tcpSockets;
  params.lanes = options_.proxy.threads;
  transport_ = makeTransport(options_.transport, params);
  transport_->setImmHandler([this](const RemoteWrite& w) { onImm(w); });
  transport_->setMessageHandler([this](const RemoteMessage& m) { onMessage(m); });
  transport_->setPeerFailureHandler([this](int peer, const std::string& why) { onPeerFailure(peer, why); });
  std::vector<std::string> addresses = bootstrap_->allGather(transport_->localAddress(), tagged("Context: addresses"));
  transport_->connect(addresses, options_.proxy.threads);

  registry_ = std::make_unique<WindowRegistry>(rank, world, kMaxWindows);
  windowInUse_.assign(kMaxWindows, false);
  fenceOnDeregister_.assign(kMaxWindows, false);
  // The signal array, then the failure word on its own line and the peers' words after it; all host-mapped so
  // kernels can poll them.
  const size_t signalBytes = size_t{options_.numSignals} * 8;
  signals_ =
      std::make_unique<HostBuffer>(signalBytes + 128 + size_t(world) * 4, options_.proxy.placement.numaNode, true);
  failed_ = reinterpret_cast<uint32_t*>(static_cast<char*>(signals_->data()) + signalBytes);
  peerStatus_ = reinterpret_cast<uint32_t*>(static_cast<char*>(signals_->data()) + signalBytes + 128);
  // The signal array is a window like any other (remote atomics address it), under a reserved id.
  {
    std::string key = transport_->registerWindow(kSignalWindowId, signals_->data(), signalBytes, MemoryKind::kHost);
    registry_->addLocal(kSignalWindowId, signals_->data(), signalBytes, MemoryKind::kHost);
    windowInUse_[kSignalWindowId] = true;
    std::vector<std::string> all =
        bootstrap_->allGather(encodeWindowRecord(kSignalWindowId, signalBytes, key), tagged("Context: signals"));
    for (int p = 0; p < world; ++p) {
      WindowRecord r = decodeWindowRecord(all[p], p);
      transport_->addRemoteWindow(p, r.id, r.bytes, r.key);
      registry_->addRemote(p, r.id, r.bytes);
    }
  }
  direct_ = std::make_unique<DirectPaths>(*bootstrap_, gpu_, options_.numSignals);
  relay_ = std::make_unique<Relay>(*bootstrap_, *registry_, *direct_, gpu_, options_.timeoutNs);
  proxy_ = std::make_unique<Proxy>(options_.proxy, transport_.get(), *registry_, relay_.get());
  proxy_->start();
  {
    // Under the same lock as onPeerFailure: a failure that came while connecting is applied now, one that
    // comes later finds the failure words in place.
    std::lock_guard<std::mutex> lock(failureMutex_);
    failureWord_ = failed_;
    peerWords_ = peerStatus_;
    for (int p = 0; p < world; ++p)
      if (!peerFailure_[p].empty()) {
        atomicStore(failed_, static_cast<uint32_t>(Status::kPeerFailed), kRelease);
        atomicStore(&peerStatus_[p], static_cast<uint32_t>(Status::kPeerFailed), kRelease);
      }
  }
  bootstrap_->barrier();
  {
    std::unique_lock<std::shared_mutex> lock(link_->mutex);
    link_->context = this;
  }
  GDX_INFO("context ready: rank " << rank << " of " << world << ", transport " << transport_->name()
                                  << (options_.transport == "tcp"
                                          ? " (" + std::to_string(options_.tcpSockets) + " sockets per peer)"
                                          : std::string())
                                  << ", " << options_.numSignals << " signals");
}

ContextImpl::~ContextImpl() {
  link_->closing.store(true, std::memory_order_release);  // no new Window or Channel use from here on
  drainRings("closing the context", true);
  {
    // Waits for Window and Channel calls in progress; later ones find the Context gone.
    std::unique_lock<std::shared_mutex> lock(link_->mutex);
    link_->context = nullptr;
  }
  shutdownThreads();
}

Window ContextImpl::registerWindow(void* base, size_t bytes, MemoryKind kind, const std::string& name,
                                   WindowSizes sizes) {
  if (!base || bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": cannot register an empty window");
  uint32_t id = kMaxUserWindows;
  {
    std::lock_guard<std::mutex> lock(windowMutex_);
    for (uint32_t i = 0; i < kMaxUserWindows; ++i)
      if (!windowInUse_[i]) {
        id = i;
        break;
      }
    if (id == kMaxUserWindows)
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": all " +
                                                   std::to_string(kMaxUserWindows) + " window ids are in use");
    windowInUse_[id] = true;
  }
  // This rank's own step may fail (its transport refuses the memory) where the others' succeed: it still joins the
  // exchange with a failure record, so that every rank fails the call together and names it, instead of the others
  // waiting for it until the timeout and meeting its next collective call in this one's place.
  std::string key, blob, failure;
  ErrorCode failureCode = ErrorCode::kOk;
  bool inTransport = false;
  try {
    key = transport_->registerWindow(id, base, bytes, kind);
    inTransport = true;
    registry_->addLocal(id, base, bytes, kind);
    blob = direct_->windowBlob(base, bytes, kind);
  } catch (const abi::__forced_unwind&) {
    throw;  // thread cancellation must go on unwinding
  } catch (const Error& e) {
    failure = e.message();
    failureCode = e.code() == ErrorCode::kOk ? ErrorCode::kInternal : e.code();
  } catch (const std::exception& e) {
    failure = e.what();
    failureCode = ErrorCode::kInternal;
  } catch (...) {
    failure = "an exception that is not a std::exception";
    failureCode = ErrorCode::kInternal;
  }
  CollectiveTag tag = tagged("registerWindow");
  tag.size = bytes;
  tag.name = name;
  tag.sameSize = name.empty() && sizes == WindowSizes::kEqual;  // unnamed windows pair by order alone
  const std::string call = "registerWindow of " + std::to_string(bytes) + " bytes" +
                           (name.empty() ? std::string() : " named '" + name + "'");
  if (failureCode != ErrorCode::kOk) {
    if (inTransport) {
      registry_->removeLocal(id);
      try {
        transport_->deregisterWindow(id);
      } catch (const std::exception& e) {
        GDX_ERROR("rank " << rank() << ": undoing the registration of window " << id << ": " << e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(windowMutex_);
      windowInUse_[id] = false;
    }
    bootstrap_->allGather(encodeFailedWindowRecord(failure), tag);
    throw Error(failureCode, "rank " + std::to_string(rank()) + ": " + call + ": " + failure);
  }
  // From here on the Window deregisters what was set up if the exchange or a later step throws.
  Window window(link_, id, base, bytes, kind, name);
  std::vector<std::string> all = bootstrap_->allGather(encodeWindowRecord(id, bytes, key, blob), tag);
  std::vector<WindowRecord> records;
  for (int p = 0; p < worldSize(); ++p) {
    records.push_back(decodeWindowRecord(all[p], p));
    if (records.back().failed())
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": " + call + ": rank " +
                                                   std::to_string(p) +
                                                   " could not register its memory: " + records.back().key);
  }
  direct_->addLocal(id, base, bytes, kind);
  bool anyDirect = false;
  for (int p = 0; p < worldSize(); ++p) {
    const WindowRecord& r = records[p];
    const uint32_t peerId = r.id;
    const uint64_t peerBytes = r.bytes;
    const std::string& peerKey = r.key;
    const std::string& peerDirect = r.direct;
    if (peerId != id)
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + " registered window " +
                                                   std::to_string(id) + " while rank " + std::to_string(p) +
                                                   " registered window " + std::to_string(peerId) +
                                                   ": windows must be registered in the same order on every rank");
    transport_->addRemoteWindow(p, id, peerBytes, peerKey);
    registry_->addRemote(p, id, peerBytes);
    direct_->addRemote(p, id, peerBytes, peerDirect);
    anyDirect = anyDirect || !peerDirect.empty();
  }
  {
    std::lock_guard<std::mutex> lock(windowMutex_);
    fenceOnDeregister_[id] = anyDirect;  // the same on every rank: all decide from the same records
  }
  GDX_DEBUG("registered window " << id << " of " << bytes << " bytes");
  return window;
}

void ContextImpl::deregister(uint32_t id) noexcept {
  // Commands naming the window may still be in the rings (puts not flushed): let them finish first.
  drainRings("destroying window " + std::to_string(id), false);
  // Each step on its own: one that fails (a sticky CUDA error, say) must not leave the others undone, or the id
  // would be free here and still registered below.
  auto step = [&](const char* what, auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      GDX_ERROR("rank " << rank() << ": destroying window " << id << ": " << what << ": " << e.what());
    }
  };
  // Copies the relay queued into a same-host peer's windows finish before any mapping is closed.
  step("waiting for the relay's forwarded copies", [&] {
    if (PeerCopyQueue* q = relay_ ? relay_->forwarder() : nullptr) q->waitCompleted(q->submitted());
  });
  step("direct path", [&] { direct_->removeWindow(id); });
  step("window registry", [&] { registry_->removeLocal(id); });
  step("transport", [&] { transport_->deregisterWindow(id); });
  bool fence = false;
  {
    std::lock_guard<std::mutex> lock(windowMutex_);
    fence = fenceOnDeregister_[id];
  }
  if (fence) fenceDeregistration(id);
  std::lock_guard<std::mutex> lock(windowMutex_);
  windowInUse_[id] = false;
  fenceOnDeregister_[id] = false;
}

void ContextImpl::fenceDeregistration(uint32_t id) noexcept {
  // Same-host peers mapped the window's GPU memory (CUDA IPC) for their kernels' direct stores. Its owner frees it
  // once the Window is gone, and freeing memory another process still maps is undefined in CUDA (stores through
  // the old mapping would be lost, a new allocation at the address would find it): every rank has unmapped its
  // peers' window `id` above; this waits until all have. Also after a peer failed: whether a rank has seen that
  // yet differs between ranks, and a rank that skipped the wait would meet the others' in its next collective. A
  // dead rank ends the wait at once (its bootstrap connection closes); one that hangs, within GDX_TIMEOUT_MS.
  try {
    const std::string kind = "deregisterWindow " + std::to_string(id);
    bootstrap_->allGather(std::string(), tagged(kind.c_str()));
  } catch (const std::exception& e) {
    GDX_ERROR("rank " << rank() << ": destroying window " << id
                      << ": the wait for every rank to unmap it failed (windows must be destroyed in the same "
                         "order on every rank): "
                      << e.what());
  }
}

Channel ContextImpl::channel(int peer, int ringIndex) {
  return makeChannel(peer, ringIndex, -1);
}

ChannelDeviceHandle ContextImpl::deviceChannel(int peer, int ringIndex) {
  return makeDeviceChannel(peer, ringIndex, -1);
}

int ContextImpl::numDeviceRings() const {
  return proxy_->numDeviceRings();
}

// Channels are spread over the rings by the rank their data is for (the destination of a relayed channel).
Channel ContextImpl::makeChannel(int peer, int ringIndex, int forwardTo) {
  if (peer < 0 || peer >= worldSize())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": peer " + std::to_string(peer) +
                                                 " does not exist (world size " + std::to_string(worldSize()) + ")");
  if (proxy_->numRings() == 0)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(rank()) + ": no rings for host producers (GDX_RINGS_PER_THREAD=0)");
  if (ringIndex < 0) ringIndex = (forwardTo >= 0 ? forwardTo : peer) % proxy_->numRings();
  if (ringIndex >= proxy_->numRings())
    throw Error(ErrorCode::kInvalidArgument, "ring " + std::to_string(ringIndex) + " does not exist (" +
                                                 std::to_string(proxy_->numRings()) + " rings)");
  return Channel(link_, peer, ringIndex, proxy_->ring(ringIndex).hostHandle(), &peerStatus_[peer], forwardTo);
}

ChannelDeviceHandle ContextImpl::makeDeviceChannel(int peer, int ringIndex, int forwardTo) {
  if (peer < 0 || peer >= worldSize())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": peer " + std::to_string(peer) +
                                                 " does not exist (world size " + std::to_string(worldSize()) + ")");
  if (proxy_->numDeviceRings() == 0 || !signals_->gpuMapped())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": no GPU, so no device channels");
  if (ringIndex < 0) ringIndex = (forwardTo >= 0 ? forwardTo : peer) % proxy_->numDeviceRings();
  if (ringIndex >= proxy_->numDeviceRings())
    throw Error(ErrorCode::kInvalidArgument, "device ring " + std::to_string(ringIndex) + " does not exist (" +
                                                 std::to_string(proxy_->numDeviceRings()) + " device rings)");
  auto* devSignals = static_cast<uint64_t*>(signals_->devicePtr());
  // The handle watches the peer it sends to; a relayed one the relay, which its commands and waits go through.
  auto* devFailure = signals_->deviceAddressOf(&peerStatus_[peer]);
  ChannelDeviceHandle h{proxy_->deviceRing(ringIndex).deviceHandle(), devSignals, devFailure, options_.numSignals,
                        static_cast<uint32_t>(peer), ~uint64_t{0},
                        // A relayed handle sends everything through the proxy to the relay.
                        peer == rank() || forwardTo >= 0 ? nullptr : direct_->deviceTable(peer),
                        direct_->deviceSignals(), forwardTo};
  if (h.direct)
    direct_->withPeerTable(peer, [&h](const DirectPeer* t) {
      if (t) {
        h.directSignals = t->peerSignals;
        h.directNumSignals = t->peerNumSignals;
      }
    });
  return h;
}

Channel ContextImpl::relayChannel(int destination, int relay, int ringIndex) {
  relay_->checkRoute(destination, relay);
  return makeChannel(relay, ringIndex, destination);
}

ChannelDeviceHandle ContextImpl::deviceRelayChannel(int destination, int relay, int ringIndex) {
  relay_->checkRoute(destination, relay);
  return makeDeviceChannel(relay, ringIndex, destination);
}

PeerCopyQueue* ContextImpl::forwarder() {
  return relay_->forwarder();
}

void* ContextImpl::directWindowBase(int peer, uint32_t id) const {
  if (!direct_ || id >= kMaxWindows) return nullptr;
  return direct_->withPeerTable(peer, [id](const DirectPeer* t) -> void* { return t ? t->peerBase[id] : nullptr; });
}

bool ContextImpl::isDirect(int peer) const {
  return direct_ && direct_->isDirect(peer);
}

uint64_t ContextImpl::signalValue(uint32_t id) const {
  if (id >= options_.numSignals)
    throw Error(ErrorCode::kInvalidArgument, "signal id " + std::to_string(id) + " out of range");
  uint64_t h = atomicLoad(static_cast<uint64_t*>(signals_->data()) + id, kAcquire);
  if (!direct_->mayReceive()) return h;
  uint64_t d = direct_->readSignal(id);
  return h > d ? h : d;
}

void ContextImpl::setSignal(uint32_t id, uint64_t value) {
  if (id >= options_.numSignals)
    throw Error(ErrorCode::kInvalidArgument, "signal id " + std::to_string(id) + " out of range");
  atomicStore(static_cast<uint64_t*>(signals_->data()) + id, value, kRelease);
  direct_->writeSignal(id, value);
}

template <typename Ended>
Status ContextImpl::waitLoop(uint32_t id, uint64_t value, uint64_t timeoutNs, Ended&& ended) const {
  if (id >= options_.numSignals) return Status::kInvalidArgument;
  uint64_t* word = static_cast<uint64_t*>(signals_->data()) + id;
  const uint64_t bound = timeoutNs ? timeoutNs : options_.timeoutNs;
  const uint64_t start = nowNs();
  // Direct-path updates land in device memory: read it through a copy, at most every 20 µs.
  const bool device = direct_->mayReceive();
  uint64_t lastDeviceRead = 0;
  Napper napper;  // its naps end on time (base/timer_slack.hpp)
  for (uint64_t spins = 0;; ++spins) {
    if (atomicLoad(word, kAcquire) >= value) return Status::kOk;
    if (device && nowNs() - lastDeviceRead > 20000) {
      if (direct_->readSignal(id) >= value) return Status::kOk;
      lastDeviceRead = nowNs();
    }
    if (ended()) return Status::kPeerFailed;
    if ((spins & 63) == 0 && nowNs() - start > bound) return Status::kTimeout;
    if (spins > 100000)
      napper.nap(std::chrono::microseconds(20));
    else
      spinPause(spins);
  }
}

Status ContextImpl::waitStatus(uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  const int others = worldSize() - 1;
  return waitLoop(id, value, timeoutNs,
                  [&] { return others > 0 && failedPeers_.load(std::memory_order_acquire) >= others; });
}

Status ContextImpl::waitFromStatus(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  if (peer < 0 || peer >= worldSize()) return Status::kInvalidArgument;
  const uint32_t* word = &peerStatus_[peer];
  return waitLoop(id, value, timeoutNs, [&] { return atomicLoad(const_cast<uint32_t*>(word), kAcquire) != 0; });
}

std::string ContextImpl::waitError(const char* what, uint32_t id, uint64_t value, Status s, uint64_t startNs) const {
  std::string msg = "rank " + std::to_string(rank()) + ": " + what + " for signal " + std::to_string(id) +
                    " >= " + std::to_string(value) + " returned '" + statusName(s) + "' after " +
                    std::to_string((nowNs() - startNs) / 1000000) + " ms; last value seen " +
                    std::to_string(id < options_.numSignals ? signalValue(id) : 0);
  // Every failed peer with its first cause: whichever of them was to raise the signal, the reason is here.
  std::lock_guard<std::mutex> lock(failureMutex_);
  for (const std::string& f : peerFailure_)
    if (!f.empty()) msg += "; " + f;
  return msg;
}

void ContextImpl::wait(uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  const uint64_t start = nowNs();
  Status s = waitStatus(id, value, timeoutNs);
  if (s == Status::kOk) return;
  std::string msg = waitError("wait", id, value, s, start);
  // With GDX_TRACE, the last commands to each peer go to the log: what was sent, posted and completed before the
  // wait gave up is what a post-mortem needs first.
  const std::string recent = proxy_->recentTrace(16);
  if (!recent.empty()) GDX_ERROR(msg << "; traced proxy events (all in " << proxy_->tracePath() << "):" << recent);
  throw Error(errorCodeFor(s), msg);
}

void ContextImpl::waitFrom(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  if (peer < 0 || peer >= worldSize())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": waitFrom peer " +
                                                 std::to_string(peer) + " does not exist (world size " +
                                                 std::to_string(worldSize()) + ")");
  const uint64_t start = nowNs();
  Status s = waitFromStatus(peer, id, value, timeoutNs);
  if (s == Status::kOk) return;
  std::string msg = waitError(("wait from peer " + std::to_string(peer)).c_str(), id, value, s, start);
  const std::string recent = proxy_->recentTrace(16);
  if (!recent.empty()) GDX_ERROR(msg << "; traced proxy events (all in " << proxy_->tracePath() << "):" << recent);
  throw Error(errorCodeFor(s), msg);
}

std::string ContextImpl::failure() const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

std::string ContextImpl::failure(int peer) const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (peer < 0 || static_cast<size_t>(peer) >= peerFailure_.size()) return {};
  return peerFailure_[peer];
}

bool ContextImpl::peerFailed(int peer) const {
  return peer >= 0 && peer < worldSize() && atomicLoad(&peerStatus_[peer], kAcquire) != 0;
}

const uint32_t* ContextImpl::deviceFailureWord() const {
  return signals_->gpuMapped() ? signals_->deviceAddressOf(failed_) : nullptr;
}

void ContextImpl::onImm(const RemoteWrite& w) {
  SignalUpdate u = decodeSignalImm(w.imm);
  if (!u.valid || u.id >= options_.numSignals) {
    GDX_ERROR("rank " << rank() << ": write-with-immediate from rank " << w.peer << " carries an invalid signal "
                      << "update (imm 0x" << std::hex << w.imm << ")");
    return;
  }
  uint64_t* word = static_cast<uint64_t*>(signals_->data()) + u.id;
  if (u.op == SignalOp::kAdd)
    atomicFetchAdd(word, u.value, kRelease);
  else
    atomicStore(word, u.value, kRelease);
}

// Control messages are the relay's forward requests (runtime/relay.hpp); they come only from peers that saw this
// context ready, so relay_ is in place.
void ContextImpl::onMessage(const RemoteMessage& m) {
  if (relay_) relay_->onMessage(m);
}

// Only this peer's word is set: the proxy's rings go on, the transport completes the operations to the peer with
// kPeerFailed (so flushes of its channels fail) and waits on it end; traffic to every other peer is untouched.
void ContextImpl::onPeerFailure(int peer, const std::string& why) {
  if (peer < 0 || peer >= worldSize()) return;
  std::string msg = "rank " + std::to_string(peer) + " failed: " + why;
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (failure_.empty()) failure_ = msg;
  if (!peerFailure_[peer].empty()) return;  // the first cause is the one that explains the rest
  peerFailure_[peer] = msg;
  if (peer != rank()) failedPeers_.fetch_add(1, std::memory_order_release);
  GDX_WARN("rank " << rank() << ": " << msg << "; operations to it fail, the other peers go on");
  // Before init() published the words, it applies peerFailure_ itself.
  if (failureWord_) atomicStore(failureWord_, static_cast<uint32_t>(Status::kPeerFailed), kRelease);
  if (peerWords_) atomicStore(&peerWords_[peer], static_cast<uint32_t>(Status::kPeerFailed), kRelease);
}

}  // namespace gdx
