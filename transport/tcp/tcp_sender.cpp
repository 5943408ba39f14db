// Send side of the TCP transport: TcpLane::post() validates a write and splits it into chunks over the lane's
// sockets to the peer, TcpLane::postAtomic() and postMessage() send an atomic or a control message as one message
// on the next socket; one sender thread per socket hands its chunks to the kernel in order (a chunk of a GPU window
// staged through the thread's pinned buffer first).
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/common/window_table.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace gdx::tcp {

using net::IoResult;
using net::IoStatus;

namespace {
// How long a sender whose socket broke waits for the peer's GOODBYE to show up on the receive side before it
// calls the break a failure: a peer that shuts down closes its end after saying goodbye, so the goodbye is
// already on its way.
constexpr uint64_t kGoodbyeGraceNs = 2000000000ull;
}  // namespace

TcpLane::TcpLane(TcpTransport& transport, int index, int worldSize)
    : t_(transport), index_(index), nextSeq_(worldSize, 0), nextSocket_(worldSize, 0) {}

std::string TcpLane::who() const {
  return "TCP transport rank " + std::to_string(t_.rank_) + " lane " + std::to_string(index_);
}

void TcpLane::post(const WriteOp& op) {
  std::string bad = common::checkWriteOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseWrite(who(), op, bad);
  const char* src = nullptr;
  int cudaDevice = -1;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    const common::LocalWindow* local = t_.windows_.findWrite(op, &bad).local;
    if (!local) common::refuseWrite(who(), op, bad);
    src = local->base + op.localOffset;
    if (local->kind == MemoryKind::kCuda) cudaDevice = local->device;
  }
  if (!admitOp(op.cookie, op.peer)) return;
  const common::FaultAction fault = t_.fault_.next(op.peer);

  const uint64_t chunk = t_.options_.chunkBytes;
  const uint64_t chunks = (op.bytes + chunk - 1) / chunk;
  auto* state = new OpState;
  state->remaining.store(static_cast<uint32_t>(std::min<uint64_t>(chunks, UINT32_MAX)));
  state->cookie = op.cookie;
  state->peer = op.peer;
  if (chunks > UINT32_MAX) {
    delete state;
    inFlight_.fetch_sub(1, std::memory_order_relaxed);
    common::refuseWrite(who(), op, "write needs more than 2^32 chunks; raise GDX_TCP_CHUNK");
  }

  MessageHeader h = nextMessage(MessageType::kWrite, op.peer, op.remoteWindow, op.remoteOffset, op.bytes);
  h.flags = op.withImm ? kFlagImm : 0;
  h.imm = op.imm;

  // Chunk i goes to socket (first + i) % sockets; each socket's share is queued under one lock. Starting where
  // the previous write stopped spreads streams of small writes over the sockets too.
  const int sockets = t_.sockets_;
  const uint32_t first = chunks == 1 ? socketForOne(op.peer, op.bytes) : nextSocket_[op.peer];
  if (chunks > 1) nextSocket_[op.peer] = static_cast<uint32_t>((first + chunks) % sockets);
  if (chunks == 1) {
    h.chunkOffset = 0;
    h.chunkBytes = static_cast<uint32_t>(op.bytes);
    TxItem item{h, src, state, cudaDevice};
    item.fault = fault;
    if (trySendNow(t_.txSocket(index_, op.peer, static_cast<int>(first)), item)) return;
  }
  for (int k = 0; k < sockets && static_cast<uint64_t>(k) < chunks; ++k) {
    int s = static_cast<int>((first + k) % sockets);
    TxSocket& tx = t_.txSocket(index_, op.peer, s);
    uint64_t refused = 0;  // finished outside the lock: the last one runs the completion handler
    {
      std::lock_guard<std::mutex> lock(tx.mutex);
      for (uint64_t i = k; i < chunks; i += sockets) {
        if (tx.closed) {  // a post racing with shutdown(): the sender thread is gone
          ++refused;
          continue;
        }
        h.chunkOffset = i * chunk;
        h.chunkBytes = static_cast<uint32_t>(std::min(chunk, op.bytes - h.chunkOffset));
        tx.queue.push_back(TxItem{h, src + h.chunkOffset, state, cudaDevice});
        if (i == 0) tx.queue.back().fault = fault;  // a write's fault strikes its first chunk
      }
    }
    for (; refused > 0; --refused) finishChunk(state, Status::kShutdown);
    tx.cv.notify_one();
  }
}

static_assert(kAtomicBytes == common::kAtomicWordBytes, "an atomic message carries the word the lane checked");

void TcpLane::postAtomic(const AtomicOp& op) {
  std::string bad = common::checkAtomicOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseAtomic(who(), op, bad);
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    // GPU windows are refused: the receiver would have to read-modify-write GPU memory with copies.
    if (!t_.windows_.findAtomicTarget(op, "TCP", &bad)) common::refuseAtomic(who(), op, bad);
  }
  if (!admitOp(op.cookie, op.peer)) return;

  MessageHeader h = nextMessage(MessageType::kAtomic, op.peer, op.remoteWindow, op.remoteOffset, kAtomicBytes);
  h.chunkBytes = kAtomicBytes;
  h.imm = static_cast<uint32_t>(op.kind);
  queueInline(h, op.peer, op.cookie, &op.value);
}

void TcpLane::postMessage(const MessageOp& op) {
  std::string bad = common::checkMessageOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseMessage(who(), op, bad);
  if (!admitOp(op.cookie, op.peer)) return;
  MessageHeader h = nextMessage(MessageType::kControl, op.peer, 0, 0, op.bytes);
  h.chunkBytes = op.bytes;
  queueInline(h, op.peer, op.cookie, op.data);
}

void TcpLane::queueInline(const MessageHeader& h, int peer, uint64_t cookie, const void* payload) {
  auto* state = new OpState;
  state->remaining.store(1);
  state->cookie = cookie;
  state->peer = peer;
  TxItem item{h, nullptr, state};
  std::memcpy(item.inlined, payload, h.chunkBytes);
  item.fault = t_.fault_.next(peer);
  // Any socket keeps the order (the receiver sequences by seq); the next one in turn spreads the load.
  const uint32_t s = socketForOne(peer, h.chunkBytes);
  TxSocket& tx = t_.txSocket(index_, peer, static_cast<int>(s));
  if (trySendNow(tx, item)) return;
  bool closed = false;
  {
    std::lock_guard<std::mutex> lock(tx.mutex);
    closed = tx.closed;  // a post racing with shutdown(): the sender thread is gone
    if (!closed) tx.queue.push_back(item);
  }
  if (closed) {
    finishChunk(state, Status::kShutdown);  // outside the lock: it runs the completion handler
    return;
  }
  tx.cv.notify_one();
}

uint32_t TcpLane::socketForOne(int peer, uint64_t bytes) {
  // In latency mode small messages share socket 0: back-to-back ones (a reply and the next clear-to-send, say) then
  // reach the peer's one receiver thread, which takes them in one wake-up, instead of waking one thread each.
  if (t_.options_.inlineSendBytes > 0 && bytes <= t_.options_.inlineSendBytes) return 0;
  const uint32_t s = nextSocket_[peer];
  nextSocket_[peer] = (s + 1) % static_cast<uint32_t>(t_.sockets_);
  return s;
}

bool TcpLane::trySendNow(TxSocket& tx, const TxItem& item) {
  // Only what cannot block for long or needs the sender thread's staging buffer: one small chunk of host memory.
  if (item.header.chunkBytes > t_.options_.inlineSendBytes || item.cudaDevice >= 0 ||
      item.fault != common::FaultAction::kNone)
    return false;
  {
    std::lock_guard<std::mutex> lock(tx.mutex);
    if (tx.closed || tx.sending || !tx.queue.empty()) return false;  // queued chunks go first, in order
    tx.sending = true;
  }
  finishChunk(item.op, t_.sendItem(tx, item, nullptr));
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(tx.mutex);
    tx.sending = false;
    more = !tx.queue.empty() || tx.goodbye;
  }
  if (more) tx.cv.notify_one();  // the sender thread waited for the socket
  return true;
}

MessageHeader TcpLane::nextMessage(MessageType type, int peer, uint32_t window, uint64_t offset, uint64_t bytes) {
  MessageHeader h;
  h.type = static_cast<uint8_t>(type);
  h.lane = static_cast<uint32_t>(index_);
  h.window = window;
  h.seq = nextSeq_[peer]++;
  h.offset = offset;
  h.bytes = bytes;
  return h;
}

bool TcpLane::admitOp(uint64_t cookie, int peer) {
  inFlight_.fetch_add(1, std::memory_order_relaxed);
  Status early = t_.failedStatus(peer);
  if (early == Status::kOk) return true;
  complete(cookie, peer, early);
  return false;
}

size_t TcpLane::poll(Completion* out, size_t max) {
  std::lock_guard<std::mutex> lock(doneMutex_);
  const size_t n = common::takeCompletions(done_, out, max);
  inFlight_.fetch_sub(n, std::memory_order_relaxed);
  return n;
}

void TcpLane::complete(uint64_t cookie, int peer, Status status) {
  {
    std::lock_guard<std::mutex> lock(doneMutex_);
    done_.push_back(Completion{cookie, status, peer});
  }
  // After the push: an armed waiter that is woken finds the completion when it polls.
  if (armed_.load() && armed_.exchange(false) && t_.completionHandler_) t_.completionHandler_(index_);
}

bool TcpLane::armCompletion() {
  armed_.store(true);
  return true;
}

void TcpLane::finishChunk(OpState* op, Status status) {
  if (status != Status::kOk) {
    uint32_t ok = static_cast<uint32_t>(Status::kOk);
    op->status.compare_exchange_strong(ok, static_cast<uint32_t>(status));
  }
  if (op->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    complete(op->cookie, op->peer, static_cast<Status>(op->status.load()));
    delete op;
  }
}

void TcpTransport::senderLoop(TxSocket& s) {
  TcpLane& lane = *lanes_[s.lane];
  common::CudaStaging staging(options_.chunkBytes, options_.timeoutNs);  // this thread's; pins memory only if needed
  for (;;) {
    TxItem item;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      // Woken by post(), shutdown() and failPeer(); the timeout only bounds a missed wake-up. A poster sending
      // inline has the socket meanwhile (`sending`), and wakes this thread when it is done.
      while ((s.queue.empty() && !s.goodbye) || s.sending) s.cv.wait_for(lock, std::chrono::milliseconds(100));
      if (s.queue.empty()) {
        s.closed = true;  // post() completes anything that comes later itself
        break;
      }
      item = s.queue.front();
      s.queue.pop_front();
      s.sending = true;
    }
    lane.finishChunk(item.op, sendItem(s, item, &staging));
    std::lock_guard<std::mutex> lock(s.mutex);
    s.sending = false;
  }
  sayGoodbye(s);
}

Status TcpTransport::sendItem(TxSocket& s, const TxItem& item, common::CudaStaging* staging) {
  Status status = Status::kOk;
  if (txAborted())
    status = Status::kShutdown;
  else if (s.broken || peerState_[s.peer].load() != kPeerOk)
    status = failedStatus(s.peer);
  else if (item.fault != common::FaultAction::kNone)
    status = sendFaulty(s, item, staging);
  else
    status = sendChunk(s, item, staging);
  // A chunk the kernel took whole is complete at the source (its buffer may be reused) even if the peer is found
  // dead meanwhile: that peer may well have received it (a signal it acted on before dying), and later operations
  // to it fail by the check above.
  return status;
}

Status TcpTransport::sendChunk(TxSocket& s, const TxItem& item, common::CudaStaging* staging) {
  const char* payload = item.data;
  if (item.data != nullptr && item.cudaDevice >= 0) {
    // A chunk of a GPU window: device -> this thread's pinned buffer, finished before a byte of it is sent (only
    // the sender thread has a staging buffer; inline sends are of host memory).
    std::string bad = staging->fromDevice(item.data, item.header.chunkBytes, item.cudaDevice);
    if (!bad.empty()) {
      // Nothing of the chunk went out, but the receiver cannot complete the direction without it: the peer fails,
      // as a queue pair goes to the error state after a local error.
      s.broken = true;
      std::ostringstream why;
      why << "staging a chunk of " << describe(item.header) << " for peer " << s.peer << " on lane " << s.lane
          << " socket " << s.index << " from the GPU failed: " << bad;
      if (stopping_.load()) return Status::kShutdown;
      failPeer(s.peer, why.str());
      return Status::kPeerFailed;
    }
    std::string unused;
    payload = staging->buffer(&unused, item.cudaDevice);  // filled by fromDevice() just above
  }
  iovec iov[2];
  iov[0].iov_base = const_cast<MessageHeader*>(&item.header);
  iov[0].iov_len = sizeof(MessageHeader);
  iov[1].iov_base =
      payload ? static_cast<void*>(const_cast<char*>(payload)) : static_cast<void*>(const_cast<uint8_t*>(item.inlined));
  iov[1].iov_len = item.header.chunkBytes;
  net::IoLimits limits;
  limits.stallNs = options_.timeoutNs;
  limits.abort = [&] { return txAborted() || peerState_[s.peer].load() == kPeerFailed; };
  IoStatus io = net::sendFull(s.fd.get(), iov, 2, limits);
  if (io.ok()) return Status::kOk;
  std::ostringstream why;
  why << "sending a chunk of " << describe(item.header) << " to peer " << s.peer << " on lane " << s.lane << " socket "
      << s.index << " failed after " << io.done << " bytes: " << io.describe();
  return onSendFailure(s, io, why.str());
}

// GDX_FAULT's chosen chunk (transport/common/fault.hpp).
Status TcpTransport::sendFaulty(TxSocket& s, TxItem item, common::CudaStaging* staging) {
  const std::string what = fault_.plan().describe() + ": " + describe(item.header);
  switch (item.fault) {
    case common::FaultAction::kDrop: GDX_WARN("TCP transport rank " << rank_ << ": " << what); return Status::kOk;
    case common::FaultAction::kDelay:
      GDX_WARN("TCP transport rank " << rank_ << ": " << what);
      // Ended early by the shutdown's drain deadline or a failed peer; the chunk is then not sent, as any other
      // chunk still queued at that point.
      if (!fault_.sleepDelay([&] { return txAborted() || peerState_[s.peer].load() == kPeerFailed; }))
        return txAborted() ? Status::kShutdown : failedStatus(s.peer);
      return sendChunk(s, item, staging);
    case common::FaultAction::kCorrupt:
      GDX_WARN("TCP transport rank " << rank_ << ": " << what);
      item.header.magic ^= 0x5a5a5a5au;
      return sendChunk(s, item, staging);
    case common::FaultAction::kClose:
      // The peer is failed first, so that the cause kept is the fault, not the closed connection it leads to.
      s.broken = true;
      failPeer(s.peer, what + ": the connection was shut down");
      ::shutdown(s.fd.get(), SHUT_RDWR);
      return Status::kPeerFailed;
    case common::FaultAction::kNone: break;
  }
  return sendChunk(s, item, staging);
}

Status TcpTransport::onSendFailure(TxSocket& s, const IoStatus& io, const std::string& why) {
  // A partly sent chunk leaves the stream out of step, so this socket never sends again.
  s.broken = true;
  if (stopping_.load()) return Status::kShutdown;
  if (io.result == IoResult::kAborted) return failedStatus(s.peer);
  // Only a closed or reset connection can be the tail of a goodbye; a stall is a failure right away.
  uint64_t grace = io.result == IoResult::kError || io.result == IoResult::kEof ? kGoodbyeGraceNs : 0;
  uint64_t until = nowNs() + std::min(grace, options_.timeoutNs);
  while (peerState_[s.peer].load() == kPeerOk && nowNs() < until && !txAborted())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (peerState_[s.peer].load() == kPeerGoodbye) return Status::kShutdown;
  failPeer(s.peer, why);
  return Status::kPeerFailed;
}

void TcpTransport::sayGoodbye(TxSocket& s) {
  if (!s.goodbye || s.broken || txAborted() || peerState_[s.peer].load() != kPeerOk) return;
  MessageHeader h;
  h.type = static_cast<uint8_t>(MessageType::kGoodbye);
  h.lane = static_cast<uint32_t>(s.lane);
  iovec iov{&h, sizeof h};
  net::IoLimits limits;
  limits.stallNs = options_.timeoutNs;
  limits.abort = [&] { return txAborted(); };
  IoStatus io = net::sendFull(s.fd.get(), &iov, 1, limits);
  if (!io.ok())
    GDX_INFO("TCP transport rank " << rank_ << ": goodbye to peer " << s.peer << " lane " << s.lane << " socket "
                                   << s.index << " not sent: " << io.describe());
}

}  // namespace gdx::tcp
