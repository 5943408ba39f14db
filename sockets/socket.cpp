#include "sockets/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"

namespace gdx::net {
namespace {

// The longest a transfer waits in poll() before it looks at its abort check, deadline and stall timer again.
constexpr int kPollSliceMs = 100;
// connectTo() with a label reports its retries after this long, then every kConnectReportEveryNs.
constexpr uint64_t kConnectFirstReportNs = 1000ull * 1000 * 1000;
constexpr uint64_t kConnectReportEveryNs = 5000ull * 1000 * 1000;
// connectTo() makes its last attempt at least this long before its deadline.
constexpr uint64_t kConnectLastTryNs = 20ull * 1000 * 1000;

// "connection refused" from strerror's "Connection refused", for the middle of a sentence.
std::string lowerFirst(std::string s) {
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

// The numeric host of `ss` as text; its port in `*port` when asked. "" for a family other than IPv4/IPv6.
std::string addressText(const sockaddr_storage& ss, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = nullptr;
  uint16_t p = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    addr = &a->sin_addr;
    p = a->sin_port;
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    addr = &a->sin6_addr;
    p = a->sin6_port;
  }
  if (!addr || !inet_ntop(ss.ss_family, addr, text, sizeof text)) return "";
  if (port) *port = ntohs(p);
  return text;
}

// Waits up to `timeoutMs` for `events` on `fd`. EINTR counts as a (spurious) wake-up; -1 only on a real error.
int pollOne(int fd, short events, int timeoutMs) {
  pollfd p{fd, events, 0};
  int r = ::poll(&p, 1, timeoutMs);
  if (r < 0 && errno == EINTR) return 0;
  return r;
}

// Called when a transfer cannot move right now: says whether it must stop (and why, in `st`), else waits until
// the socket is ready for `events` or the next check is due.
bool mustStop(IoStatus& st, int fd, short events, const IoLimits& limits, uint64_t lastProgress) {
  if (limits.abort && limits.abort()) {
    st.result = IoResult::kAborted;
    return true;
  }
  uint64_t now = nowNs();
  if (now >= limits.deadline) {
    st.result = IoResult::kTimeout;
    return true;
  }
  bool stallBounded = !(limits.idleOk && st.done == 0 && events == POLLIN);
  if (stallBounded && now - lastProgress > limits.stallNs) {
    st.result = IoResult::kStalled;
    return true;
  }
  if (pollOne(fd, events, msUntil(limits.deadline, kPollSliceMs)) < 0) {
    st.result = IoResult::kError;
    st.err = errno;
    return true;
  }
  return false;
}

}  // namespace

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is released even then.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

WakePipe::WakePipe() {
  int p[2];
  GDX_SYS_CHECK(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
  read_.reset(p[0]);
  write_.reset(p[1]);
}

void WakePipe::wake() {
  char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(write_.get(), &byte, 1);
}

// ---- Deadlines ------------------------------------------------------------------------------------------------

Deadline deadlineIn(uint64_t ns) {
  uint64_t now = nowNs();
  return ns > kNoDeadline - now ? kNoDeadline : now + ns;
}

int msUntil(Deadline deadline, int capMs) {
  uint64_t now = nowNs();
  if (now >= deadline) return 0;
  uint64_t ms = (deadline - now + 999999) / 1000000;
  return ms > static_cast<uint64_t>(capMs) ? capMs : static_cast<int>(ms);
}

// ---- Addresses ------------------------------------------------------------------------------------------------

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

SockAddr ipv4(const std::string& host, int port) {
  SockAddr s;
  auto* a = reinterpret_cast<sockaddr_in*>(&s.addr);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty()) {
    a->sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1) {
    throw Error(ErrorCode::kInvalidArgument, "'" + host + "' is not an IPv4 address");
  }
  s.len = sizeof(sockaddr_in);
  s.family = AF_INET;
  return s;
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
  ipv4(hp.host, hp.port);  // validates the host part
  return hp;
}

std::string hostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string localAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  GDX_SYS_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0);
  std::string text = addressText(ss, nullptr);
  if (text.empty()) throw SystemError("inet_ntop(getsockname())", EAFNOSUPPORT, __FILE__, __LINE__);
  return text;
}

std::string peerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  int port = 0;
  std::string text = addressText(ss, &port);
  return text.empty() ? "?" : hostPort(text, port);
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

// ---- Listening and connecting ---------------------------------------------------------------------------------

void tuneSocket(int fd) {
  int one = 1;
  GDX_SYS_CHECK(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
}

void detectLinkLoss(int fd, uint64_t timeoutNs) {
  const uint64_t budgetMs = std::max<uint64_t>(timeoutNs / 2 / 1000000, 2000);
  // Keepalive counts in whole seconds: half the budget idle, then three probes over the other half.
  const int idle = static_cast<int>(std::max<uint64_t>(budgetMs / 2000, 1));
  const int interval = static_cast<int>(std::max<uint64_t>((budgetMs / 1000 - static_cast<uint64_t>(idle)) / 3, 1));
  const int probes = 3, one = 1;
  GDX_SYS_CHECK(::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) == 0);
  GDX_SYS_CHECK(::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) == 0);
  GDX_SYS_CHECK(::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) == 0);
  GDX_SYS_CHECK(::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) == 0);
}

UniqueFd listenAt(const SockAddr& a, int* err) {
  UniqueFd fd(::socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  GDX_SYS_CHECK(fd.valid());
  int one = 1;
  GDX_SYS_CHECK(::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  tuneSocket(fd.get());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0) {
    *err = errno;
    return UniqueFd();
  }
  GDX_SYS_CHECK(::listen(fd.get(), SOMAXCONN) == 0);
  return fd;
}

UniqueFd listenOn(const std::string& bindAddress, int* port) {
  std::string host = bindAddress == "0.0.0.0" ? "" : bindAddress;
  SockAddr a = ipv4(host, 0);
  int err = 0;
  UniqueFd fd = listenAt(a, &err);
  if (!fd.valid())
    throw SystemError("bind(" + hostPort(host.empty() ? "0.0.0.0" : host, 0) + ")", err, __FILE__, __LINE__);
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  GDX_SYS_CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0);
  *port = ntohs(bound.sin_port);
  return fd;
}

UniqueFd connectOnce(const SockAddr& a, Deadline deadline, int* err, std::string* why) {
  UniqueFd fd(::socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  GDX_SYS_CHECK(fd.valid());
  tuneSocket(fd.get());
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len);
  int e = rc == 0 ? 0 : errno;
  // An interrupted connect() goes on in the background, like a non-blocking one.
  if (e == EINPROGRESS || e == EINTR) {
    for (;;) {
      int ms = msUntil(deadline, kPollSliceMs);
      if (ms == 0) {
        *err = ETIMEDOUT;
        *why = "connect timed out";
        return UniqueFd();
      }
      int r = pollOne(fd.get(), POLLOUT, ms);
      GDX_SYS_CHECK(r >= 0);
      if (r > 0) break;
    }
    socklen_t len = sizeof e;
    GDX_SYS_CHECK(::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &e, &len) == 0);
  }
  if (e == 0) return fd;
  *err = e;
  *why = std::strerror(e);
  return UniqueFd();
}

ConnectRetry ConnectRetry::backoff(std::string label) {
  ConnectRetry r;
  r.firstPauseNs = 10ull * 1000 * 1000;
  r.maxPauseNs = 1000ull * 1000 * 1000;
  r.label = std::move(label);
  return r;
}

std::string errnoName(int err) {
  switch (err) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ECONNRESET: return "ECONNRESET";
    case EAGAIN: return "EAGAIN";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EINTR: return "EINTR";
    default: return "errno " + std::to_string(err);
  }
}

UniqueFd connectTo(const HostPort& address, Deadline deadline, std::string* why, const ConnectRetry& retry) {
  SockAddr a = ipv4(address.host, address.port);
  const uint64_t start = nowNs();
  uint64_t pause = retry.firstPauseNs;
  uint64_t nextReport = start + kConnectFirstReportNs;
  int attempts = 0;
  // The last error an attempt got from the network; an attempt cut short by the deadline itself does not replace it
  // (on a busy host the final attempt may start late), so that the error still says what the address answered.
  std::string answer;
  int answerErr = 0;
  for (;;) {
    int err = 0;
    std::string last;
    UniqueFd fd = connectOnce(a, deadline, &err, &last);
    ++attempts;
    if (fd.valid()) return fd;
    const uint64_t now = nowNs();
    const bool cutShort = err == ETIMEDOUT && now >= deadline && answerErr != 0;
    if (!cutShort) {
      answer = last;
      answerErr = err;
    }
    *why = std::to_string(attempts) + (attempts == 1 ? " attempt" : " attempts") + " in " +
           std::to_string((now - start) / 1000000) + " ms, the last: " + answer + " (" + errnoName(answerErr) + ")" +
           (cutShort ? "; the deadline passed during the attempt after it" : "");
    // The peer may not listen yet, or its backlog is momentarily full: retry until the deadline.
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET && err != EAGAIN) {
      *why = last + " (" + errnoName(err) + "; not worth a retry)";
      return UniqueFd();
    }
    // The last attempt comes shortly before the deadline, so that its error is the peer's answer, not the deadline.
    const uint64_t left = deadline > now ? deadline - now : 0;
    if (left <= kConnectLastTryNs) return UniqueFd();
    if (!retry.label.empty() && now >= nextReport) {
      nextReport = now + kConnectReportEveryNs;
      const std::string forHowLong = deadline == kNoDeadline
                                         ? std::string("without a deadline")
                                         : "for another " + std::to_string((left + 999999999) / 1000000000) + " s";
      GDX_WARN(retry.label << ": " << lowerFirst(last) << ", retrying " << forHowLong << " (" << attempts
                           << " attempts so far)");
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(pause, left - kConnectLastTryNs)));
    pause = std::min(pause * 2, std::max(retry.maxPauseNs, retry.firstPauseNs));
  }
}

// ---- Full-length transfers ------------------------------------------------------------------------------------

bool IoStatus::closed() const {
  return result == IoResult::kEof || (result == IoResult::kError && (err == EPIPE || err == ECONNRESET));
}

std::string IoStatus::describe() const {
  switch (result) {
    case IoResult::kOk: return "ok";
    case IoResult::kEof: return "connection closed by the peer";
    case IoResult::kError: return std::string("socket error: ") + std::strerror(err);
    case IoResult::kStalled: return "no progress within the timeout";
    case IoResult::kTimeout: return "timed out";
    case IoResult::kAborted: return "aborted";
  }
  return "?";
}

IoStatus sendFull(int fd, iovec* iov, int iovcnt, const IoLimits& limits) {
  IoStatus st;
  uint64_t lastProgress = nowNs();
  for (;;) {
    // Skip what went out completely (and empty pieces), trim the piece that went out in part.
    while (iovcnt > 0 && iov->iov_len == 0) {
      ++iov;
      --iovcnt;
    }
    if (iovcnt == 0) return st;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      st.done += static_cast<size_t>(n);
      lastProgress = nowNs();
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        size_t take = std::min(left, iov->iov_len);
        iov->iov_base = static_cast<char*>(iov->iov_base) + take;
        iov->iov_len -= take;
        left -= take;
        if (iov->iov_len == 0) {
          ++iov;
          --iovcnt;
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      st.result = IoResult::kError;
      st.err = errno;
      return st;
    }
    if (mustStop(st, fd, POLLOUT, limits, lastProgress)) return st;
  }
}

IoStatus recvFull(int fd, void* buf, size_t n, const IoLimits& limits) {
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
    // On POLLHUP/POLLERR too, recv() again: it returns the bytes still buffered, then EOF or the error.
    if (mustStop(st, fd, POLLIN, limits, lastProgress)) return st;
  }
  return st;
}

}  // namespace gdx::net
