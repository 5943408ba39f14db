// RdmaTransport: UrlTransport's reports (Done, from the transport's threads) queued on the event base, where they
// resolve the futures or call the continuations. A wait's deadline is a timer of the event base that asks the
// transport to end the wait (UrlTransport::expireWait): the transport decides under its lock whether a write arriving
// at that moment is this wait's or a later one's, so a write is never given to a wait already reported as timed out.
#include "gdx/p2p/rdma_transport.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

namespace gdx::p2p {
namespace {

commResult_t commResultOf(ErrorCode c) {
  switch (c) {
    case ErrorCode::kOk: return commSuccess;
    case ErrorCode::kInvalidArgument: return commInvalidArgument;
    case ErrorCode::kTimeout: return commTimeout;
    case ErrorCode::kPeerFailed: return commRemoteError;
    case ErrorCode::kSystem: return commSystemError;
    case ErrorCode::kCuda: return commUnhandledCudaError;
    default: return commInternalError;
  }
}

/// A wait for a notified write: resolved once, in the event base's thread, by what the transport reported for it.
struct Wait {
  bool resolved = false;
  uint64_t timer = 0;
  std::atomic<uint64_t> ticket{0};  ///< the transport's, once waitForWrite returned it
  std::function<void(commResult_t)> then;
  void resolve(commResult_t r) {
    if (resolved) return;
    resolved = true;
    then(r);
  }
};

}  // namespace

const char* commResultName(commResult_t r) {
  switch (r) {
    case commSuccess: return "commSuccess";
    case commUnhandledCudaError: return "commUnhandledCudaError";
    case commSystemError: return "commSystemError";
    case commInternalError: return "commInternalError";
    case commInvalidArgument: return "commInvalidArgument";
    case commInvalidUsage: return "commInvalidUsage";
    case commRemoteError: return "commRemoteError";
    case commInProgress: return "commInProgress";
    case commTimeout: return "commTimeout";
  }
  return "unknown commResult_t";
}

commResult_t commResultOf(Status s) {
  switch (s) {
    case Status::kOk: return commSuccess;
    case Status::kTimeout: return commTimeout;
    case Status::kPeerFailed: return commRemoteError;
    case Status::kInvalidArgument: return commInvalidArgument;
    case Status::kProxyError:
    case Status::kShutdown: return commInternalError;
  }
  return commInternalError;
}

/// The transport while the RdmaTransport lives, for the waits' timers, which may fire after it is gone.
struct RdmaTransport::Live {
  std::mutex mutex;
  UrlTransport* transport = nullptr;
};

struct RdmaTransport::Names {
  std::mutex mutex;
  std::string url, peerUrl;
};

RdmaTransport::RdmaTransport(int cudaDev, EventBase* evb, const std::string& transport)
    : ownEvb_(evb ? nullptr : std::make_unique<ScopedEventBaseThread>("gdx-rdma-evb")),
      evb_(evb ? evb : ownEvb_->getEventBase()),
      timeoutMs_(static_cast<uint32_t>(
          std::min<uint64_t>(defaultTimeoutNs() / 1000000, std::numeric_limits<uint32_t>::max()))),
      names_(std::make_unique<Names>()),
      live_(std::make_shared<Live>()),
      transport_(std::make_unique<UrlTransport>(cudaDev, transport)) {
  live_->transport = transport_.get();
}

// No timer reaches the transport from here on; transport_ goes first (the members' order): it ends what still waits,
// whose results it queues on the event base, and ownEvb_, where there is one, runs them before its thread ends.
RdmaTransport::~RdmaTransport() {
  std::lock_guard<std::mutex> lock(live_->mutex);
  live_->transport = nullptr;
}

bool RdmaTransport::supported(const std::string& transport) {
  return UrlTransport::supported(transport);
}

std::string RdmaTransport::who() const {
  std::lock_guard<std::mutex> lock(names_->mutex);
  return "RdmaTransport " + (names_->url.empty() ? std::string("(unbound)") : names_->url) +
         (names_->peerUrl.empty() ? std::string() : " (peer " + names_->peerUrl + ")");
}

std::string RdmaTransport::bind() {
  const std::string url = transport_->bind();
  std::lock_guard<std::mutex> lock(names_->mutex);
  names_->url = url;
  return url;
}

commResult_t RdmaTransport::connect(const std::string& peerUrl) {
  {
    std::lock_guard<std::mutex> lock(names_->mutex);
    if (names_->url.empty()) {
      GDX_WARN("RdmaTransport: connect(" << peerUrl << "): call bind() first");
      return commInvalidUsage;
    }
  }
  try {
    transport_->startConnect(peerUrl);
  } catch (const Error& e) {
    GDX_WARN(e.what());
    return commResultOf(e.code());
  }
  std::lock_guard<std::mutex> lock(names_->mutex);
  names_->peerUrl = peerUrl;
  return commSuccess;
}

bool RdmaTransport::connected() const {
  return transport_->connected();
}

void RdmaTransport::write(RdmaMemory::View localBuffer, const RdmaRemoteBuffer& remoteBuffer, bool notify,
                          std::function<void(commResult_t)> then) {
  EventBase* evb = evb_;
  transport_->write(localBuffer, remoteBuffer, notify, [evb, then = std::move(then)](Status s) {
    evb->runInEventBaseThread([then, s] { then(commResultOf(s)); });
  });
}

std::future<commResult_t> RdmaTransport::write(RdmaMemory::View localBuffer, const RdmaRemoteBuffer& remoteBuffer,
                                               bool notify) {
  auto p = std::make_shared<std::promise<commResult_t>>();
  std::future<commResult_t> f = p->get_future();
  write(localBuffer, remoteBuffer, notify, [p](commResult_t r) { p->set_value(r); });
  return f;
}

void RdmaTransport::waitForWrite(std::function<void(commResult_t)> then) {
  auto w = std::make_shared<Wait>();
  w->then = std::move(then);
  EventBase* evb = evb_;
  // The timer first, so that the report (queued after this) finds its id to cancel. At the deadline the transport
  // ends the wait unless a write already went to it; a timer that fires before the ticket is known (a registration
  // slower than the whole timeout) ends it here.
  w->timer = evb->runAfterDelay(
      [w, live = live_] {
        const uint64_t ticket = w->ticket.load();
        std::lock_guard<std::mutex> lock(live->mutex);
        if (ticket == 0 && !w->resolved) w->resolve(commTimeout);
        if (ticket != 0 && live->transport) live->transport->expireWait(ticket);  // reports kTimeout through Done
      },
      timeoutMs_);
  const uint64_t ticket = transport_->waitForWrite([evb, w, who = who(), ms = timeoutMs_](Status s) {
    evb->runInEventBaseThread([evb, w, s, who, ms] {
      if (w->resolved) return;
      evb->cancelTimeout(w->timer);
      if (s == Status::kTimeout)
        GDX_WARN(who << ": waitForWrite: no notified write arrived within GDX_TIMEOUT_MS (" << ms << " ms)");
      w->resolve(commResultOf(s));
    });
  });
  w->ticket.store(ticket);
}

std::future<commResult_t> RdmaTransport::waitForWrite() {
  auto p = std::make_shared<std::promise<commResult_t>>();
  std::future<commResult_t> f = p->get_future();
  waitForWrite([p](commResult_t r) { p->set_value(r); });
  return f;
}

}  // namespace gdx::p2p
