// UrlTransport over one Connection, made by a thread of the transport (the linker) so that connect() need not wait
// for the peer: writes made while it comes are kept (pending) and posted, in order, once it is up; failed with the
// reason when it cannot be made. Waits for notified writes are tickets, resolved when the n-th notified write
// arrived, the connection failed, or the transport is destroyed; their deadline is the caller's (the futures here, an
// event base in RdmaTransport). Registered memory lives in the MemoryRegistry (memory_registry.hpp).
#include "gdx/p2p/url_transport.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#if defined(GDX_HAVE_VERBS)
#include <infiniband/verbs.h>
#endif

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/memory_registry.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/progress_pool.hpp"

namespace gdx::p2p {
namespace {

/// How long one connect attempt or accept poll of the linker lasts before it looks whether the transport is going.
constexpr uint64_t kLinkSliceNs = 100 * 1000 * 1000;
/// How much longer than GDX_TIMEOUT_MS a future waits for the transport to fail an operation by name.
constexpr uint64_t kFutureGraceNs = 1000ull * 1000 * 1000;

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

/// How a finished write ended; a failure is logged (at INFO when the transport was being destroyed, else WARN).
Status outcome(const Transfer& t) {
  try {
    t.poll();
    return Status::kOk;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kShutdown)
      GDX_INFO(e.what());
    else
      GDX_WARN(e.what());
    return statusOf(e.code());
  }
}

/// A Done that resolves the future beside it.
std::pair<UrlTransport::Done, std::future<Status>> promised() {
  auto p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  return {[p](Status s) { p->set_value(s); }, std::move(f)};
}

/// `f`, or kTimeout (logged, naming `what`) when it is not resolved by `deadlineNs`. Deferred: get() waits.
std::future<Status> bounded(std::future<Status> f, uint64_t deadlineNs, std::string what) {
  return std::async(std::launch::deferred, [f = std::move(f), deadlineNs, what]() mutable {
    const uint64_t now = nowNs();
    if (f.wait_for(std::chrono::nanoseconds(deadlineNs > now ? deadlineNs - now : 0)) != std::future_status::ready) {
      GDX_WARN(what << ": not resolved within GDX_TIMEOUT_MS");
      return Status::kTimeout;
    }
    return f.get();
  });
}

}  // namespace

/// A write made while the connection was still coming.
struct PendingWrite {
  std::shared_ptr<Transfer> t;
  Piece src;
  RemotePiece dst;
  bool notify = false;
};

struct UrlTransport::Impl {
  enum class Link { kNone, kConnecting, kUp, kFailed };

  int device = -1;
  std::string transport;
  uint64_t timeoutNs = 0;
  net::UniqueFd listener;
  std::string url;
  std::thread linker;  ///< makes the connection (startConnect); joined before a new attempt and at destruction
  std::atomic<bool> stopping{false};
  std::unique_ptr<ProgressPool> pool;  ///< made by the linker, with the connection

  mutable std::mutex mutex;  ///< guards what follows; never held while calling into a connection or a Done
  std::condition_variable linkCv;
  Link link = Link::kNone;
  std::string peerUrl;
  std::shared_ptr<Connection> conn;  ///< set once the pending writes were posted on it
  /// The connection once it is up, set before the writes that waited for it are posted: one of those may complete
  /// before `conn` is set, and the link is connected from its first write on.
  std::shared_ptr<Connection> established;
  ErrorCode failCode = ErrorCode::kOk;  ///< why the connection could not be made (kFailed)
  std::string failWhy;
  std::vector<PendingWrite> pending;
  std::unordered_map<const Transfer*, std::weak_ptr<Transfer>> inFlight;  ///< writes not finished yet
  /// Notified writes that arrived while no wait was live: the next waits take them at once.
  uint64_t unclaimed = 0;
  uint64_t tickets = 0;  ///< waits asked for (names them in messages; orders them)
  struct Waiter {
    Done done;
    uint64_t deadlineNs = 0;  ///< past it the wait has been reported as timed out: it takes no arrival
  };
  std::map<uint64_t, Waiter> waiters;  ///< by ticket, oldest first

  /// "UrlTransport tcp://10.0.0.1:4000 (peer tcp://10.0.0.2:4100)", the start of its messages.
  std::string who() const {
    std::lock_guard<std::mutex> lock(mutex);
    return "UrlTransport " + (url.empty() ? std::string("(unbound)") : url) +
           (peerUrl.empty() ? std::string() : " (peer " + peerUrl + ")");
  }

  void establish(const net::HostPort& hp, const std::string& peer, const std::string& who);
  net::UniqueFd dial(const net::HostPort& hp, net::Deadline deadline, const std::string& who);
  net::UniqueFd acceptOne(net::Deadline deadline, const std::string& who);
  void publish(const std::shared_ptr<Connection>& c);
  void failLink(ErrorCode code, const std::string& why);
  /// Queues a wait that takes the next notified write no earlier wait takes; it stops counting at `deadlineNs`.
  uint64_t addWaiter(Done done, uint64_t deadlineNs);
  void notified();
  void connectionFailed();
  ~Impl();
};

// The order of Endpoint::Impl::~Impl: no RegisteredMemory reaches the connection once it left the registry, no
// progress thread runs it once the pool stopped, and the connection closes while the stopped pool still lives: its
// transport threads hand over what arrives until the end (the peer's goodbye, acknowledgements, notified writes) and
// wake the pool's workers for it. What still waits is ended first, with kShutdown.
UrlTransport::Impl::~Impl() {
  stopping = true;
  if (linker.joinable()) linker.join();  // a connect or a handshake gives up within kLinkSliceNs
  if (conn) MemoryRegistry::get().removeConnection(conn.get());
  if (pool) {
    pool->stop();
    pool->remove(conn.get());
  }
  std::unordered_map<const Transfer*, std::weak_ptr<Transfer>> flying;
  std::map<uint64_t, Waiter> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex);
    flying.swap(inFlight);
    waiting.swap(waiters);
  }
  for (auto& f : flying)
    if (auto t = f.second.lock()) t->fail(ErrorCode::kShutdown, "the transport was destroyed");
  for (auto& w : waiting) w.second.done(Status::kShutdown);
  conn.reset();
  established.reset();
  pool.reset();
}

net::UniqueFd UrlTransport::Impl::dial(const net::HostPort& hp, net::Deadline deadline, const std::string& who) {
  std::string why = "nobody answered";
  for (;;) {
    if (stopping) throw Error(ErrorCode::kShutdown, who + ": the transport was destroyed while connecting");
    const uint64_t now = nowNs();
    if (now >= deadline)
      throw Error(ErrorCode::kTimeout, who + ": the peer did not answer within GDX_TIMEOUT_MS: " + why);
    net::UniqueFd fd = net::connectTo(hp, std::min<uint64_t>(deadline, now + kLinkSliceNs), &why);
    if (fd.valid()) return fd;
    // An error connectTo does not retry (no route yet, say) comes back at once: the peer may still come.
    if (nowNs() - now < kLinkSliceNs / 10) std::this_thread::sleep_for(std::chrono::nanoseconds(kLinkSliceNs / 10));
  }
}

net::UniqueFd UrlTransport::Impl::acceptOne(net::Deadline deadline, const std::string& who) {
  for (;;) {
    if (stopping) throw Error(ErrorCode::kShutdown, who + ": the transport was destroyed while connecting");
    pollfd p{listener.get(), POLLIN, 0};
    const int ms = net::msUntil(deadline, static_cast<int>(kLinkSliceNs / 1000000));
    if (ms == 0) throw Error(ErrorCode::kTimeout, who + ": the peer did not connect within GDX_TIMEOUT_MS");
    if (::poll(&p, 1, ms) <= 0) continue;
    net::UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) return fd;
  }
}

void UrlTransport::Impl::establish(const net::HostPort& hp, const std::string& peer, const std::string& who) {
  try {
    const net::Deadline deadline = net::deadlineIn(timeoutNs);
    const net::AbortCheck destroyed = [this] { return stopping.load(); };
    PairLink pair;
    if (url < peer) {  // the smaller URL dials, the other accepts: both sides agree without talking
      net::UniqueFd fd = dial(hp, deadline, who);
      net::tuneSocket(fd.get());
      pair = dialLink(std::move(fd), device, transport, timeoutNs, deadline, who, "", destroyed);
    } else {
      net::UniqueFd fd = acceptOne(deadline, who);
      net::tuneSocket(fd.get());
      pair = answerLink(std::move(fd), device, transport, timeoutNs, deadline, who, "", destroyed);
    }
    pool = std::make_unique<ProgressPool>(1);
    auto c = std::make_shared<Connection>(1, std::move(pair), timeoutNs, pool->waker(0));
    c->setResolver([](uint32_t window, uint64_t secret, MemoryRegion* out) {
      return MemoryRegistry::get().resolve(window, secret, out);
    });
    c->setNotifyHandler([this] { notified(); });
    c->setFailureHandler([this] { connectionFailed(); });
    c->start();
    MemoryRegistry::get().addConnection(c.get());
    pool->add(0, c);
    publish(c);
    GDX_INFO(who << ": " << c->name() << " up");
  } catch (const Error& e) {
    failLink(e.code(), e.message());
  } catch (const std::exception& e) {  // a thread or memory that could not be had: this thread must not end by it
    failLink(ErrorCode::kInternal, who + ": " + e.what());
  }
}

void UrlTransport::Impl::publish(const std::shared_ptr<Connection>& c) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    established = c;
  }
  for (;;) {  // writes made while earlier ones are posted queue behind them: every write leaves in the order made
    std::vector<PendingWrite> batch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (pending.empty()) {
        conn = c;
        link = Link::kUp;
        break;
      }
      batch.swap(pending);
    }
    for (PendingWrite& w : batch) {
      // Memory destroyed while the write waited for the connection was forgotten on no connection (there was none):
      // its write fails here instead of reading freed memory. Destroyed from now on, the connection forgets it.
      MemoryRegion still;
      if (!MemoryRegistry::get().find(w.src.region.window, &still))
        w.t->fail(ErrorCode::kInvalidArgument, "its memory (id " + std::to_string(w.src.region.window) +
                                                   ") was destroyed before the connection came up");
      else
        c->write(w.t, {w.src}, {w.dst}, w.notify);
    }
  }
  linkCv.notify_all();
}

void UrlTransport::Impl::failLink(ErrorCode code, const std::string& why) {
  std::vector<PendingWrite> batch;
  std::map<uint64_t, Waiter> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex);
    link = Link::kFailed;
    failCode = code;
    failWhy = why;
    batch.swap(pending);
    waiting.swap(waiters);
  }
  linkCv.notify_all();
  if (code == ErrorCode::kShutdown)
    GDX_INFO(why);
  else
    GDX_WARN(why);
  for (PendingWrite& w : batch) w.t->fail(code, "no connection: " + why);
  for (auto& w : waiting) w.second.done(statusOf(code));
}

uint64_t UrlTransport::Impl::addWaiter(Done done, uint64_t deadlineNs) {
  Status s;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex);
    ticket = ++tickets;
    if (unclaimed > 0) {
      --unclaimed;
      s = Status::kOk;
    } else if (link == Link::kFailed)
      s = statusOf(failCode);
    else if (conn && !conn->failure().empty())
      s = Status::kPeerFailed;
    else {
      waiters.emplace(ticket, Waiter{std::move(done), deadlineNs});
      return ticket;
    }
  }
  done(s);
  return ticket;
}

void UrlTransport::Impl::notified() {
  std::vector<Done> expired;
  Done ready;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const uint64_t now = nowNs();
    // A wait that timed out was reported as such: the write goes to the oldest wait still counting, or to the next.
    while (!waiters.empty() && !ready) {
      Waiter w = std::move(waiters.begin()->second);
      waiters.erase(waiters.begin());
      if (w.deadlineNs <= now)
        expired.push_back(std::move(w.done));
      else
        ready = std::move(w.done);
    }
    if (!ready) ++unclaimed;
  }
  for (Done& d : expired) d(Status::kTimeout);
  if (ready) ready(Status::kOk);
}

void UrlTransport::Impl::connectionFailed() {
  std::map<uint64_t, Waiter> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex);
    waiting.swap(waiters);
  }
  for (auto& w : waiting) w.second.done(Status::kPeerFailed);
}

// ---- UrlTransport ---------------------------------------------------------------------------------------------

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
  Impl& d = *impl_;
  if (d.listener.valid()) return d.url;
  std::string ip = envString("GDX_TCP_BIND_ADDR", "");
  if (ip.empty()) ip = net::localAddressToward("8.8.8.8");
  if (ip.empty()) ip = "127.0.0.1";
  int port = 0;
  d.listener = net::listenOn(ip, &port);
  std::lock_guard<std::mutex> lock(d.mutex);
  d.url = d.transport + "://" + net::hostPort(ip, port);
  return d.url;
}

bool UrlTransport::connected() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& d = *impl_;
  return (d.link == Impl::Link::kUp || d.link == Impl::Link::kConnecting) && d.established &&
         d.established->failure().empty();
}

void UrlTransport::startConnect(const std::string& peerUrl) {
  Impl& d = *impl_;
  const std::string who =
      "UrlTransport " + (d.url.empty() ? std::string("(unbound)") : d.url) + ": connect(" + peerUrl + ")";
  if (!d.listener.valid()) throw Error(ErrorCode::kInvalidArgument, who + ": call bind() first");
  const size_t sep = peerUrl.find("://");
  if (sep == std::string::npos)
    throw Error(ErrorCode::kInvalidArgument, who + ": not a URL of bind() (scheme://host:port)");
  if (peerUrl.substr(0, sep) != d.transport)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": the peer uses transport '" + peerUrl.substr(0, sep) + "', this side '" + d.transport + "'");
  if (peerUrl == d.url) throw Error(ErrorCode::kInvalidArgument, who + ": that is this transport's own URL");
  net::HostPort hp;
  try {
    hp = net::HostPort::parse(peerUrl.substr(sep + 3));
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, who + ": " + e.message());
  }
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.link == Impl::Link::kConnecting || d.link == Impl::Link::kUp)
      throw Error(ErrorCode::kInvalidArgument,
                  who + ": already " + (d.link == Impl::Link::kUp ? "connected" : "connecting") + " to " + d.peerUrl);
  }
  if (d.linker.joinable()) d.linker.join();  // the attempt that failed
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.link = Impl::Link::kConnecting;
    d.peerUrl = peerUrl;
  }
  d.linker = std::thread([&d, hp, peerUrl, who] { d.establish(hp, peerUrl, who); });
}

void UrlTransport::connect(const std::string& peerUrl) {
  startConnect(peerUrl);
  Impl& d = *impl_;
  std::unique_lock<std::mutex> lock(d.mutex);
  d.linkCv.wait(lock, [&] { return d.link != Impl::Link::kConnecting; });  // the linker ends by its deadline
  if (d.link == Impl::Link::kFailed) throw Error(d.failCode, d.failWhy);
}

void UrlTransport::write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify, Done done) {
  Impl& d = *impl_;
  const std::string what = d.who() + ": write of " + std::to_string(local.size()) + " bytes";
  auto refuse = [&](const std::string& why) {
    GDX_WARN(what << ": " << why);
    done(Status::kInvalidArgument);
  };
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
  if (!MemoryRegistry::get().find(local.memoryId(), &r))
    return refuse("the local memory (RegisteredMemory " + std::to_string(local.memoryId()) +
                  ") is no longer registered");
  const Piece src{r, static_cast<uint64_t>(static_cast<const char*>(local.data()) - r.base), local.size()};
  const RemotePiece dst{id, p - base, local.size(), secret};
  auto t = std::make_shared<Transfer>(what, 2, nowNs() + d.timeoutNs);
  Impl* dp = &d;
  t->setOnFinish([dp, done = std::move(done)](const Transfer& finished) {
    const Status s = outcome(finished);
    {
      std::lock_guard<std::mutex> lock(dp->mutex);
      dp->inFlight.erase(&finished);
    }
    done(s);
  });
  std::shared_ptr<Connection> c;
  ErrorCode code = ErrorCode::kOk;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    switch (d.link) {
      case Impl::Link::kNone:
        code = ErrorCode::kInvalidArgument;
        why = "not connected (call connect() first)";
        break;
      case Impl::Link::kFailed:
        code = d.failCode;
        why = "no connection: " + d.failWhy;
        break;
      case Impl::Link::kConnecting:
        d.inFlight.emplace(t.get(), t);
        d.pending.push_back(PendingWrite{t, src, dst, notify});
        return;
      case Impl::Link::kUp:
        d.inFlight.emplace(t.get(), t);
        c = d.conn;
        break;
    }
  }
  if (!c) return t->fail(code, why);
  c->write(t, {src}, {dst}, notify);
}

std::future<Status> UrlTransport::write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify) {
  const uint64_t deadline = nowNs() + impl_->timeoutNs + kFutureGraceNs;  // the transport fails it first, by name
  auto p = promised();
  write(local, remote, notify, std::move(p.first));
  return bounded(std::move(p.second), deadline, impl_->who() + ": write of " + std::to_string(local.size()) + " bytes");
}

uint64_t UrlTransport::waitForWrite(Done done) {
  return impl_->addWaiter(std::move(done), nowNs() + impl_->timeoutNs);
}

bool UrlTransport::expireWait(uint64_t ticket) {
  Done done;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->waiters.find(ticket);
    if (it == impl_->waiters.end()) return false;
    done = std::move(it->second.done);
    impl_->waiters.erase(it);
  }
  done(Status::kTimeout);
  return true;
}

std::future<Status> UrlTransport::waitForWrite() {
  const uint64_t deadline = nowNs() + impl_->timeoutNs;
  auto p = promised();
  const uint64_t ticket = impl_->addWaiter(std::move(p.first), deadline);
  return bounded(std::move(p.second), deadline,
                 impl_->who() + ": waitForWrite #" + std::to_string(ticket) + " (no notified write arrived for it)");
}

}  // namespace gdx::p2p
