#include "rdma/tcp/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "gdx/clock.hpp"
#include "gdx/error.hpp"

namespace gdx::tcp {
namespace {

// Large buffers keep several MiB in flight per socket; the kernel caps them at net.core.{r,w}mem_max.
constexpr int kSocketBufferBytes = 4 << 20;
constexpr int kPollSliceMs = 100;

sockaddr_in toSockaddr(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty()) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    throw Error(ErrorCode::kInvalidArgument, "'" + host + "' is not an IPv4 address");
  }
  return a;
}

// Waits until `fd` is ready for `events` or the slice ends; EINTR counts as a (spurious) wake-up.
int pollOne(int fd, short events, int timeoutMs) {
  pollfd p{fd, events, 0};
  int r = ::poll(&p, 1, timeoutMs);
  if (r < 0 && errno == EINTR) return 0;
  return r;
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

HostPort HostPort::parse(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw Error(ErrorCode::kInvalidArgument, "TCP transport address '" + address + "' is not host:port");
  HostPort hp;
  hp.host = address.substr(0, colon);
  char* end = nullptr;
  long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    throw Error(ErrorCode::kInvalidArgument, "TCP transport address '" + address + "' has a bad port");
  hp.port = static_cast<int>(port);
  toSockaddr(hp.host, hp.port);  // validates the host part
  return hp;
}

void setNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  GDX_SYS_CHECK(flags >= 0);
  GDX_SYS_CHECK(::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
}

void configureSocket(int fd, bool nonBlocking) {
  int one = 1;
  GDX_SYS_CHECK(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
  int buf = kSocketBufferBytes;
  GDX_SYS_CHECK(::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf) == 0);
  GDX_SYS_CHECK(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf) == 0);
  GDX_SYS_CHECK(::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0);
  if (nonBlocking) setNonBlocking(fd);
}

UniqueFd listenOn(const std::string& bindAddress, int* port) {
  std::string host = bindAddress == "0.0.0.0" ? "" : bindAddress;
  sockaddr_in a = toSockaddr(host, 0);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  GDX_SYS_CHECK(fd.valid());
  int one = 1;
  GDX_SYS_CHECK(::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  // Buffer sizes set on the listener are inherited by accepted sockets before the handshake, which is what
  // lets the TCP window scale up to them.
  configureSocket(fd.get(), true);
  GDX_SYS_CHECK(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  GDX_SYS_CHECK(::listen(fd.get(), SOMAXCONN) == 0);
  socklen_t len = sizeof a;
  GDX_SYS_CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

std::string localAddressToward(const std::string& host) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(9);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return "";
  // Connecting a UDP socket only consults the routing table; nothing goes on the wire.
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  socklen_t len = sizeof a;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char text[INET_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET, &a.sin_addr, text, sizeof text) ? text : "";
}

std::string peerName(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char text[INET_ADDRSTRLEN] = {};
  if (!inet_ntop(AF_INET, &a.sin_addr, text, sizeof text)) return "?";
  return std::string(text) + ":" + std::to_string(ntohs(a.sin_port));
}

UniqueFd connectTo(const HostPort& address, uint64_t deadlineNs, std::string* why) {
  sockaddr_in a = toSockaddr(address.host, address.port);
  for (;;) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    GDX_SYS_CHECK(fd.valid());
    configureSocket(fd.get(), true);
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      for (;;) {
        uint64_t now = nowNs();
        if (now >= deadlineNs) {
          *why = "connection attempt timed out";
          return UniqueFd();
        }
        int ms = static_cast<int>(std::min<uint64_t>((deadlineNs - now) / 1000000 + 1, kPollSliceMs));
        int r = pollOne(fd.get(), POLLOUT, ms);
        GDX_SYS_CHECK(r >= 0);
        if (r > 0) break;
      }
      socklen_t len = sizeof err;
      GDX_SYS_CHECK(::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0);
    }
    if (err == 0) return fd;
    *why = std::strerror(err);
    // The peer may not listen yet, or its backlog is momentarily full: retry until the deadline.
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET && err != EAGAIN) return UniqueFd();
    if (nowNs() + 50000000ull >= deadlineNs) return UniqueFd();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string IoStatus::describe() const {
  switch (result) {
    case IoResult::kOk: return "ok";
    case IoResult::kEof: return "connection closed by the peer";
    case IoResult::kError: return std::string("socket error: ") + std::strerror(err);
    case IoResult::kStalled: return "no progress within the timeout";
    case IoResult::kAborted: return "aborted";
  }
  return "?";
}

IoStatus sendFull(int fd, iovec* iov, int iovcnt, uint64_t stallNs, const AbortCheck& abort) {
  IoStatus st;
  uint64_t lastProgress = nowNs();
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      st.done += static_cast<size_t>(n);
      lastProgress = nowNs();
      size_t left = static_cast<size_t>(n);
      while (iovcnt > 0 && left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --iovcnt;
      }
      if (iovcnt > 0) {
        iov->iov_base = static_cast<char*>(iov->iov_base) + left;
        iov->iov_len -= left;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      st.result = IoResult::kError;
      st.err = errno;
      return st;
    }
    if (abort && abort()) {
      st.result = IoResult::kAborted;
      return st;
    }
    if (nowNs() - lastProgress > stallNs) {
      st.result = IoResult::kStalled;
      return st;
    }
    if (pollOne(fd, POLLOUT, kPollSliceMs) < 0) {
      st.result = IoResult::kError;
      st.err = errno;
      return st;
    }
  }
  return st;
}

IoStatus recvFull(int fd, void* buf, size_t n, uint64_t stallNs, const AbortCheck& abort, bool idleOk) {
  IoStatus st;
  auto* p = static_cast<char*>(buf);
  uint64_t lastProgress = nowNs();
  while (st.done < n) {
    ssize_t r = ::recv(fd, p + st.done, n - st.done, MSG_DONTWAIT);
    if (r > 0) {
      st.done += static_cast<size_t>(r);
      lastProgress = nowNs();
      continue;
    }
    if (r == 0) {
      st.result = IoResult::kEof;
      return st;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      st.result = IoResult::kError;
      st.err = errno;
      return st;
    }
    if (abort && abort()) {
      st.result = IoResult::kAborted;
      return st;
    }
    if ((!idleOk || st.done > 0) && nowNs() - lastProgress > stallNs) {
      st.result = IoResult::kStalled;
      return st;
    }
    if (pollOne(fd, POLLIN, kPollSliceMs) < 0) {
      st.result = IoResult::kError;
      st.err = errno;
      return st;
    }
  }
  return st;
}

}  // namespace gdx::tcp
