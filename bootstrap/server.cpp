#include "bootstrap/server.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "bootstrap/protocol.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "sockets/socket.hpp"

namespace gdx::bootstrap {

using net::Deadline;
using net::deadlineIn;
using net::hostPort;
using net::SockAddr;
using net::UniqueFd;

namespace {

constexpr size_t kReadChunk = 256 << 10;
// How long a refused connection may take to read its refusal and close before the server drops it.
constexpr uint64_t kRefusalLingerNs = 2ull * 1000 * 1000 * 1000;
// After an abort, how long the server keeps the connections open so that every rank reads the reason.
constexpr uint64_t kAbortLingerCapNs = 5ull * 1000 * 1000 * 1000;

}  // namespace

// The server's per-connection state, named (not in the anonymous namespace) because RendezvousServer::Impl, a class
// with linkage, holds it.
namespace server_state {

struct OutChunk {
  std::shared_ptr<const std::string> data;  // shared: one allGather result goes to every rank uncopied
  size_t offset = 0;
};

struct Conn {
  UniqueFd fd;
  std::string peer;  // remote address, for log lines
  std::string in;    // bytes received, not yet parsed into frames
  std::deque<OutChunk> out;
  int rank = -1;          // set once the hello is accepted
  bool goodbye = false;   // the rank left cleanly; its EOF is expected
  bool draining = false;  // refused or aborted: flush what is queued, shut the write side, discard input
  bool writeShut = false;
  bool dead = false;
  Deadline deadline = 0;  // before the hello: the hello must arrive by then; draining: closed by then
};

}  // namespace server_state

using server_state::Conn;
using server_state::OutChunk;

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

struct RendezvousServer::Impl {
  enum class Phase { kJoining, kRunning, kAborted };

  BootstrapConfig cfg;
  std::string where;  // master address:port, for messages
  uint64_t timeoutMs = 0;
  UniqueFd listener;
  net::WakePipe wake;  // the destructor wakes poll() instead of waiting for its timeout
  std::thread thread;
  std::atomic<bool> stopRequested{false};
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;  // under mu

  // Everything below is touched by the server thread only.
  Phase phase = Phase::kJoining;
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<Conn*> byRank;
  std::vector<char> hasJoined;
  std::vector<std::string> refusals;  // per rank: why the last connection claiming it was refused (empty: none)
  std::vector<std::string> hostnames;
  std::vector<char> departed;
  int joinedCount = 0;
  int departedCount = 0;
  Deadline joinDeadline = 0;
  Deadline lingerDeadline = 0;
  uint64_t nextSeq = 1;
  std::vector<std::string> roundBlobs;
  std::vector<char> submitted;
  int roundCount = 0;
  Deadline roundDeadline = 0;
  Deadline progressFor = 0;   // the deadline of the wait the "waiting for ranks ..." lines are about
  uint64_t progressStep = 0;  // how many of them were logged for it

  explicit Impl(const BootstrapConfig& c) : cfg(c) {
    where = hostPort(cfg.masterAddr, cfg.masterPort);
    timeoutMs = cfg.timeoutNs / 1000000;
    size_t n = static_cast<size_t>(cfg.worldSize);
    byRank.assign(n, nullptr);
    hasJoined.assign(n, 0);
    refusals.assign(n, std::string());
    hostnames.assign(n, "");
    departed.assign(n, 0);
    roundBlobs.assign(n, "");
    submitted.assign(n, 0);
    joinDeadline = deadlineIn(cfg.timeoutNs);
  }

  void listen() {
    std::string err;
    std::vector<SockAddr> addrs = net::resolve(cfg.masterAddr, cfg.masterPort, true, &err);
    if (addrs.empty()) throw Error(ErrorCode::kInvalidArgument, "rendezvous server: " + err);
    int lastErr = 0;
    for (const SockAddr& a : addrs) {
      if (tryBind(a, &lastErr)) return;
    }
    if (lastErr == EADDRNOTAVAIL) {
      // MASTER_ADDR names this host by an address it does not own (NAT, a DNS alias): listen everywhere.
      GDX_WARN("rendezvous server: " << where << " is not a local address; listening on all interfaces");
      if (tryBind(net::ipv4("", cfg.masterPort), &lastErr)) return;
    }
    throw SystemError("bind(" + where + ") for the rendezvous server", lastErr, __FILE__, __LINE__);
  }

  bool tryBind(const SockAddr& a, int* lastErr) {
    listener = net::listenAt(a, lastErr);
    return listener.valid();
  }

  // ---- the loop -------------------------------------------------------------------------------------------

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      GDX_ERROR("rendezvous server at " << where << " failed: " << e.what());
    }
    conns.clear();
    listener.reset();
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake.fd(), POLLIN, 0});
      if (listener.valid()) fds.push_back({listener.get(), POLLIN, 0});
      size_t firstConn = fds.size();
      for (auto& c : conns) {
        short ev = POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        fds.push_back({c->fd.get(), ev, 0});
      }
      int r = ::poll(fds.data(), fds.size(), net::msUntil(nextDeadline(), 1000));
      if (r < 0) {
        if (errno == EINTR) continue;
        GDX_SYS_CHECK(r >= 0);
      }
      if (stopRequested.load()) return;
      if (listener.valid() && (fds[1].revents & POLLIN)) acceptAll();
      // New connections were appended after the polled ones, so the indices still match.
      for (size_t i = firstConn; i < fds.size(); ++i) {
        Conn& c = *conns[i - firstConn];
        if (c.dead) continue;
        if (fds[i].revents & POLLOUT) flush(c);
        if (!c.dead && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) readFrom(c);
      }
      checkDeadlines();
      conns.erase(std::remove_if(conns.begin(), conns.end(), [](const auto& c) { return c->dead; }), conns.end());
      if (phase == Phase::kRunning && departedCount == cfg.worldSize) return;  // everyone said goodbye
      if (phase == Phase::kAborted && (conns.empty() || nowNs() >= lingerDeadline)) return;
    }
  }

  Deadline nextDeadline() const {
    Deadline d = nowNs() + 1000000000ull;
    if (phase == Phase::kJoining) d = std::min(d, joinDeadline);
    if (phase == Phase::kRunning && roundCount > 0) d = std::min(d, roundDeadline);
    if (phase == Phase::kAborted) d = std::min(d, lingerDeadline);
    for (const auto& c : conns)
      if (c->rank < 0 || c->draining) d = std::min(d, c->deadline);
    return d;
  }

  void acceptAll() {
    for (;;) {
      int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors or memory: leave the connection in the backlog and try again on the next round.
        GDX_WARN("rendezvous server at " << where << ": accept failed: " << std::strerror(errno));
        return;
      }
      auto c = std::make_unique<Conn>();
      c->fd.reset(fd);
      net::tuneSocket(fd);
      c->peer = net::peerName(fd);
      c->deadline = deadlineIn(cfg.timeoutNs);
      GDX_DEBUG("rendezvous server: connection from " << c->peer);
      conns.push_back(std::move(c));
    }
  }

  void readFrom(Conn& c) {
    while (!c.dead) {
      size_t old = c.in.size();
      c.in.resize(old + kReadChunk);
      ssize_t n = ::recv(c.fd.get(), c.in.data() + old, kReadChunk, 0);
      c.in.resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
      if (n == 0) return onEof(c);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return onEof(c);  // ECONNRESET and friends: the peer is gone either way
      }
      if (c.draining)
        c.in.clear();
      else
        parseFrames(c);
    }
  }

  void parseFrames(Conn& c) {
    while (!c.dead && !c.draining && c.in.size() >= kHeaderBytes) {
      FrameHeader h = decodeHeader(reinterpret_cast<const unsigned char*>(c.in.data()));
      const uint64_t limit = c.rank < 0 ? kMaxHelloBytes : kMaxClientFrameBytes;
      std::string bad = checkFrameHeader(h, limit);
      if (!bad.empty()) return reject(c, bad);
      if (c.in.size() < kHeaderBytes + h.length) {
        c.in.reserve(kHeaderBytes + h.length);  // a large blob: grow once, not by doubling
        return;
      }
      std::string payload;
      if (c.in.size() == kHeaderBytes + h.length) {
        payload = std::move(c.in);
        payload.erase(0, kHeaderBytes);
        c.in.clear();
      } else {
        payload = c.in.substr(kHeaderBytes, h.length);
        c.in.erase(0, kHeaderBytes + h.length);
      }
      if (c.rank < 0)
        onHello(c, h.type, payload);
      else
        onRankFrame(c, h.type, std::move(payload));
    }
  }

  // A connection that is no (valid) rank of this job: tell it why, log it, and keep serving the real ranks.
  // A joined rank that breaks the protocol aborts the job instead: the others could not complete without it.
  void reject(Conn& c, const std::string& reason) {
    if (c.rank >= 0) return abortJob(ErrorCode::kProtocol, "rank " + std::to_string(c.rank) + " sent " + reason);
    refuse(c, reason, -1);
  }

  void refuse(Conn& c, const std::string& reason, long claimedRank) {
    GDX_WARN("rendezvous server at " << where << ": refused connection from " << c.peer
                                     << (claimedRank >= 0 ? " (claims rank " + std::to_string(claimedRank) + ")" : "")
                                     << ": " << reason);
    // Kept for the job's error if that rank then never joins: the ranks that did join are told why, not only that
    // it is missing.
    if (claimedRank >= 0 && claimedRank < static_cast<long>(refusals.size()) && !hasJoined[claimedRank])
      refusals[claimedRank] =
          "a connection from " + c.peer + " claiming rank " + std::to_string(claimedRank) + " was refused: " + reason;
    enqueue(c, std::make_shared<const std::string>(encodeFrame(MsgType::kRefuse, encodeRefuse(reason))));
    startDraining(c, deadlineIn(kRefusalLingerNs));
  }

  void onHello(Conn& c, MsgType type, const std::string& payload) {
    if (type != MsgType::kHello) return refuse(c, std::string("expected hello, got ") + msgTypeName(type), -1);
    Hello h;
    try {
      h = decodeHello(payload);
    } catch (const Error& e) {
      return refuse(c, e.what(), -1);
    }
    long r = h.rank;
    // The secret first, so that a stranger learns nothing about the job from the other checks.
    if (!constantTimeEqual(h.secret, cfg.secret))
      return refuse(c, "wrong job secret (GDX_JOB_SECRET, or the launcher's job id, differs from rank 0's)", r);
    if (phase == Phase::kAborted) return refuse(c, "the job was aborted", r);
    if (static_cast<int>(h.worldSize) != cfg.worldSize)
      return refuse(
          c, "world size " + std::to_string(h.worldSize) + " differs from the job's " + std::to_string(cfg.worldSize),
          r);
    if (r >= cfg.worldSize)
      return refuse(c, "rank " + std::to_string(r) + " is out of range for world size " + std::to_string(cfg.worldSize),
                    r);
    if (hasJoined[r]) return refuse(c, "rank " + std::to_string(r) + " already joined", r);
    c.rank = static_cast<int>(r);
    byRank[r] = &c;
    hasJoined[r] = 1;
    hostnames[r] = h.hostname;
    ++joinedCount;
    GDX_DEBUG("rendezvous server: rank " << r << " joined from " << c.peer << " (" << h.hostname << "), " << joinedCount
                                         << " of " << cfg.worldSize);
    if (joinedCount == cfg.worldSize) welcomeAll();
  }

  void welcomeAll() {
    auto frame = std::make_shared<const std::string>(encodeFrame(MsgType::kWelcome, encodeWelcome(hostnames)));
    phase = Phase::kRunning;
    for (Conn* c : byRank) enqueue(*c, frame);
  }

  void onRankFrame(Conn& c, MsgType type, std::string payload) {
    int r = c.rank;
    if (phase == Phase::kAborted) return;
    if (type == MsgType::kGather && phase == Phase::kRunning) {
      if (payload.size() < 8)
        return abortJob(ErrorCode::kProtocol, "rank " + std::to_string(r) + " sent a truncated gather");
      auto [seq, blob] = decodeGather(payload);
      std::string call = "allGather/barrier #" + std::to_string(seq);
      if (seq != nextSeq || submitted[r])
        return abortJob(ErrorCode::kProtocol, "rank " + std::to_string(r) + " called " + call +
                                                  " while the job is at #" + std::to_string(nextSeq) +
                                                  " (the ranks made different numbers of allGather/barrier calls)");
      if (departedCount > 0)
        return abortJob(ErrorCode::kPeerFailed, "rank " + std::to_string(r) + " called " + call + " but " +
                                                    rankList(ranksWhere(departed, true)) +
                                                    " already left the job (destroyed its Bootstrap)");
      if (roundCount == 0) roundDeadline = deadlineIn(cfg.timeoutNs);
      roundBlobs[r] = std::move(blob);
      submitted[r] = 1;
      if (++roundCount == cfg.worldSize) completeRound();
      return;
    }
    if (type == MsgType::kGoodbye && phase == Phase::kRunning && !c.goodbye) {
      c.goodbye = true;
      departed[r] = 1;
      ++departedCount;
      GDX_DEBUG("rendezvous server: rank " << r << " said goodbye, " << departedCount << " of " << cfg.worldSize);
      if (roundCount > 0 && !submitted[r])
        abortJob(ErrorCode::kPeerFailed, "rank " + std::to_string(r) +
                                             " left the job (destroyed its Bootstrap) while " +
                                             rankList(ranksWhere(submitted, true)) + " waited in allGather/barrier #" +
                                             std::to_string(nextSeq));
      return;
    }
    abortJob(ErrorCode::kProtocol,
             "rank " + std::to_string(r) + " sent an unexpected " + msgTypeName(type) + " message");
  }

  void completeRound() {
    uint64_t total = 12;
    for (const std::string& b : roundBlobs) total += 8 + b.size();
    unsigned char header[kHeaderBytes];
    FrameHeader h;
    h.type = MsgType::kGatherResult;
    h.length = total;
    encodeHeader(h, header);
    ByteWriter w;
    w.reserve(kHeaderBytes + total);
    w.putRaw(header, kHeaderBytes).put(uint64_t{nextSeq}).put(static_cast<uint32_t>(cfg.worldSize));
    for (std::string& b : roundBlobs) {
      w.put(uint64_t{b.size()}).putBytes(b);
      std::string().swap(b);  // free each blob as soon as it is copied
    }
    auto frame = std::make_shared<const std::string>(w.take());
    std::fill(submitted.begin(), submitted.end(), 0);
    roundCount = 0;
    ++nextSeq;
    for (Conn* c : byRank)
      if (c) enqueue(*c, frame);
  }

  void onEof(Conn& c) {
    if (c.dead) return;
    bool failed = c.rank >= 0 && !c.goodbye && phase != Phase::kAborted;
    int r = c.rank;
    close(c);
    if (!failed) return;
    std::string when = phase == Phase::kJoining ? " before all ranks joined"
                       : roundCount > 0         ? " during allGather/barrier #" + std::to_string(nextSeq)
                                                : "";
    abortJob(ErrorCode::kPeerFailed, "rank " + std::to_string(r) + " (host " + hostnames[r] +
                                         ") closed its connection to the rendezvous server without saying goodbye" +
                                         when + " (did the process die?)");
  }

  void close(Conn& c) {
    if (c.rank >= 0 && byRank[c.rank] == &c) byRank[c.rank] = nullptr;
    c.fd.reset();
    c.out.clear();
    c.dead = true;
  }

  std::vector<int> ranksWhere(const std::vector<char>& flags, bool value) const {
    std::vector<int> out;
    for (size_t i = 0; i < flags.size(); ++i)
      if (static_cast<bool>(flags[i]) == value) out.push_back(static_cast<int>(i));
    return out;
  }

  void abortJob(ErrorCode code, const std::string& why) {
    if (phase == Phase::kAborted) return;
    phase = Phase::kAborted;
    std::string message = "bootstrap at " + where + " aborted the job: " + why;
    GDX_WARN("rendezvous server: " << message);
    auto frame = std::make_shared<const std::string>(encodeFrame(MsgType::kAbort, encodeAbort(code, message)));
    lingerDeadline = deadlineIn(std::min<uint64_t>(cfg.timeoutNs, kAbortLingerCapNs));
    listener.reset();  // late ranks now fail to connect instead of joining a dead job
    for (auto& c : conns) {
      if (c->dead) continue;
      if (c->rank >= 0 && !c->goodbye) enqueue(*c, frame);
      startDraining(*c, lingerDeadline);
    }
  }

  void startDraining(Conn& c, Deadline until) {
    c.draining = true;
    c.in.clear();
    c.deadline = until;
    flush(c);
  }

  void enqueue(Conn& c, std::shared_ptr<const std::string> frame) {
    c.out.push_back({std::move(frame), 0});
    flush(c);
  }

  void flush(Conn& c) {
    while (!c.dead && !c.out.empty()) {
      OutChunk& o = c.out.front();
      ssize_t n = ::send(c.fd.get(), o.data->data() + o.offset, o.data->size() - o.offset, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return onEof(c);  // EPIPE, ECONNRESET: the peer is gone
      }
      o.offset += static_cast<size_t>(n);
      if (o.offset == o.data->size()) c.out.pop_front();
    }
    if (!c.dead && c.draining && c.out.empty() && !c.writeShut) {
      // Half-close after the last message: the peer reads it and then EOF. A full close() with input still
      // unread would send a reset that can destroy the message before the peer reads it.
      ::shutdown(c.fd.get(), SHUT_WR);
      c.writeShut = true;
    }
  }

  // While the job waits for ranks, say every few seconds which ones it waits for: at INFO at first and, while ranks
  // join, at WARN once the wait is long enough that a rank was probably not started. (Ranks that reach a barrier at
  // different times are normal, so a round's wait stays at INFO until its timeout names the missing ranks.)
  void reportProgress(uint64_t now, Deadline deadline, const std::vector<int>& missing, const std::string& what,
                      bool mayWarn) {
    constexpr uint64_t kEveryNs = 3000000000ull, kWarnAfterNs = 6000000000ull;
    const uint64_t waited = now + cfg.timeoutNs - deadline;
    if (deadline != progressFor) progressFor = deadline, progressStep = 0;
    if (waited / kEveryNs <= progressStep) return;
    progressStep = waited / kEveryNs;
    std::ostringstream msg;
    msg << "rendezvous server at " << where << ": waiting " << waited / 1000000000ull << " s of " << timeoutMs / 1000
        << " s for " << rankList(missing) << " of " << cfg.worldSize << " to " << what;
    if (mayWarn && waited >= kWarnAfterNs)
      GDX_WARN(msg.str());
    else
      GDX_INFO(msg.str());
  }

  void checkDeadlines() {
    uint64_t now = nowNs();
    if (phase == Phase::kJoining && now < joinDeadline)
      reportProgress(now, joinDeadline, ranksWhere(hasJoined, false), "join", true);
    if (phase == Phase::kRunning && roundCount > 0 && now < roundDeadline)
      reportProgress(now, roundDeadline, ranksWhere(submitted, false),
                     "enter allGather/barrier #" + std::to_string(nextSeq), false);
    if (phase == Phase::kJoining && now >= joinDeadline) {
      std::vector<int> missing = ranksWhere(hasJoined, false);
      std::string why;
      for (int r : missing)
        if (!refusals[r].empty()) why += "; " + refusals[r];
      abortJob(ErrorCode::kTimeout, rankList(missing) + " of " + std::to_string(cfg.worldSize) +
                                        " did not join within " + std::to_string(timeoutMs) + " ms" + why);
    }
    if (phase == Phase::kRunning && roundCount > 0 && now >= roundDeadline) {
      std::vector<int> missing = ranksWhere(submitted, false);
      abortJob(ErrorCode::kTimeout, rankList(missing) + " of " + std::to_string(cfg.worldSize) +
                                        " did not enter allGather/barrier #" + std::to_string(nextSeq) + " within " +
                                        std::to_string(timeoutMs) + " ms of the first rank");
    }
    for (auto& c : conns) {
      if (c->dead || now < c->deadline) continue;
      if (c->draining) {
        close(*c);
      } else if (c->rank < 0) {
        GDX_WARN("rendezvous server at " << where << ": connection from " << c->peer << " sent no hello within "
                                         << timeoutMs << " ms; dropped");
        close(*c);
      }
    }
  }
};

RendezvousServer::RendezvousServer(const BootstrapConfig& config) : impl_(std::make_unique<Impl>(config)) {
  impl_->listen();
  if (config.masterPort == 0) impl_->where = net::hostPort(config.masterAddr, port());  // messages name the real port
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

RendezvousServer::~RendezvousServer() {
  impl_->stopRequested.store(true);
  impl_->wake.wake();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int RendezvousServer::port() const {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  GDX_SYS_CHECK(::getsockname(impl_->listener.get(), reinterpret_cast<sockaddr*>(&a), &n) == 0);
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

bool RendezvousServer::waitFinished(uint64_t ns) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, std::chrono::nanoseconds(ns), [&] { return impl_->finished; });
}

}  // namespace gdx::bootstrap
