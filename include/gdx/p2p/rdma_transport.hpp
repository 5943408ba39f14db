// gdx::p2p::RdmaTransport: UrlTransport under the names of torchcomms' RdmaTransport, so that code written for it
// compiles with one line changed: `using namespace torch::comms;` becomes `using namespace gdx::p2p::compat;`, which
// also brings `folly::EventBase` and `folly::ScopedEventBaseThread` (gdx's own, event_base.hpp; with the real folly in
// the same program, name gdx::p2p::EventBase instead). examples/p2p_endpoint.cpp shows the calls.
//
// One transport is one peer. connect() returns at once and the connection comes up in the background: both sides
// may call it from one thread, in either order. write() and waitForWrite() made before it is up wait for it, within
// GDX_TIMEOUT_MS: a peer that never comes fails them (commTimeout, the log naming the peer's URL). Their futures are
// resolved in the event base's thread, the one given or, without one, a thread of the transport: do not get() them
// in that thread. Every future resolves within GDX_TIMEOUT_MS while the event base runs (a write's a little later
// where its data was still moving); an event base must outlive the transports that use it.
#pragma once

#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "gdx/p2p/event_base.hpp"
#include "gdx/p2p/url_transport.hpp"
#include "gdx/status.hpp"

namespace gdx::p2p {

/// How an operation ended, with the values and names of NCCL's ncclResult_t (commTimeout added).
enum commResult_t : int {
  commSuccess = 0,
  commUnhandledCudaError = 1,
  commSystemError = 2,      ///< a system call failed (listening, a socket)
  commInternalError = 3,    ///< the transport failed (a protocol or verbs error) or was destroyed meanwhile
  commInvalidArgument = 4,  ///< a view, key or URL that does not fit: a forged key, the peer's memory gone, ...
  commInvalidUsage = 5,     ///< connect() before bind()
  commRemoteError = 6,      ///< the peer failed or closed the connection
  commInProgress = 7,
  commTimeout = 8,  ///< not done within GDX_TIMEOUT_MS (a peer that never connected, a write that never arrived)
};

/// "commSuccess", "commTimeout", ...
const char* commResultName(commResult_t r);
/// The commResult_t of a gdx::Status.
commResult_t commResultOf(Status s);

/// Memory registered for writes for as long as it lives: RdmaMemory(buf, len, cudaDev), createView(offset, len),
/// createView(ptr, len), View::data()/size()/operator->, remoteKey(), localKey(), getDevice(), contains(buf, len).
using RdmaMemory = RegisteredMemory;
/// A peer's memory: {.ptr = an address inside its RdmaMemory, .accessKey = that memory's remoteKey()}.
using RdmaRemoteBuffer = RemoteBuffer;

class RdmaTransport {
 public:
  /// `cudaDev`: the GPU whose memory it moves (-1: host memory only). `evb`: where completions are delivered (null:
  /// a thread of this transport). `transport`: "" = GDX_TRANSPORT ("tcp" or "verbs").
  explicit RdmaTransport(int cudaDev, EventBase* evb = nullptr, const std::string& transport = "");
  /// Writes in flight and waits pending resolve (commInternalError when the transport ended them).
  ~RdmaTransport();
  RdmaTransport(const RdmaTransport&) = delete;
  RdmaTransport& operator=(const RdmaTransport&) = delete;

  /// Whether `transport` ("" = GDX_TRANSPORT) can run on this machine (verbs: an RDMA device is present).
  static bool supported(const std::string& transport = "");
  /// Starts listening; returns this side's URL for the peer.
  std::string bind();
  /// Starts connecting to the peer's URL and returns at once: commSuccess, or commInvalidArgument for a malformed
  /// URL (or this side's own, another transport's, a second connect() while connecting or connected),
  /// commInvalidUsage before bind(); the reason is logged at WARN. After a connection that could not be made,
  /// connect() may be called again.
  commResult_t connect(const std::string& peerUrl);
  /// true once the connection is up and while it is healthy.
  bool connected() const;
  /// Writes `localBuffer` into the peer's `remoteBuffer`; resolves once the data is in place there. With `notify`,
  /// the peer's next waitForWrite() resolves when it arrived. Many writes may be in flight.
  std::future<commResult_t> write(RdmaMemory::View localBuffer, const RdmaRemoteBuffer& remoteBuffer, bool notify);
  /// Resolves when the peer's next notified write (in arrival order) arrived; commTimeout after GDX_TIMEOUT_MS.
  std::future<commResult_t> waitForWrite();

  /// The same, calling `then` with the result in the event base's thread instead of resolving a future.
  void write(RdmaMemory::View localBuffer, const RdmaRemoteBuffer& remoteBuffer, bool notify,
             std::function<void(commResult_t)> then);
  void waitForWrite(std::function<void(commResult_t)> then);

  /// Where completions are delivered (the one given, else the transport's own).
  EventBase* getEventBase() const { return evb_; }

 private:
  std::string who() const;  ///< "RdmaTransport tcp://a:1 (peer tcp://b:2)"

  std::unique_ptr<ScopedEventBaseThread> ownEvb_;  ///< without an event base given; destroyed last
  EventBase* evb_;
  uint32_t timeoutMs_;
  struct Names;
  std::unique_ptr<Names> names_;  ///< this side's and the peer's URL, for messages
  struct Live;
  std::shared_ptr<Live> live_;               ///< transport_ for the waits' timers, until the destructor starts
  std::unique_ptr<UrlTransport> transport_;  ///< destroyed first: what still waits resolves on the event base
};

/// torchcomms' spelling: `using namespace gdx::p2p::compat;` brings RdmaTransport, RdmaMemory, RdmaRemoteBuffer,
/// commResult_t and its values, and folly::EventBase / folly::ScopedEventBaseThread / folly::SemiFuture (std::future:
/// get() and std::move(f).get() work; folly's continuations do not exist here: use the `then` forms above).
namespace compat {
using namespace gdx::p2p;  // NOLINT(google-build-using-namespace): what this namespace is for
namespace folly {
using gdx::p2p::EventBase;
using gdx::p2p::ScopedEventBaseThread;
template <typename T>
using SemiFuture = std::future<T>;
}  // namespace folly
}  // namespace compat

}  // namespace gdx::p2p
