// gdx::p2p::UrlTransport: the shape of an RDMA transport API with bind/connect URLs (one transport = one peer): bind()
// gives this side's URL, connect(url) joins the peer's, RegisteredMemory registers a buffer (RAII) whose remoteKey()
// the peer uses in a RemoteBuffer, write(view, remote, notify) returns a future, waitForWrite() waits for a notified
// write. examples/p2p_endpoint.cpp shows the calls (README.md quotes it). gdx/p2p/rdma_transport.hpp gives the same
// transport the names of torchcomms' RdmaTransport (RdmaTransport, RdmaMemory, commResult_t, an EventBase).
//
// Built on the same connections as Endpoint (GDX_TRANSPORT: tcp or verbs). The connection is made by a thread of the
// transport: connect() waits for it, startConnect() does not, and writes made meanwhile leave once it is up. Every
// future resolves within GDX_TIMEOUT_MS; a failure resolves it with the Status and logs the reason at WARN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "gdx/status.hpp"

namespace gdx::p2p {

/// Memory registered for UrlTransport writes (host memory, or GPU memory of `cudaDev`), for as long as it lives.
class RegisteredMemory {
 public:
  /// A piece of registered memory.
  class View {
   public:
    const void* data() const { return data_; }
    size_t size() const { return size_; }
    /// The memory it is a piece of (valid while that memory lives).
    const RegisteredMemory* operator->() const { return owner_; }
    /// The memory's id(), kept by value: a write with a view whose memory is gone is refused by name.
    uint32_t memoryId() const { return id_; }

   private:
    friend class RegisteredMemory;
    View(const RegisteredMemory* owner, const void* data, size_t size)
        : owner_(owner), data_(data), size_(size), id_(owner->id_) {}
    const RegisteredMemory* owner_;
    const void* data_;
    size_t size_;
    uint32_t id_;
  };

  RegisteredMemory(const void* buf, size_t len, int cudaDev = -1);
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  /// Throws gdx::Error(kInvalidArgument) when the range does not lie inside this memory.
  View view(size_t offset, size_t length) const;
  /// The same, named by an address inside this memory.
  View viewAt(const void* buf, size_t length) const;
  /// view() and viewAt() by torchcomms' names. The address form is a template so that `createView(0, n)` means an
  /// offset (a literal 0 would convert to a pointer as well as to size_t).
  View createView(size_t offset, size_t length) const { return view(offset, length); }
  template <typename T>
  View createView(const T* buf, size_t length) const {
    return viewAt(static_cast<const void*>(buf), length);
  }
  bool contains(const void* buf, size_t len) const;
  bool contains(const View& v) const { return contains(v.data(), v.size()); }
  /// What the peer needs, with an address inside this memory, to write into it.
  std::string remoteKey() const;
  /// A handle that names this registration in this process (its id as a pointer value; never null). The transports
  /// register memory with the NIC per connection, on first use, so there is no single local key to give.
  void* localKey() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(id_)); }
  /// The GPU given at registration (-1: host memory).
  int device() const { return device_; }
  int getDevice() const { return device_; }
  const void* data() const { return buf_; }
  size_t size() const { return len_; }
  uint32_t id() const { return id_; }

 private:
  const void* buf_;
  size_t len_;
  int device_;
  uint32_t id_;
};

/// A peer's memory: an address inside its RegisteredMemory and that memory's remoteKey().
struct RemoteBuffer {
  void* ptr = nullptr;
  std::string accessKey;
};

class UrlTransport {
 public:
  /// `transport`: "" = GDX_TRANSPORT ("tcp" or "verbs").
  explicit UrlTransport(int cudaDev = -1, const std::string& transport = "");
  /// Writes still in flight and waits still pending end with Status::kShutdown.
  ~UrlTransport();
  UrlTransport(const UrlTransport&) = delete;
  UrlTransport& operator=(const UrlTransport&) = delete;

  /// Whether `transport` ("" = GDX_TRANSPORT) can run on this machine (verbs: an RDMA device is present).
  static bool supported(const std::string& transport = "");
  /// Starts listening; returns this side's URL. Call once, before connect().
  std::string bind();
  /// Connects to the peer (which calls connect() or startConnect() with this side's URL) and returns once the
  /// connection is up; throws gdx::Error naming the URL when the peer does not come within GDX_TIMEOUT_MS, speaks
  /// another transport, or the URL is malformed.
  void connect(const std::string& peerUrl);
  /// Starts connecting and returns at once: the connection comes up in a thread of this transport (the peer may
  /// connect before or after, from any thread). Throws gdx::Error(kInvalidArgument) for what it can check at once
  /// (not bound, already connecting, a malformed URL, this side's own URL, another transport); a peer that does not
  /// come within GDX_TIMEOUT_MS fails the writes and waits made meanwhile, with the reason logged at WARN.
  void startConnect(const std::string& peerUrl);
  /// true once the connection is up and while it is healthy.
  bool connected() const;
  /// Writes `local` to `remote`; resolves once the data is in place at the peer. With `notify`, the peer's next
  /// waitForWrite() resolves when it arrived. Many writes may be in flight; a write made while the connection is
  /// still coming waits for it (within its own GDX_TIMEOUT_MS).
  std::future<Status> write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify);
  /// Resolves when the next notified write (in arrival order) arrived, kTimeout after GDX_TIMEOUT_MS, kPeerFailed
  /// once the connection failed. A wait that timed out takes no write: one arriving later goes to the next wait.
  std::future<Status> waitForWrite();

  /// Called once with how an operation ended, from a thread of the transport (or from inside one of its calls): it
  /// must not block nor call into the transport.
  using Done = std::function<void(Status)>;
  /// write() reporting to `done` instead of a future: in the calling thread when it is refused at once, else when it
  /// completed or failed (the transport fails it at GDX_TIMEOUT_MS).
  void write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify, Done done);
  /// waitForWrite() reporting to `done`: when the notified write arrived, the connection failed or could not be made,
  /// or the transport is destroyed (kShutdown). After GDX_TIMEOUT_MS it takes no write (the next arrival goes to a
  /// later wait, and calls this one with kTimeout). Returns the wait's ticket, for expireWait.
  uint64_t waitForWrite(Done done);
  /// Ends wait `ticket` now with kTimeout (its done is called, from this call) unless a write or a failure was given
  /// to it already (false): a caller with a deadline of its own ends the wait through this, so that a write arriving
  /// at that deadline goes either to this wait or to a later one, never to one whose caller stopped waiting.
  bool expireWait(uint64_t ticket);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::p2p
