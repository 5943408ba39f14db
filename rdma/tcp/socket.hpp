// Socket helpers of the TCP transport: an owning fd, listening and connecting with deadlines, and full-length
// send/recv on non-blocking sockets that survive EINTR and partial transfers and never wait without a bound.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace gdx::tcp {

/// Owns a file descriptor; closes it on destruction.
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

/// An IPv4 "host:port" split into its parts; throws gdx::Error(kInvalidArgument) when it is not one.
struct HostPort {
  std::string host;
  int port = 0;
  static HostPort parse(const std::string& address);
};

/// TCP_NODELAY, large send/receive buffers, close-on-exec; non-blocking when asked.
void configureSocket(int fd, bool nonBlocking);
void setNonBlocking(int fd);

/// A listening socket on `bindAddress` (empty or "0.0.0.0": every interface), ephemeral port.
UniqueFd listenOn(const std::string& bindAddress, int* port);
/// The local address the kernel would use to reach `host` (no packet is sent); "" when it cannot tell.
std::string localAddressToward(const std::string& host);
/// "ip:port" of the other end of a connected socket, for log messages.
std::string peerName(int fd);

/// Connects to `address`, retrying while the listener is not there yet, until `deadlineNs` (gdx::nowNs()).
/// Returns a connected, configured, non-blocking socket, or an invalid one with `*why` set.
UniqueFd connectTo(const HostPort& address, uint64_t deadlineNs, std::string* why);

enum class IoResult { kOk, kEof, kError, kStalled, kAborted };

/// Outcome of a full-length transfer: kOk, or why it stopped (errno in `err` for kError).
struct IoStatus {
  IoResult result = IoResult::kOk;
  int err = 0;
  size_t done = 0;  ///< bytes transferred before it stopped
  bool ok() const { return result == IoResult::kOk; }
  std::string describe() const;
};

/// Returns true when a transfer in progress must give up (shutdown, failed peer).
using AbortCheck = std::function<bool()>;

/// Sends every byte of `iov` on a non-blocking socket. Fails with kStalled when the peer accepts no byte for
/// `stallNs`; `abort` is checked at least every 100 ms while waiting.
IoStatus sendFull(int fd, iovec* iov, int iovcnt, uint64_t stallNs, const AbortCheck& abort);
/// Receives exactly `n` bytes. With `idleOk`, waiting for the first byte is not bounded by `stallNs` (a quiet
/// peer is healthy) but still checks `abort`; once a byte arrived the rest must keep coming.
IoStatus recvFull(int fd, void* buf, size_t n, uint64_t stallNs, const AbortCheck& abort, bool idleOk);

}  // namespace gdx::tcp
