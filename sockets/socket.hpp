// Socket plumbing shared by the bootstrap and the TCP transport: an owning file descriptor, deadlines, address
// parsing and lookup, listening and connecting with deadlines, and full-length send/receive on non-blocking
// sockets that survive EINTR and partial transfers and never wait without a bound (poll() with the time left,
// never a blocking call).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gdx::net {

/// Owns one file descriptor; closes it exactly once.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// A self-pipe that wakes a thread sleeping in poll() (it polls fd() for POLLIN), instead of letting it wait out
/// its timeout. Non-blocking and close-on-exec.
class WakePipe {
 public:
  WakePipe();
  int fd() const { return read_.get(); }
  /// Best effort: if the pipe is full the thread is awake anyway.
  void wake();

 private:
  UniqueFd read_, write_;
};

// ---- Deadlines ------------------------------------------------------------------------------------------------

/// Absolute point in time (gdx::nowNs() clock) after which a wait gives up.
using Deadline = uint64_t;
constexpr Deadline kNoDeadline = UINT64_MAX;
Deadline deadlineIn(uint64_t ns);
/// Milliseconds left until `deadline` for poll(), rounded up, capped at `capMs`; 0 once it has passed.
int msUntil(Deadline deadline, int capMs = 1000);

// ---- Addresses ------------------------------------------------------------------------------------------------

struct SockAddr {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = 0;
};
/// getaddrinfo for a TCP endpoint (a hostname or a literal), IPv4 addresses first so that every rank picks
/// the same family. Returns nothing and sets `error` when the name does not resolve.
std::vector<SockAddr> resolve(const std::string& host, int port, bool passive, std::string* error);
/// An IPv4 literal (empty: every interface); throws gdx::Error(kInvalidArgument) when `host` is not one.
SockAddr ipv4(const std::string& host, int port);

/// An IPv4 "host:port" split into its parts; throws gdx::Error(kInvalidArgument) when it is not one.
struct HostPort {
  std::string host;
  int port = 0;
  static HostPort parse(const std::string& address);
};
/// "host:port" with brackets around IPv6 literals, for messages.
std::string hostPort(const std::string& host, int port);

/// The local address of a connected socket (getsockname), as text without the port.
std::string localAddress(int fd);
/// "ip:port" of the other end of a connected socket, for log messages; "?" when it cannot tell.
std::string peerName(int fd);
/// The local IPv4 address the kernel would use to reach `host` (no packet is sent); "" when it cannot tell.
std::string localAddressToward(const std::string& host);

// ---- Listening and connecting ---------------------------------------------------------------------------------

/// How a socket is set up (every socket gdx opens is also non-blocking and close-on-exec): TCP_NODELAY, so that small
/// messages do not sit in Nagle's buffer. The send and receive buffers are left to the kernel's autotuning: a fixed
/// SO_SNDBUF / SO_RCVBUF turns it off and is capped at net.core.{w,r}mem_max (212992 bytes by default), so on most
/// hosts it shrank the window, and even under a raised cap (4 MiB on the development VM) 8 and 16 MiB transfers over
/// 4 sockets across network namespaces moved 6-9 % less than with autotuning (measured 2026-11-26).
void tuneSocket(int fd);
/// Makes a silent loss of the link (a cut cable, a host that vanished without a reset) an error on an idle `fd`
/// within about half of `timeoutNs` (at least 2 s), with keepalive probes. (A socket with unacknowledged data is the
/// sender's to bound: its stall limit of `timeoutNs` reports "no progress", which names the cause better than the
/// kernel's TCP_USER_TIMEOUT would; that option would also stretch or cut short the keepalive probing.) Whoever reads
/// the socket then sees the error and can fail that peer by name, instead of every wait on it running out with a
/// timeout that names no one.
void detectLinkLoss(int fd, uint64_t timeoutNs);

/// A listening socket bound to `a` (SO_REUSEADDR, so a restarted job can listen while old connections sit in
/// TIME_WAIT). An invalid one with `*err` set when bind() fails; other failures throw SystemError. Tuned
/// (tuneSocket): accepted sockets inherit its options.
UniqueFd listenAt(const SockAddr& a, int* err);
/// A listening socket on the IPv4 `bindAddress` (empty or "0.0.0.0": every interface), ephemeral port.
UniqueFd listenOn(const std::string& bindAddress, int* port);

/// One connect() attempt to `a`, bounded by `deadline`. Returns a connected, tuned socket, or an invalid one with
/// `*err` (an errno value; ETIMEDOUT when the deadline passed) and `*why` set.
UniqueFd connectOnce(const SockAddr& a, Deadline deadline, int* err, std::string* why);
/// How connectTo() retries while nobody listens at the address yet (connection refused, a full backlog, no answer).
/// The default, 50 ms pauses and silence, suits peers that start together (the ranks of the TCP transport).
struct ConnectRetry {
  uint64_t firstPauseNs = 50ull * 1000 * 1000;  ///< the pause after the first failed attempt
  uint64_t maxPauseNs = 50ull * 1000 * 1000;    ///< each pause doubles up to this
  /// "" : silent. Else the start of a WARN line after the first second of failed attempts and every 5 s after it:
  /// "<label>: connection refused, retrying for another 25 s (7 attempts so far)".
  std::string label;
  /// 10 ms, doubling to 1 s, reported under `label`: for a client whose server may start long after it.
  static ConnectRetry backoff(std::string label);
};
/// Connects to `address`, retrying while the listener is not there yet, until `deadline`. Returns a connected
/// socket, or an invalid one with `*why` naming the attempts, how long they took and the last error ("12 attempts
/// in 5003 ms, the last: Connection refused (ECONNREFUSED)"), or the one error that is not worth a retry.
UniqueFd connectTo(const HostPort& address, Deadline deadline, std::string* why,
                   const ConnectRetry& retry = ConnectRetry());
/// The symbolic name of an errno value ("ECONNREFUSED"), or its number as text for one it does not know.
std::string errnoName(int err);

// ---- Full-length transfers ------------------------------------------------------------------------------------

enum class IoResult { kOk, kEof, kError, kStalled, kTimeout, kAborted };

/// Outcome of a full-length transfer: kOk, or why it stopped (errno in `err` for kError).
struct IoStatus {
  IoResult result = IoResult::kOk;
  int err = 0;
  size_t done = 0;  ///< bytes transferred before it stopped
  bool ok() const { return result == IoResult::kOk; }
  /// The peer is gone: EOF, or a reset / broken connection.
  bool closed() const;
  std::string describe() const;
};

/// Returns true when a transfer in progress must give up (shutdown, failed peer).
using AbortCheck = std::function<bool()>;

/// When a transfer gives up.
struct IoLimits {
  Deadline deadline = kNoDeadline;  ///< kTimeout once this time passed
  uint64_t stallNs = UINT64_MAX;    ///< kStalled when no byte moved for this long
  AbortCheck abort;                 ///< kAborted when it returns true; checked at least every 100 ms while waiting
  /// Receiving only: waiting for the first byte is not bounded by `stallNs` (a quiet peer is healthy); once a
  /// byte arrived the rest must keep coming.
  bool idleOk = false;
};

/// Sends every byte of `iov` (which it consumes) without SIGPIPE.
IoStatus sendFull(int fd, iovec* iov, int iovcnt, const IoLimits& limits);
/// Receives exactly `n` bytes.
IoStatus recvFull(int fd, void* buf, size_t n, const IoLimits& limits);

}  // namespace gdx::net
