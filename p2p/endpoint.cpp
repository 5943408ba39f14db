// Endpoint: listening, connecting, accepting (blocking and passive), metadata and the addRemoteEndpoint cache.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/endpoint_impl.hpp"
#include "p2p/handshake.hpp"
#include "p2p/protocol.hpp"

namespace gdx::p2p {
namespace {

/// How many released connections an endpoint remembers the cause of (a server that accepts clients forever keeps
/// this much, not one entry per client).
constexpr size_t kReleasedKept = 1024;

/// The address peers should dial: the bind address when it names one, else GDX_TCP_BIND_ADDR, else the interface
/// of the default route, else loopback.
std::string advertisedIp(const std::string& bind) {
  if (!bind.empty() && bind != "0.0.0.0") return bind;
  std::string ip = envString("GDX_TCP_BIND_ADDR", "");
  if (ip.empty()) ip = net::localAddressToward("8.8.8.8");
  return ip.empty() ? "127.0.0.1" : ip;
}

/// The address part of net::peerName()'s "ip:port".
std::string hostOf(const std::string& hostPort) {
  size_t colon = hostPort.rfind(':');
  std::string h = colon == std::string::npos ? hostPort : hostPort.substr(0, colon);
  if (h.size() > 1 && h.front() == '[') h = h.substr(1, h.size() - 2);
  return h;
}

}  // namespace

EndpointOptions EndpointOptions::fromEnv(int localGpu, int numCpus) {
  EndpointOptions o;
  o.localGpu = localGpu;
  o.numCpus = numCpus;
  o.transport = linkTransportFromEnv();
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

Endpoint::Impl::Impl(const EndpointOptions& o) : options(o) {
  if (options.numCpus < 1 || options.numCpus > 64)
    throw Error(ErrorCode::kInvalidArgument,
                "p2p endpoint: numCpus must be 1..64, not " + std::to_string(options.numCpus));
  if (options.localGpu < -1)
    throw Error(ErrorCode::kInvalidArgument,
                "p2p endpoint: localGpu must be -1 (none) or a GPU index, not " + std::to_string(options.localGpu));
  if (options.transport.empty()) options.transport = linkTransportFromEnv();
  if (options.transport != "tcp" && options.transport != "verbs")
    throw Error(ErrorCode::kInvalidArgument,
                "p2p endpoint: transport '" + options.transport + "' cannot connect two endpoints; use tcp or verbs");
  if (options.timeoutNs == 0) options.timeoutNs = defaultTimeoutNs();
  if (options.tcpSockets < 0 || options.tcpSockets > kMaxLinkSockets)
    throw Error(ErrorCode::kInvalidArgument, "p2p endpoint: tcpSockets must be 1..64 (0: GDX_TCP_SOCKETS), not " +
                                                 std::to_string(options.tcpSockets));
  if (options.tcpChunkBytes > kMaxLinkChunkBytes)
    throw Error(ErrorCode::kInvalidArgument, "p2p endpoint: tcpChunkBytes must be at most " +
                                                 std::to_string(kMaxLinkChunkBytes) + " (0: GDX_TCP_CHUNK), not " +
                                                 std::to_string(options.tcpChunkBytes));
  int want = options.port;
  if (want < 0) want = static_cast<int>(envInt("GDX_P2P_PORT", 19500)) + std::max(options.localGpu, 0);
  if (want > 65535)
    throw Error(ErrorCode::kInvalidArgument,
                "p2p endpoint: port " + std::to_string(want) + " (GDX_P2P_PORT + GPU) is past 65535");
  int err = 0;
  listener = net::listenAt(net::ipv4(options.bindAddress == "0.0.0.0" ? "" : options.bindAddress, want), &err);
  if (!listener.valid())
    throw Error(ErrorCode::kInvalidArgument,
                "p2p endpoint: cannot listen on " +
                    net::hostPort(options.bindAddress.empty() ? "*" : options.bindAddress, want) + ": " +
                    std::strerror(err) +
                    (err == EADDRINUSE ? " (another endpoint? set GDX_P2P_PORT or pass port 0)" : ""));
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  GDX_SYS_CHECK(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  ip = advertisedIp(options.bindAddress);
  pool = std::make_unique<ProgressPool>(options.numCpus);
  ipc = std::make_unique<IpcPeers>(options.localGpu, options.timeoutNs);
  GDX_INFO(who() << ": listening, transport " << options.transport << ", " << options.numCpus << " progress thread(s)");
}

Endpoint::Impl::~Impl() {
  stopping = true;
  if (passive.joinable()) passive.join();
  handshakes.stop();  // before the connections close: a handshake's thread may still adopt one
  pool->stop();       // no progress thread touches a connection after this
  std::map<uint64_t, std::shared_ptr<Connection>> closing;
  {
    std::lock_guard<std::mutex> lock(mutex);
    closing.swap(conns);
  }
  for (auto& c : closing) pool->remove(c.second.get());
  // The connections close here, while their transport threads may still wake the (stopped) pool: it outlives them.
  closing.clear();
  pool.reset();
}

std::string Endpoint::Impl::who() const {
  return "endpoint " + net::hostPort(ip, port) + " (GPU " + std::to_string(options.localGpu) + ")";
}

uint64_t Endpoint::Impl::deadlineNs() const {
  return nowNs() + options.timeoutNs;
}

uint64_t Endpoint::Impl::adopt(PairLink link) {
  reap();  // a server that accepts clients forever holds the live ones, not every one that ever came
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex);
    id = nextConn++;
  }
  const int thread = pool->threadFor(id);
  auto c = std::make_shared<Connection>(id, std::move(link), options.timeoutNs, pool->waker(thread));
  c->start();
  GDX_INFO(who() << ": " << c->name() << " up");
  {
    std::lock_guard<std::mutex> lock(mutex);
    conns[id] = c;
  }
  pool->add(thread, c);
  return id;
}

bool Endpoint::Impl::release(uint64_t connId, ErrorCode code, const std::string& why) {
  std::shared_ptr<Connection> c;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = conns.find(connId);
    if (it == conns.end()) return connId > 0 && connId < nextConn;  // released already
    c = std::move(it->second);
    conns.erase(it);
    for (auto a = byAddress.begin(); a != byAddress.end();) a = a->second == connId ? byAddress.erase(a) : std::next(a);
    released[connId] = c->failure().empty() ? why : c->failure();
    while (released.size() > kReleasedKept) released.erase(released.begin());
  }
  pool->remove(c.get());  // no progress thread runs it any more; a caller still driving it holds its own reference
  c->close(code, why);    // fails what waits on it, stops its transport's threads and says goodbye to the peer
  GDX_INFO(who() << ": " << c->name() << " released: " << c->failure());
  return true;
}

void Endpoint::Impl::reap() {
  std::vector<uint64_t> failed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& c : conns)
      if (!c.second->failure().empty()) failed.push_back(c.first);
  }
  for (uint64_t id : failed) release(id, ErrorCode::kPeerFailed, "failed");
}

bool Endpoint::Impl::acceptOne(net::Deadline waitUntil) {
  for (;;) {
    pollfd p{listener.get(), POLLIN, 0};
    int ms = net::msUntil(waitUntil, 100);
    if (ms == 0 || stopping) return false;
    int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno != EINTR) throw SystemError("poll (p2p listener)", errno, __FILE__, __LINE__);
    if (rc <= 0) continue;
    net::UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      throw SystemError("accept4 (p2p listener)", errno, __FILE__, __LINE__);
    }
    net::tuneSocket(fd.get());
    const std::string from = net::peerName(fd.get());
    // The handshake runs in a thread of its own: a client that never says Hello holds nobody but that thread, for
    // GDX_P2P_HELLO_MS at most, and gives its place up to a newcomer when all Handshakes::kMaxRunning are taken.
    if (!handshakes.start(std::move(fd), [this, from](net::UniqueFd own, const std::function<void()>& heard) {
          answer(std::move(own), from, heard);
        }))
      GDX_WARN(who() << ": refused " << from << ": " << Handshakes::kMaxRunning
                     << " handshakes are running and every one of their clients said hello");
    return true;
  }
}

void Endpoint::Impl::answer(net::UniqueFd fd, const std::string& from, const std::function<void()>& heard) {
  Arrival a;
  bool spoke = false;  // a socket that never said a well-formed Hello is no client: logged, not handed to accept()
  try {
    PairLink link =
        answerLink(std::move(fd), options.localGpu, options.transport, options.timeoutNs,
                   net::deadlineIn(options.timeoutNs), who() + ": accepting " + from, options.secret, {}, [&] {
                     spoke = true;
                     heard();
                   });
    a.client.ip = hostOf(link.peerIp);
    a.client.remoteGpu = link.peerGpu;
    a.client.connId = adopt(std::move(link));
  } catch (const Error& e) {
    a.code = e.code();
    a.why = e.what();
    GDX_WARN(e.what());
  } catch (const std::exception& e) {
    a.code = ErrorCode::kInternal;
    a.why = who() + ": accepting " + from + ": " + e.what();
    GDX_WARN(a.why);
  }
  if (a.code != ErrorCode::kOk && !spoke) return;
  {
    std::lock_guard<std::mutex> lock(acceptMutex);
    if (a.code == ErrorCode::kOk || !passive.joinable()) accepted.push_back(std::move(a));
  }
  acceptedCv.notify_all();
}

void Endpoint::Impl::passiveLoop() {
  while (!stopping) {
    reap();  // also while no client comes: the connections of those that left go within a slice
    try {
      acceptOne(net::deadlineIn(200 * 1000 * 1000));
    } catch (const Error& e) {
      GDX_WARN(who() << ": passive accept: " << e.what());
    }
  }
}

std::shared_ptr<Connection> Endpoint::Impl::connection(uint64_t connId, const char* op) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = conns.find(connId);
  auto gone = released.find(connId);
  if (it == conns.end() && gone != released.end())
    throw Error(ErrorCode::kPeerFailed,
                who() + ": " + op + ": connection " + std::to_string(connId) + " was released: " + gone->second);
  if (it == conns.end())
    throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": connection " + std::to_string(connId) +
                                                 " does not exist on this endpoint (" + std::to_string(conns.size()) +
                                                 " connection(s), ids from connect/accept)");
  return it->second;
}

// ---- Endpoint: connections ------------------------------------------------------------------------------------

Endpoint::Endpoint(int localGpu, int numCpus) : Endpoint(EndpointOptions::fromEnv(localGpu, numCpus)) {}
Endpoint::Endpoint(const EndpointOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Endpoint::~Endpoint() = default;

int Endpoint::port() const {
  return impl_->port;
}
std::string Endpoint::ip() const {
  return impl_->ip;
}
int Endpoint::localGpu() const {
  return impl_->options.localGpu;
}
std::string Endpoint::transport() const {
  return impl_->options.transport;
}
std::string Endpoint::connectionTransport(uint64_t connId) {
  return impl_->connection(connId, "connectionTransport")->transportDetail();
}

uint64_t Endpoint::connect(const std::string& ip, int remoteGpu, int port) {
  if (port < 0) port = static_cast<int>(envInt("GDX_P2P_PORT", 19500)) + std::max(remoteGpu, 0);
  const std::string target = net::hostPort(ip, port) + " (GPU " + std::to_string(remoteGpu) + ")";
  const std::string who = impl_->who() + ": connecting to " + target;
  if (port < 1 || port > 65535) throw Error(ErrorCode::kInvalidArgument, who + ": port out of range");
  net::Deadline deadline = net::deadlineIn(impl_->options.timeoutNs);
  std::string why;
  // A server that is not up yet refuses: retried with a growing pause (10 ms to 1 s), and said so every few seconds.
  net::UniqueFd fd = net::connectTo(net::HostPort{ip, port}, deadline, &why, net::ConnectRetry::backoff(who));
  if (!fd.valid())
    throw Error(ErrorCode::kTimeout, who + ": nobody accepted within GDX_TIMEOUT_MS (" +
                                         std::to_string(impl_->options.timeoutNs / 1000000) + " ms): " + why);
  net::tuneSocket(fd.get());
  PairLink link = dialLink(std::move(fd), impl_->options.localGpu, impl_->options.transport, impl_->options.timeoutNs,
                           deadline, who, impl_->options.secret, {},
                           TcpShape{static_cast<uint16_t>(impl_->options.tcpSockets), impl_->options.tcpChunkBytes});
  if (remoteGpu >= 0 && link.peerGpu != remoteGpu) GDX_WARN(who << ": the endpoint there serves GPU " << link.peerGpu);
  return impl_->adopt(std::move(link));
}

void Endpoint::close(uint64_t connId) {
  const std::string why = "closed by close(" + std::to_string(connId) + ") on this side";
  if (!impl_->release(connId, ErrorCode::kShutdown, why))
    throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": close: connection " + std::to_string(connId) +
                                                 " does not exist on this endpoint (ids from connect/accept)");
}

bool Endpoint::Impl::acceptUntil(uint64_t deadline, Accepted* out) {
  std::unique_lock<std::mutex> lock(acceptMutex);
  for (uint64_t now = nowNs(); accepted.empty() && now < deadline; now = nowNs()) {
    if (passive.joinable()) {
      acceptedCv.wait_for(lock, std::chrono::nanoseconds(deadline - now));
    } else {  // this thread takes the clients; their handshakes finish in threads of their own
      lock.unlock();
      acceptOne(std::min<uint64_t>(deadline, now + 5 * 1000 * 1000));
      lock.lock();
    }
  }
  if (accepted.empty()) return false;
  Arrival a = std::move(accepted.front());
  accepted.pop_front();
  if (a.code != ErrorCode::kOk) throw Error(a.code, a.why);
  *out = a.client;
  return true;
}

bool Endpoint::tryAccept(uint64_t waitMs, Accepted* out) {
  return impl_->acceptUntil(nowNs() + waitMs * 1000000, out);
}

Accepted Endpoint::accept() {
  Impl& d = *impl_;
  Accepted a;
  if (d.acceptUntil(d.deadlineNs(), &a)) return a;
  throw Error(ErrorCode::kTimeout, d.who() + ": accept: no client connected within GDX_TIMEOUT_MS (" +
                                       std::to_string(d.options.timeoutNs / 1000000) + " ms)");
}

void Endpoint::startPassiveAccept() {
  std::lock_guard<std::mutex> lock(impl_->acceptMutex);
  if (impl_->passive.joinable()) return;
  impl_->passive = std::thread([this] { impl_->passiveLoop(); });
}

std::string Endpoint::metadata() const {
  return encodeMetadata(EndpointAddress{impl_->ip, impl_->port, impl_->options.localGpu});
}

uint64_t Endpoint::addRemoteEndpoint(const std::string& metadata) {
  EndpointAddress a;
  const std::string bad = decodeMetadata(metadata, &a);
  if (!bad.empty()) throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": addRemoteEndpoint: " + bad);
  const std::string key = net::hostPort(a.ip, a.port) + "/" + std::to_string(a.gpu);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->byAddress.find(key);
    if (it != impl_->byAddress.end() && impl_->conns.count(it->second) && impl_->conns[it->second]->failure().empty())
      return it->second;
  }
  uint64_t id = connect(a.ip, a.gpu, a.port);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->byAddress[key] = id;
  return id;
}

}  // namespace gdx::p2p
