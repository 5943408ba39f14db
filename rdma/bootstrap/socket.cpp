#include "rdma/bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gdx/clock.hpp"
#include "gdx/error.hpp"

namespace gdx::bootstrap {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released even then.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Deadline deadlineIn(uint64_t ns) {
  return nowNs() + ns;
}

int msUntil(Deadline deadline, int capMs) {
  uint64_t now = nowNs();
  if (now >= deadline) return 0;
  uint64_t ms = (deadline - now + 999999) / 1000000;
  return ms > static_cast<uint64_t>(capMs) ? capMs : static_cast<int>(ms);
}

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  GDX_SYS_CHECK(flags >= 0);
  GDX_SYS_CHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0);
}

void setNoDelay(int fd) {
  int one = 1;
  GDX_SYS_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
}

IoStatus waitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    int ms = msUntil(deadline);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      GDX_SYS_CHECK(r >= 0);
    }
    if (r > 0) {
      if (p.revents & events) return IoStatus::kOk;
      if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return IoStatus::kClosed;
    }
    if (ms == 0) return IoStatus::kTimeout;
  }
}

IoStatus sendAll(int fd, std::vector<iovec> iov, Deadline deadline) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = iov.size() - first;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        IoStatus s = waitFor(fd, POLLOUT, deadline);
        if (s != IoStatus::kOk) return s;
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) return IoStatus::kClosed;
      GDX_SYS_CHECK(n >= 0);
    }
    // Partial write: skip the iovecs that went out completely, trim the one that went out in part.
    size_t left = static_cast<size_t>(n);
    while (left > 0 && first < iov.size()) {
      size_t take = left < iov[first].iov_len ? left : iov[first].iov_len;
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return IoStatus::kOk;
}

IoStatus recvExact(int fd, void* buf, size_t n, Deadline deadline) {
  auto* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return IoStatus::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoStatus s = waitFor(fd, POLLIN, deadline);
      if (s == IoStatus::kTimeout) return s;
      // On kClosed too, recv() again: it returns the bytes still buffered, then EOF or the error.
      continue;
    }
    if (errno == ECONNRESET || errno == EPIPE) return IoStatus::kClosed;
    GDX_SYS_CHECK(r >= 0);
  }
  return IoStatus::kOk;
}

std::vector<SockAddr> resolve(const std::string& host, int port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  std::vector<SockAddr> out;
  if (rc != 0) {
    if (error) *error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return out;
  }
  for (addrinfo* a = list; a; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    SockAddr s;
    std::memcpy(&s.addr, a->ai_addr, a->ai_addrlen);
    s.len = a->ai_addrlen;
    s.family = a->ai_family;
    out.push_back(s);
  }
  freeaddrinfo(list);
  std::stable_sort(out.begin(), out.end(),
                   [](const SockAddr& x, const SockAddr& y) { return x.family == AF_INET && y.family != AF_INET; });
  if (out.empty() && error) *error = "'" + host + "' has no IPv4 or IPv6 address";
  return out;
}

std::string hostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string localAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  GDX_SYS_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0);
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    GDX_SYS_CHECK(inet_ntop(AF_INET, &a->sin_addr, text, sizeof text) != nullptr);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    GDX_SYS_CHECK(inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text) != nullptr);
  }
  return text;
}

}  // namespace gdx::bootstrap
