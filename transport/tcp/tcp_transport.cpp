// TcpTransport: construction, windows, failure handling and shutdown. Connection setup is in tcp_connect.cpp,
// the data path in tcp_sender.cpp and tcp_receiver.cpp.
#include "transport/tcp/tcp_transport.hpp"

#include <sys/socket.h>

#include <mutex>
#include <shared_mutex>
#include <sstream>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"

namespace gdx {

TcpTransportOptions TcpTransportOptions::fromEnv(int rank, int worldSize, const std::string& secret) {
  TcpTransportOptions o;
  o.rank = rank;
  o.worldSize = worldSize;
  o.secret = secret;
  // envInt holds both to the table's bounds, which are the constructor's ([1, 64], [1, tcp::kMaxChunkBytes]).
  o.socketsPerPeer = static_cast<int>(envInt("GDX_TCP_SOCKETS", 4));
  o.chunkBytes = static_cast<size_t>(envInt("GDX_TCP_CHUNK", 1 << 20));
  o.bindAddress = envString("GDX_TCP_BIND_ADDR", "");
  o.fault = envString("GDX_FAULT", "");
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

std::unique_ptr<Transport> makeTcpTransport(const TcpTransportOptions& options) {
  return std::make_unique<tcp::TcpTransport>(options);
}

namespace tcp {

TcpTransport::TcpTransport(const TcpTransportOptions& options)
    : options_(options),
      fault_(common::FaultPlan::parse(options.fault, options.worldSize)),
      rank_(options.rank),
      world_(options.worldSize),
      sockets_(options.socketsPerPeer) {
  if (fault_.plan().action != common::FaultAction::kNone)
    GDX_WARN("TCP transport rank " << rank_ << ": will " << fault_.plan().describe());
  std::ostringstream bad;
  if (world_ < 1)
    bad << "world size " << world_ << " must be at least 1";
  else if (rank_ < 0 || rank_ >= world_)
    bad << "rank " << rank_ << " is outside the world of " << world_;
  else if (sockets_ < 1 || sockets_ > 64)
    bad << "socketsPerPeer (GDX_TCP_SOCKETS) " << sockets_ << " must be in [1, 64]";
  else if (options.chunkBytes < 1 || options.chunkBytes > kMaxChunkBytes)
    bad << "chunkBytes (GDX_TCP_CHUNK) " << options.chunkBytes << " must be in [1, " << kMaxChunkBytes << "]";
  else if (options.timeoutNs == 0)
    bad << "timeoutNs (GDX_TIMEOUT_MS) must be positive";
  else if (options.secret.size() > kMaxSecretBytes)
    bad << "the job secret (GDX_JOB_SECRET) is longer than " << kMaxSecretBytes;
  if (!bad.str().empty()) throw Error(ErrorCode::kInvalidArgument, "TCP transport: " + bad.str());

  int port = 0;
  listener_ = net::listenOn(options.bindAddress, &port);
  std::string host = options.bindAddress;
  if (host.empty() || host == "0.0.0.0") {
    // Listening everywhere: advertise the interface that routes to the master, which peers can reach us by.
    std::string master = envFirst({"GDX_MASTER_ADDR", "MASTER_ADDR"}, "");
    host = master.empty() ? "" : net::localAddressToward(master);
    if (host.empty()) host = "127.0.0.1";
  }
  advertised_ = host + ":" + std::to_string(port);

  windows_.setPeers(world_);
  why_.resize(world_);
  peerState_ = std::make_unique<std::atomic<int>[]>(world_);
  for (int p = 0; p < world_; ++p) peerState_[p].store(kPeerOk);
  GDX_INFO("TCP transport rank " << rank_ << "/" << world_ << " listening at " << advertised_ << " (" << sockets_
                                 << " sockets per peer, " << options.chunkBytes << "-byte chunks)");
}

TcpTransport::~TcpTransport() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    GDX_ERROR("TCP transport rank " << rank_ << ": shutdown failed in the destructor: " << e.what());
  } catch (...) {
    GDX_ERROR("TCP transport rank " << rank_ << ": shutdown failed in the destructor");
  }
}

TransportLane& TcpTransport::lane(int index) {
  if (!connected_ || index < 0 || index >= static_cast<int>(lanes_.size()))
    throw Error(ErrorCode::kInvalidArgument, "TCP transport rank " + std::to_string(rank_) + ": lane " +
                                                 std::to_string(index) + " does not exist (" +
                                                 std::to_string(lanes_.size()) + " lanes connected)");
  return *lanes_[index];
}

namespace {
/// Peers address windows by id and offset only (common::windowKey()).
constexpr char kKeyScheme[] = "tcp";
}  // namespace

std::string TcpTransport::registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
  return registerWindowFor(id, base, bytes, kind, RemoteAccess::kWrite);
}

std::string TcpTransport::registerWindowFor(uint32_t id, void* base, size_t bytes, MemoryKind kind,
                                            RemoteAccess access) {
  std::string w = "TCP transport rank " + std::to_string(rank_) + ": window " + std::to_string(id);
  common::LocalWindow window = common::cpuWindow(w, base, bytes, kind);
  window.access = access;  // before the receivers can see the window: no write slips in before it is narrowed
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  windows_.addLocal(id, window, w);
  return common::windowKey(kKeyScheme, id, bytes, kind == MemoryKind::kCuda, base);
}

void TcpTransport::deregisterWindow(uint32_t id) {
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  windows_.removeLocal(id, "TCP transport rank " + std::to_string(rank_));
}

void TcpTransport::setRemoteAccess(uint32_t id, RemoteAccess access) {
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  common::LocalWindow* w = windows_.mutableLocal(id);
  if (!w)
    throw Error(ErrorCode::kInvalidArgument, "TCP transport rank " + std::to_string(rank_) + ": window " +
                                                 std::to_string(id) + " is not registered");
  w->access = access;
}

void TcpTransport::addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) {
  if (peer < 0 || peer >= world_)
    throw Error(ErrorCode::kInvalidArgument, "TCP transport rank " + std::to_string(rank_) + ": remote window " +
                                                 std::to_string(id) + " of unknown peer " + std::to_string(peer));
  common::RemoteWindow window =
      common::parseWindowKey("TCP transport rank " + std::to_string(rank_), kKeyScheme, peer, id, bytes, key);
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  windows_.setRemote(peer, id, window);
}

Status TcpTransport::peerStatus(int peer) const {
  if (peer < 0 || peer >= world_) return Status::kInvalidArgument;
  switch (peerState_[peer].load()) {
    case kPeerOk: return Status::kOk;
    case kPeerGoodbye: return Status::kShutdown;
    default: return Status::kPeerFailed;
  }
}

Status TcpTransport::failedStatus(int peer) const {
  if (stopping_.load()) return Status::kShutdown;
  int state = peerState_[peer].load();
  if (state == kPeerFailed) return Status::kPeerFailed;
  if (state == kPeerGoodbye) return Status::kShutdown;
  return Status::kOk;
}

void TcpTransport::failPeer(int peer, const std::string& why) {
  int expected = kPeerOk;
  if (!peerState_[peer].compare_exchange_strong(expected, kPeerFailed)) return;  // reported once
  {
    std::lock_guard<std::mutex> lock(whyMutex_);
    why_[peer] = why;
  }
  // Every socket to and from the peer stops: senders blocked on it return at once and fail their queues,
  // receivers see EOF. This is the TCP picture of a queue pair going to the error state.
  if (connected_) {
    for (int l = 0; l < numLanes_; ++l) {
      for (int s = 0; s < sockets_; ++s) {
        TxSocket& tx = txSocket(l, peer, s);
        if (tx.fd.valid()) ::shutdown(tx.fd.get(), SHUT_RDWR);
        RxSocket* rx = rx_[slot(l, peer, s)].get();
        if (rx && rx->fd.valid()) ::shutdown(rx->fd.get(), SHUT_RDWR);
      }
    }
  }
  if (stopping_.load()) {
    GDX_INFO("TCP transport rank " << rank_ << ": peer " << peer << " lost during shutdown: " << why);
    return;
  }
  GDX_ERROR("TCP transport rank " << rank_ << ": peer " << peer << " failed: " << why);
  failureHandler_.notify(peer, why);
}

bool TcpTransport::txAborted() const {
  uint64_t deadline = drainDeadlineNs_.load();
  return deadline != 0 && nowNs() > deadline;
}

void TcpTransport::shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdownMutex_);
    if (shutDown_) return;
    shutDown_ = true;
  }
  stopping_.store(true);
  // 1. Senders drain what is queued (bounded by the timeout), say GOODBYE, and stop.
  drainDeadlineNs_.store(nowNs() + options_.timeoutNs);
  for (auto& s : tx_) {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      s->goodbye = true;
    }
    s->cv.notify_all();
  }
  for (auto& s : tx_)
    if (s->thread.joinable()) s->thread.join();
  // 2. Receivers stop; data still arriving from peers that keep going is dropped, as it would be at a QP that
  //    was destroyed.
  rxStop_.store(true);
  {
    std::lock_guard<std::mutex> lock(rxMutex_);
    for (auto& r : rx_)
      if (r && r->fd.valid()) ::shutdown(r->fd.get(), SHUT_RDWR);
  }
  for (auto& r : rx_)
    if (r && r->thread.joinable()) r->thread.join();
  // 3. The acceptor.
  acceptorStop_.store(true);
  wake_.wake();
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& s : tx_) s->fd.reset();
  for (auto& r : rx_)
    if (r) r->fd.reset();
  listener_.reset();
  GDX_INFO("TCP transport rank " << rank_ << ": shut down");
}

}  // namespace tcp
}  // namespace gdx
