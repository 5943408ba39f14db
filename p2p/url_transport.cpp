// UrlTransport and RegisteredMemory over one Connection. Registered memory lives in a process-wide registry under
// an id; a peer that writes into it names the id (its window), and this side's connection registers it with the
// transport on first use (WindowResolver). Destroying a RegisteredMemory forgets it on every live connection.
#include "gdx/p2p/url_transport.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

#if defined(GDX_HAVE_VERBS)
#include <infiniband/verbs.h>
#endif

#include "gdx/config.hpp"
#include "gdx/detail/clock.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/progress_pool.hpp"

namespace gdx::p2p {
namespace {

/// Every live RegisteredMemory of the process, and every live UrlTransport connection (to forget memory on).
struct Registry {
  std::mutex mutex;
  std::map<uint32_t, MemoryRegion> regions;
  std::map<uint32_t, uint64_t> secrets;  ///< each region's key secret (64 random bits), checked on a key request
  std::set<Connection*> conns;
  uint32_t next = 1;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

Status statusOf(ErrorCode c) {
  switch (c) {
    case ErrorCode::kOk: return Status::kOk;
    case ErrorCode::kTimeout: return Status::kTimeout;
    case ErrorCode::kPeerFailed: return Status::kPeerFailed;
    case ErrorCode::kInvalidArgument: return Status::kInvalidArgument;
    case ErrorCode::kShutdown: return Status::kShutdown;
    default: return Status::kProxyError;
  }
}

std::future<Status> ready(Status s) {
  std::promise<Status> p;
  p.set_value(s);
  return p.get_future();
}

}  // namespace

// ---- RegisteredMemory -----------------------------------------------------------------------------------------

RegisteredMemory::RegisteredMemory(const void* buf, size_t len, int cudaDev) : buf_(buf), len_(len), device_(cudaDev) {
  if (!buf || len == 0) throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory: null buffer or zero length");
  MemoryRegion r;
  r.base = static_cast<char*>(const_cast<void*>(buf));
  r.bytes = len;
  r.kind = pointerKind(buf);
  if (cudaDev >= 0 && r.kind != MemoryKind::kCuda)
    GDX_INFO("RegisteredMemory: " << len << " bytes for GPU " << cudaDev << " are host memory; registered as such");
  Registry& g = Registry::get();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.next >= kGrantWindowBase) throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory: out of ids");
  id_ = r.window = g.next++;
  g.regions[id_] = r;
  g.secrets[id_] = randomU64();
}

RegisteredMemory::~RegisteredMemory() {
  Registry& g = Registry::get();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.regions.erase(id_);
  g.secrets.erase(id_);
  for (Connection* c : g.conns) c->forget(id_);
}

bool RegisteredMemory::contains(const void* buf, size_t len) const {
  const char* p = static_cast<const char*>(buf);
  const char* b = static_cast<const char*>(buf_);
  return p >= b && p <= b + len_ && len <= static_cast<size_t>(b + len_ - p);
}

RegisteredMemory::View RegisteredMemory::view(size_t offset, size_t length) const {
  if (offset > len_ || length > len_ - offset)
    throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory " + std::to_string(id_) + ": a view of " +
                                                 std::to_string(length) + " bytes at " + std::to_string(offset) +
                                                 " does not fit its " + std::to_string(len_) + " bytes");
  return View(this, static_cast<const char*>(buf_) + offset, length);
}

RegisteredMemory::View RegisteredMemory::viewAt(const void* buf, size_t length) const {
  if (!contains(buf, length))
    throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory " + std::to_string(id_) + ": a view of " +
                                                 std::to_string(length) + " bytes outside its " + std::to_string(len_) +
                                                 " bytes");
  return View(this, buf, length);
}

std::string RegisteredMemory::remoteKey() const {
  uint64_t secret = 0;
  {
    Registry& g = Registry::get();
    std::lock_guard<std::mutex> lock(g.mutex);
    secret = g.secrets[id_];
  }
  char key[128];
  std::snprintf(key, sizeof key, "gdxmem:%u:%llx:%zu:%016llx", id_,
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buf_)), len_,
                static_cast<unsigned long long>(secret));
  return key;
}

// ---- UrlTransport ---------------------------------------------------------------------------------------------

struct UrlTransport::Impl {
  int device = -1;
  std::string transport;
  uint64_t timeoutNs = 0;
  net::UniqueFd listener;
  std::string url;
  std::unique_ptr<ProgressPool> pool;
  std::shared_ptr<Connection> conn;
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t arrived = 0, promised = 0;  ///< notified writes arrived, and waitForWrite() calls made

  // The order of Endpoint::Impl::~Impl: no RegisteredMemory reaches the connection once it left the registry, no
  // progress thread runs it once the pool stopped, and the connection closes while the stopped pool still lives:
  // its transport threads hand over what arrives until the end (the peer's goodbye, acknowledgements, notified
  // writes) and wake the pool's workers for it.
  ~Impl() {
    if (conn) {
      Registry& g = Registry::get();
      std::lock_guard<std::mutex> lock(g.mutex);
      g.conns.erase(conn.get());
    }
    if (pool) {
      pool->stop();
      pool->remove(conn.get());
    }
    conn.reset();
    pool.reset();
  }
};

UrlTransport::UrlTransport(int cudaDev, const std::string& transport) : impl_(std::make_unique<Impl>()) {
  impl_->device = cudaDev;
  impl_->transport = transport.empty() ? linkTransportFromEnv() : transport;
  impl_->timeoutNs = defaultTimeoutNs();
}

UrlTransport::~UrlTransport() = default;

bool UrlTransport::supported(const std::string& transport) {
  const std::string t = transport.empty() ? linkTransportFromEnv() : transport;
  if (t == "tcp") return true;
#if defined(GDX_HAVE_VERBS)
  if (t == "verbs") {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list) ibv_free_device_list(list);
    return n > 0;
  }
#endif
  return false;
}

std::string UrlTransport::bind() {
  if (impl_->listener.valid()) return impl_->url;
  std::string ip = envString("GDX_TCP_BIND_ADDR", "");
  if (ip.empty()) ip = net::localAddressToward("8.8.8.8");
  if (ip.empty()) ip = "127.0.0.1";
  int port = 0;
  impl_->listener = net::listenOn(ip, &port);
  impl_->url = impl_->transport + "://" + net::hostPort(ip, port);
  return impl_->url;
}

bool UrlTransport::connected() const {
  return impl_->conn && impl_->conn->failure().empty();
}

void UrlTransport::connect(const std::string& peerUrl) {
  Impl& d = *impl_;
  const std::string who =
      "UrlTransport " + (d.url.empty() ? std::string("(unbound)") : d.url) + ": connect(" + peerUrl + ")";
  if (!d.listener.valid()) throw Error(ErrorCode::kInvalidArgument, who + ": call bind() first");
  if (d.conn) throw Error(ErrorCode::kInvalidArgument, who + ": already connected");
  const size_t sep = peerUrl.find("://");
  if (sep == std::string::npos)
    throw Error(ErrorCode::kInvalidArgument, who + ": not a URL of bind() (scheme://host:port)");
  if (peerUrl.substr(0, sep) != d.transport)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": the peer uses transport '" + peerUrl.substr(0, sep) + "', this side '" + d.transport + "'");
  if (peerUrl == d.url) throw Error(ErrorCode::kInvalidArgument, who + ": that is this transport's own URL");
  net::HostPort hp = net::HostPort::parse(peerUrl.substr(sep + 3));
  const net::Deadline deadline = net::deadlineIn(d.timeoutNs);
  PairLink link;
  if (d.url < peerUrl) {  // the smaller URL dials, the other accepts: both sides agree without talking
    std::string why;
    net::UniqueFd fd = net::connectTo(hp, deadline, &why, net::ConnectRetry::backoff(who));
    if (!fd.valid()) throw Error(ErrorCode::kTimeout, who + ": the peer did not answer within GDX_TIMEOUT_MS: " + why);
    net::tuneSocket(fd.get());
    link = dialLink(std::move(fd), d.device, d.transport, d.timeoutNs, deadline, who);
  } else {
    for (;;) {
      pollfd p{d.listener.get(), POLLIN, 0};
      int ms = net::msUntil(deadline, 100);
      if (ms == 0) throw Error(ErrorCode::kTimeout, who + ": the peer did not connect within GDX_TIMEOUT_MS");
      if (::poll(&p, 1, ms) <= 0) continue;
      net::UniqueFd fd(::accept4(d.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) continue;
      net::tuneSocket(fd.get());
      link = answerLink(std::move(fd), d.device, d.transport, d.timeoutNs, deadline, who);
      break;
    }
  }
  d.pool = std::make_unique<ProgressPool>(1);
  auto c = std::make_shared<Connection>(1, std::move(link), d.timeoutNs, d.pool->waker(0));
  c->setResolver([](uint32_t window, uint64_t secret, MemoryRegion* out) {
    Registry& g = Registry::get();
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.regions.find(window);
    auto known = g.secrets.find(window);
    // Only the holder of the key (its 64-bit secret) may have the memory registered for it.
    if (it == g.regions.end() || known == g.secrets.end() || known->second != secret) return false;
    *out = it->second;
    return true;
  });
  c->setNotifyHandler([&d] {
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      ++d.arrived;
    }
    d.cv.notify_all();
  });
  c->start();
  {
    Registry& g = Registry::get();
    std::lock_guard<std::mutex> lock(g.mutex);
    g.conns.insert(c.get());
  }
  d.conn = c;
  d.pool->add(0, c);
}

std::future<Status> UrlTransport::write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify) {
  Impl& d = *impl_;
  const std::string who = "UrlTransport " + d.url + ": write of " + std::to_string(local.size()) + " bytes";
  auto refuse = [&](const std::string& why) {
    GDX_WARN(who << ": " << why);
    return ready(Status::kInvalidArgument);
  };
  if (!d.conn) return refuse("not connected");
  if (local.size() == 0) return refuse("an empty view");
  unsigned id = 0;
  unsigned long long base = 0;
  size_t len = 0;
  unsigned long long secret = 0;
  int used = 0;
  if (std::sscanf(remote.accessKey.c_str(), "gdxmem:%u:%llx:%zu:%llx%n", &id, &base, &len, &secret, &used) != 4 ||
      used != static_cast<int>(remote.accessKey.size()) || id == 0 || id >= kGrantWindowBase)
    return refuse("the access key '" + remote.accessKey + "' is not a RegisteredMemory::remoteKey()");
  const uintptr_t p = reinterpret_cast<uintptr_t>(remote.ptr);
  if (p < base || p - base > len || local.size() > len - (p - base))
    return refuse("the remote range lies outside the peer's registered " + std::to_string(len) + " bytes");
  MemoryRegion r;
  {
    Registry& g = Registry::get();
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.regions.find(local->id());
    if (it == g.regions.end()) return refuse("the local memory is no longer registered");
    r = it->second;
  }
  Piece src{r, static_cast<uint64_t>(static_cast<const char*>(local.data()) - r.base), local.size()};
  RemotePiece dst{id, p - base, local.size(), secret};
  auto t = std::make_shared<Transfer>(who + " on " + d.conn->name(), 2, nowNs() + d.timeoutNs);
  d.conn->write(t, {src}, {dst}, notify);
  return std::async(std::launch::deferred, [t] {
    try {
      t->wait(t->deadlineNs() + 1000000000ull);
      return Status::kOk;
    } catch (const Error& e) {
      GDX_WARN(e.what());
      return statusOf(e.code());
    }
  });
}

std::future<Status> UrlTransport::waitForWrite() {
  Impl* d = impl_.get();
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(d->mutex);
    ticket = ++d->promised;
  }
  const uint64_t deadline = nowNs() + d->timeoutNs;
  return std::async(std::launch::deferred, [d, ticket, deadline] {
    std::unique_lock<std::mutex> lock(d->mutex);
    while (d->arrived < ticket) {
      if (d->conn && !d->conn->failure().empty()) return Status::kPeerFailed;
      uint64_t now = nowNs();
      if (now >= deadline) {
        GDX_WARN("UrlTransport " << d->url << ": waitForWrite #" << ticket << ": " << d->arrived
                                 << " notified write(s) arrived within GDX_TIMEOUT_MS");
        return Status::kTimeout;
      }
      d->cv.wait_for(lock, std::chrono::nanoseconds(std::min<uint64_t>(deadline - now, 100000000)));
    }
    return Status::kOk;
  });
}

}  // namespace gdx::p2p
