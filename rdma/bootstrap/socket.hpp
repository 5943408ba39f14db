// Socket plumbing for the bootstrap: an owning file descriptor, deadlines, and send/receive helpers that
// handle partial transfers, EINTR and non-blocking sockets, and never wait past a deadline (poll() with the
// time left, not blocking calls).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdx::bootstrap {

/// Owns one file descriptor; closes it exactly once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// Absolute point in time (nowNs() clock) after which a wait gives up.
using Deadline = uint64_t;
Deadline deadlineIn(uint64_t ns);
/// Milliseconds left until `deadline` for poll(), rounded up, capped at `capMs`; 0 once it has passed.
int msUntil(Deadline deadline, int capMs = 1000);

void setNonBlocking(int fd);
/// Small control messages must not sit in Nagle's buffer waiting for an ACK.
void setNoDelay(int fd);

/// Outcome of a bounded transfer that did not throw.
enum class IoStatus { kOk, kTimeout, kClosed };

/// Waits until `fd` reports one of `events` (POLLIN/POLLOUT). kClosed on POLLHUP/POLLERR without the event.
IoStatus waitFor(int fd, short events, Deadline deadline);

/// Sends all bytes of `iov` on a non-blocking socket before `deadline`. kClosed when the peer is gone (EPIPE,
/// ECONNRESET); other errors throw SystemError. No SIGPIPE.
IoStatus sendAll(int fd, std::vector<iovec> iov, Deadline deadline);
/// Receives exactly `n` bytes into `buf` before `deadline`; kClosed on EOF or a reset connection.
IoStatus recvExact(int fd, void* buf, size_t n, Deadline deadline);

struct SockAddr {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = 0;
};
/// getaddrinfo for a TCP endpoint (a hostname or a literal), IPv4 addresses first so that every rank picks
/// the same family. Returns nothing and sets `error` when the name does not resolve.
std::vector<SockAddr> resolve(const std::string& host, int port, bool passive, std::string* error);

/// "host:port" with brackets around IPv6 literals, for messages.
std::string hostPort(const std::string& host, int port);
/// The local address of a connected socket (getsockname), as text.
std::string localAddress(int fd);

}  // namespace gdx::bootstrap
