// Connection setup of the TCP transport: the acceptor thread that authenticates incoming connections, and the
// collective connect() that opens this rank's outgoing ones and waits until every peer's have arrived.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace gdx::tcp {

using net::IoStatus;

namespace {
// A connection that has not finished its Hello by then is dropped, so a silent stranger cannot hold a slot.
constexpr uint64_t kHelloTimeoutNs = 10000000000ull;
}  // namespace

/// An accepted connection whose Hello (and secret) is still being read.
struct TcpTransport::PendingHello {
  net::UniqueFd fd;
  std::string from;
  std::string buffer;
  uint64_t deadlineNs = 0;
};

void TcpTransport::connect(const std::vector<std::string>& addresses, int lanes) {
  if (connectStarted_)
    throw Error(ErrorCode::kInvalidArgument,
                "TCP transport rank " + std::to_string(rank_) + ": connect() may be called once");
  if (static_cast<int>(addresses.size()) != world_)
    throw Error(ErrorCode::kInvalidArgument, "TCP transport rank " + std::to_string(rank_) + ": " +
                                                 std::to_string(addresses.size()) + " addresses for a world of " +
                                                 std::to_string(world_));
  if (lanes < 1 || lanes > 1024)
    throw Error(ErrorCode::kInvalidArgument, "TCP transport rank " + std::to_string(rank_) + ": lane count " +
                                                 std::to_string(lanes) + " must be in [1, 1024]");
  if (stopping_.load())
    throw Error(ErrorCode::kShutdown, "TCP transport rank " + std::to_string(rank_) + ": connect() after shutdown()");
  for (auto& a : addresses) net::HostPort::parse(a);
  connectStarted_ = true;
  const uint64_t deadline = nowNs() + options_.timeoutNs;

  numLanes_ = lanes;
  size_t slots = static_cast<size_t>(lanes) * world_ * sockets_;
  tx_.resize(slots);
  rx_.resize(slots);
  for (int l = 0; l < lanes; ++l)
    for (int p = 0; p < world_; ++p) {
      rxOrder_.push_back(std::make_unique<RxOrder>(1ull << 20));
      for (int s = 0; s < sockets_; ++s) {
        auto tx = std::make_unique<TxSocket>();
        tx->peer = p;
        tx->lane = l;
        tx->index = s;
        tx_[slot(l, p, s)] = std::move(tx);
      }
    }
  for (int l = 0; l < lanes; ++l) lanes_.push_back(std::make_unique<TcpLane>(*this, l, world_));

  acceptor_ = std::thread([this] { acceptorLoop(); });
  openOutgoing(addresses, deadline);
  awaitIncoming(deadline);

  connected_ = true;
  for (auto& s : tx_) s->thread = std::thread([this, p = s.get()] { senderLoop(*p); });
  for (auto& r : rx_) r->thread = std::thread([this, p = r.get()] { receiverLoop(*p); });
  GDX_INFO("TCP transport rank " << rank_ << ": connected to " << world_ << " ranks, " << lanes << " lanes, "
                                 << sockets_ << " sockets each");
}

void TcpTransport::openOutgoing(const std::vector<std::string>& addresses, uint64_t deadlineNs) {
  std::set<int> unreachable;
  std::string lastWhy;
  // All connections and Hellos go out first, then all answers are collected: the peers answer only once they
  // themselves are in connect(), and they may get there in any order.
  for (int p = 0; p < world_; ++p) {
    net::HostPort hp = net::HostPort::parse(addresses[p]);
    for (int l = 0; l < numLanes_ && !unreachable.count(p); ++l) {
      for (int s = 0; s < sockets_ && !unreachable.count(p); ++s) {
        std::string why;
        net::UniqueFd fd = net::connectTo(hp, deadlineNs, &why);
        if (!fd.valid()) {
          unreachable.insert(p);
          lastWhy = "rank " + std::to_string(p) + " at " + addresses[p] + ": " + why;
          break;
        }
        net::detectLinkLoss(fd.get(), options_.timeoutNs);
        Hello hello;
        hello.rank = rank_;
        hello.worldSize = world_;
        hello.lane = static_cast<uint32_t>(l);
        hello.lanes = static_cast<uint32_t>(numLanes_);
        hello.socketIndex = static_cast<uint32_t>(s);
        hello.socketsPerPeer = static_cast<uint32_t>(sockets_);
        hello.secretBytes = static_cast<uint32_t>(options_.secret.size());
        hello.chunkBytes = options_.chunkBytes;
        iovec iov[2] = {{&hello, sizeof hello}, {const_cast<char*>(options_.secret.data()), options_.secret.size()}};
        net::IoLimits limits;
        limits.deadline = deadlineNs;
        IoStatus io = net::sendFull(fd.get(), iov, 2, limits);
        if (!io.ok()) {
          unreachable.insert(p);
          lastWhy = "rank " + std::to_string(p) + ": sending the hello failed: " + io.describe();
          break;
        }
        txSocket(l, p, s).fd = std::move(fd);
      }
    }
  }
  for (int p = 0; p < world_; ++p) {
    for (int l = 0; l < numLanes_ && !unreachable.count(p); ++l) {
      for (int s = 0; s < sockets_ && !unreachable.count(p); ++s) {
        TxSocket& tx = txSocket(l, p, s);
        HelloAck ack;
        net::IoLimits limits;
        limits.deadline = deadlineNs;
        IoStatus io = net::recvFull(tx.fd.get(), &ack, sizeof ack, limits);
        if (!io.ok()) {
          unreachable.insert(p);
          lastWhy = "rank " + std::to_string(p) + " did not accept lane " + std::to_string(l) + " socket " +
                    std::to_string(s) + ": " + io.describe();
          break;
        }
        if (ack.magic != kAckMagic || ack.reply != static_cast<uint32_t>(HelloReply::kAccepted)) {
          std::string reason =
              ack.magic != kAckMagic ? "a malformed answer" : helloReplyName(static_cast<HelloReply>(ack.reply));
          throw Error(ErrorCode::kProtocol, "TCP transport rank " + std::to_string(rank_) + ": rank " +
                                                std::to_string(p) + " refused the connection of lane " +
                                                std::to_string(l) + " socket " + std::to_string(s) + ": " + reason);
        }
      }
    }
  }
  if (!unreachable.empty()) {
    std::ostringstream os;
    os << "TCP transport rank " << rank_ << ": connect timed out after " << options_.timeoutNs / 1000000
       << " ms; could not connect to ranks [";
    const char* sep = "";
    for (int p : unreachable) os << sep << p, sep = ", ";
    os << "] (" << lastWhy << ")";
    throw Error(ErrorCode::kTimeout, os.str());
  }
}

void TcpTransport::awaitIncoming(uint64_t deadlineNs) {
  std::unique_lock<std::mutex> lock(rxMutex_);
  const size_t want = rx_.size();
  while (rxFilled_ < want) {
    if (!refusedRank_.empty()) {
      const std::string why = refusedRank_;
      lock.unlock();
      throw Error(ErrorCode::kProtocol, "TCP transport rank " + std::to_string(rank_) + ": " + why +
                                            " (GDX_PROXY_THREADS, GDX_TCP_SOCKETS and GDX_TCP_CHUNK must agree)");
    }
    uint64_t now = nowNs();
    if (now >= deadlineNs) {
      lock.unlock();
      throw Error(ErrorCode::kTimeout, "TCP transport rank " + std::to_string(rank_) + ": connect timed out after " +
                                           std::to_string(options_.timeoutNs / 1000000) +
                                           " ms; no connection arrived from ranks [" + missingRanks(true) + "]");
    }
    rxCv_.wait_for(lock, std::chrono::nanoseconds(std::min<uint64_t>(deadlineNs - now, 100000000ull)));
  }
}

std::string TcpTransport::missingRanks(bool /*incoming*/) const {
  std::set<int> missing;
  for (int l = 0; l < numLanes_; ++l)
    for (int p = 0; p < world_; ++p)
      for (int s = 0; s < sockets_; ++s)
        if (!rx_[slot(l, p, s)]) missing.insert(p);
  std::ostringstream os;
  const char* sep = "";
  for (int p : missing) os << sep << p, sep = ", ";
  return os.str();
}

void TcpTransport::acceptorLoop() {
  std::vector<PendingHello> pending;
  while (!acceptorStop_.load()) {
    std::vector<pollfd> fds;
    fds.push_back({listener_.get(), POLLIN, 0});
    fds.push_back({wake_.fd(), POLLIN, 0});
    for (auto& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0 && errno != EINTR) {
      GDX_ERROR("TCP transport rank " << rank_ << ": acceptor poll failed: " << std::strerror(errno));
      return;
    }
    if (acceptorStop_.load()) break;
    // Read from the connections polled above before accepting new ones, so indices still match.
    for (size_t i = 0; n > 0 && i < pending.size(); ++i) {
      if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      handleHello(pending[i]);
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      for (;;) {
        int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            GDX_WARN("TCP transport rank " << rank_ << ": accept failed: " << std::strerror(errno));
          if (errno == EINTR || errno == ECONNABORTED) continue;
          break;
        }
        PendingHello p;
        p.fd.reset(fd);
        try {
          net::tuneSocket(fd);
          net::detectLinkLoss(fd, options_.timeoutNs);
        } catch (const std::exception& e) {
          GDX_WARN("TCP transport rank " << rank_ << ": dropping a connection: " << e.what());
          continue;
        }
        p.from = net::peerName(fd);
        p.deadlineNs = nowNs() + std::min(kHelloTimeoutNs, options_.timeoutNs);
        pending.push_back(std::move(p));
      }
    }
    uint64_t now = nowNs();
    for (auto& p : pending)
      if (p.fd.valid() && now > p.deadlineNs) {
        GDX_WARN("TCP transport rank " << rank_ << ": refused the connection from " << p.from
                                       << ": no complete hello within the time limit");
        p.fd.reset();
      }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const PendingHello& p) { return !p.fd.valid(); }),
                  pending.end());
  }
}

void TcpTransport::handleHello(PendingHello& p) {
  auto refuse = [&](HelloReply reply, const std::string& detail) {
    GDX_WARN("TCP transport rank " << rank_ << ": refused the connection from " << p.from << ": "
                                   << helloReplyName(reply) << detail);
    HelloAck ack;
    ack.reply = static_cast<uint32_t>(reply);
    [[maybe_unused]] ssize_t sent = ::send(p.fd.get(), &ack, sizeof ack, MSG_NOSIGNAL | MSG_DONTWAIT);
    p.fd.reset();
  };
  auto drop = [&](const std::string& why) {
    GDX_WARN("TCP transport rank " << rank_ << ": refused the connection from " << p.from << ": " << why);
    p.fd.reset();
  };

  // Read only as far as the Hello (and then its secret) goes: anything after it belongs to the data stream.
  const size_t want = helloBytesWanted(p.buffer);
  char tmp[512];
  size_t room = std::min(sizeof tmp, want - p.buffer.size());
  ssize_t r = ::recv(p.fd.get(), tmp, room, MSG_DONTWAIT);
  if (r == 0) return drop("closed before completing its hello");
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    return drop(std::string("receive failed: ") + std::strerror(errno));
  }
  p.buffer.append(tmp, static_cast<size_t>(r));
  Hello hello;
  std::string secret;
  switch (parseHello(p.buffer, &hello, &secret)) {
    case HelloParse::kIncomplete: return;
    case HelloParse::kNotGdx: return drop("not a gdx TCP transport hello");
    case HelloParse::kBadVersion: return drop("hello of wire version " + std::to_string(hello.version));
    case HelloParse::kOversized: return refuse(HelloReply::kBadSecret, " (oversized)");
    case HelloParse::kComplete: break;
  }
  std::string claim = " (claims rank " + std::to_string(hello.rank) + " lane " + std::to_string(hello.lane) +
                      " socket " + std::to_string(hello.socketIndex) + "; it runs " + std::to_string(hello.lanes) +
                      " lanes, " + std::to_string(hello.socketsPerPeer) + " sockets per peer, " +
                      std::to_string(hello.chunkBytes) + "-byte chunks in a world of " +
                      std::to_string(hello.worldSize) + "; this rank " + std::to_string(numLanes_) + ", " +
                      std::to_string(sockets_) + ", " + std::to_string(options_.chunkBytes) + " in a world of " +
                      std::to_string(world_) + ")";
  HelloExpectations expected;
  expected.secret = options_.secret;
  expected.worldSize = world_;
  expected.lanes = static_cast<uint32_t>(numLanes_);
  expected.socketsPerPeer = static_cast<uint32_t>(sockets_);
  expected.chunkBytes = options_.chunkBytes;
  HelloReply verdict = checkHello(hello, secret, expected);
  const bool settingsDiffer = verdict == HelloReply::kWorldMismatch || verdict == HelloReply::kBadLane ||
                              verdict == HelloReply::kBadSocket || verdict == HelloReply::kChunkTooLarge;
  if (settingsDiffer) {
    // A rank of this job (it has the secret) whose settings differ: this side's connect() fails now, with the reason,
    // instead of waiting out its timeout for connections that will never be accepted. A rank out of range or a second
    // connection for a taken slot is no settings mismatch (a stale or stray process): it is refused and the real
    // peer is still waited for.
    std::lock_guard<std::mutex> lock(rxMutex_);
    if (refusedRank_.empty())
      refusedRank_ = std::string("refused the connection of rank ") + std::to_string(hello.rank) + ": " +
                     helloReplyName(verdict) + claim;
    rxCv_.notify_all();
  }
  if (verdict != HelloReply::kAccepted) return refuse(verdict, claim);

  size_t index = slot(static_cast<int>(hello.lane), hello.rank, static_cast<int>(hello.socketIndex));
  std::unique_lock<std::mutex> lock(rxMutex_);
  if (rx_[index]) {
    lock.unlock();
    return refuse(HelloReply::kDuplicate, claim);
  }
  HelloAck ack;
  IoStatus io;
  {
    iovec iov{&ack, sizeof ack};
    net::IoLimits limits;
    limits.stallNs = 1000000000ull;
    io = net::sendFull(p.fd.get(), &iov, 1, limits);
  }
  if (!io.ok()) {
    lock.unlock();
    return drop("answering its hello failed: " + io.describe());
  }
  auto rx = std::make_unique<RxSocket>();
  rx->fd = std::move(p.fd);
  rx->peer = hello.rank;
  rx->lane = static_cast<int>(hello.lane);
  rx->index = static_cast<int>(hello.socketIndex);
  rx_[index] = std::move(rx);
  ++rxFilled_;
  lock.unlock();
  rxCv_.notify_all();
  GDX_DEBUG("TCP transport rank " << rank_ << ": accepted rank " << hello.rank << " lane " << hello.lane << " socket "
                                  << hello.socketIndex << " from " << p.from);
}

}  // namespace gdx::tcp
