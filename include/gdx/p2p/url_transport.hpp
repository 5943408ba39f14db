// gdx::p2p::UrlTransport: the shape of an RDMA transport API with bind/connect URLs (one transport = one peer): bind()
// gives this side's URL, connect(url) joins the peer's, RegisteredMemory registers a buffer (RAII) whose remoteKey()
// the peer uses in a RemoteBuffer, write(view, remote, notify) returns a future, waitForWrite() waits for a notified
// write. examples/p2p_endpoint.cpp shows the calls (README.md quotes it).
//
// Built on the same connections as Endpoint (GDX_TRANSPORT: tcp or verbs). Every future resolves within
// GDX_TIMEOUT_MS; a failure resolves it with the Status and logs the reason at WARN.
#pragma once

#include <cstddef>
#include <cstdint>
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
    const RegisteredMemory* operator->() const { return owner_; }

   private:
    friend class RegisteredMemory;
    View(const RegisteredMemory* owner, const void* data, size_t size) : owner_(owner), data_(data), size_(size) {}
    const RegisteredMemory* owner_;
    const void* data_;
    size_t size_;
  };

  RegisteredMemory(const void* buf, size_t len, int cudaDev = -1);
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  /// Throws gdx::Error(kInvalidArgument) when the range does not lie inside this memory.
  View view(size_t offset, size_t length) const;
  /// The same, named by an address inside this memory.
  View viewAt(const void* buf, size_t length) const;
  bool contains(const void* buf, size_t len) const;
  bool contains(const View& v) const { return contains(v.data(), v.size()); }
  /// What the peer needs, with an address inside this memory, to write into it.
  std::string remoteKey() const;
  int device() const { return device_; }
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
  ~UrlTransport();
  UrlTransport(const UrlTransport&) = delete;
  UrlTransport& operator=(const UrlTransport&) = delete;

  /// Whether `transport` ("" = GDX_TRANSPORT) can run on this machine (verbs: an RDMA device is present).
  static bool supported(const std::string& transport = "");
  /// Starts listening; returns this side's URL. Call once, before connect().
  std::string bind();
  /// Connects to the peer (which calls connect() with this side's URL); throws gdx::Error naming the URL when the
  /// peer does not answer within GDX_TIMEOUT_MS, speaks another transport, or the URL is malformed.
  void connect(const std::string& peerUrl);
  bool connected() const;
  /// Writes `local` to `remote`; resolves once the data is in place at the peer. With `notify`, the peer's next
  /// waitForWrite() resolves when it arrived. Many writes may be in flight.
  std::future<Status> write(RegisteredMemory::View local, const RemoteBuffer& remote, bool notify);
  /// Resolves when the next notified write (in arrival order) arrived, kTimeout after GDX_TIMEOUT_MS.
  std::future<Status> waitForWrite();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::p2p
