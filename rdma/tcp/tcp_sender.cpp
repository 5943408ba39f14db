// Send side of the TCP transport: TcpLane::post() validates a write and splits it into chunks over the lane's
// sockets to the peer; one sender thread per socket hands its chunks to the kernel in order.
#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "gdx/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/log.hpp"
#include "rdma/tcp/tcp_transport.hpp"

namespace gdx::tcp {
namespace {
// How long a sender whose socket broke waits for the peer's GOODBYE to show up on the receive side before it
// calls the break a failure: a peer that shuts down closes its end after saying goodbye, so the goodbye is
// already on its way.
constexpr uint64_t kGoodbyeGraceNs = 2000000000ull;
}  // namespace

TcpLane::TcpLane(TcpTransport& transport, int index, int worldSize)
    : t_(transport), index_(index), nextSeq_(worldSize, 0), nextSocket_(worldSize, 0) {}

void TcpLane::post(const WriteOp& op) {
  auto invalid = [&](const std::string& what) {
    std::ostringstream os;
    os << "TCP transport rank " << t_.rank_ << " lane " << index_ << ": write to peer " << op.peer << " (local window "
       << op.localWindow << " offset " << op.localOffset << ", remote window " << op.remoteWindow << " offset "
       << op.remoteOffset << ", " << op.bytes << " bytes): " << what;
    throw Error(ErrorCode::kInvalidArgument, os.str());
  };
  if (!t_.connected_) invalid("the transport is not connected");
  if (op.peer < 0 || op.peer >= t_.world_) invalid("unknown peer (world size " + std::to_string(t_.world_) + ")");
  if (op.bytes == 0) invalid("zero-byte write");
  const char* src = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    auto local = t_.windows_.find(op.localWindow);
    if (local == t_.windows_.end()) invalid("local window " + std::to_string(op.localWindow) + " is not registered");
    std::string bad = checkRange(op.localOffset, op.bytes, local->second.bytes);
    if (!bad.empty()) invalid("local window " + std::to_string(op.localWindow) + ": " + bad);
    auto& remotes = t_.remoteWindows_[op.peer];
    auto remote = remotes.find(op.remoteWindow);
    if (remote == remotes.end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " of peer " + std::to_string(op.peer) +
              " is not known");
    bad = checkRange(op.remoteOffset, op.bytes, remote->second);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + ": " + bad);
    src = local->second.base + op.localOffset;
  }

  inFlight_.fetch_add(1, std::memory_order_relaxed);
  Status early = t_.failedStatus(op.peer);
  if (early != Status::kOk) {
    complete(op.cookie, op.peer, early);
    return;
  }

  const uint64_t chunk = t_.options_.chunkBytes;
  const uint64_t chunks = (op.bytes + chunk - 1) / chunk;
  auto* state = new OpState;
  state->remaining.store(static_cast<uint32_t>(std::min<uint64_t>(chunks, UINT32_MAX)));
  state->cookie = op.cookie;
  state->peer = op.peer;
  if (chunks > UINT32_MAX) {
    delete state;
    inFlight_.fetch_sub(1, std::memory_order_relaxed);
    invalid("write needs more than 2^32 chunks; raise GDX_TCP_CHUNK");
  }

  MessageHeader h;
  h.type = static_cast<uint8_t>(MessageType::kWrite);
  h.flags = op.withImm ? kFlagImm : 0;
  h.lane = static_cast<uint32_t>(index_);
  h.window = op.remoteWindow;
  h.seq = nextSeq_[op.peer]++;
  h.offset = op.remoteOffset;
  h.bytes = op.bytes;
  h.imm = op.imm;

  // Chunk i goes to socket (first + i) % sockets; each socket's share is queued under one lock. Starting where
  // the previous write stopped spreads streams of small writes over the sockets too.
  const int sockets = t_.sockets_;
  const uint32_t first = nextSocket_[op.peer];
  nextSocket_[op.peer] = static_cast<uint32_t>((first + chunks) % sockets);
  for (int k = 0; k < sockets && static_cast<uint64_t>(k) < chunks; ++k) {
    int s = static_cast<int>((first + k) % sockets);
    TxSocket& tx = t_.txSocket(index_, op.peer, s);
    {
      std::lock_guard<std::mutex> lock(tx.mutex);
      for (uint64_t i = k; i < chunks; i += sockets) {
        if (tx.closed) {  // a post racing with shutdown(): the sender thread is gone
          finishChunk(state, Status::kShutdown);
          continue;
        }
        h.chunkOffset = i * chunk;
        h.chunkBytes = static_cast<uint32_t>(std::min(chunk, op.bytes - h.chunkOffset));
        tx.queue.push_back(TxItem{h, src + h.chunkOffset, state});
      }
    }
    tx.cv.notify_one();
  }
}

size_t TcpLane::poll(Completion* out, size_t max) {
  std::lock_guard<std::mutex> lock(doneMutex_);
  size_t n = std::min(max, done_.size());
  for (size_t i = 0; i < n; ++i) {
    out[i] = done_.front();
    done_.pop_front();
  }
  inFlight_.fetch_sub(n, std::memory_order_relaxed);
  return n;
}

void TcpLane::complete(uint64_t cookie, int peer, Status status) {
  std::lock_guard<std::mutex> lock(doneMutex_);
  done_.push_back(Completion{cookie, status, peer});
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
  for (;;) {
    TxItem item;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      // Woken by post(), shutdown() and failPeer(); the timeout only bounds a missed wake-up.
      while (s.queue.empty() && !s.goodbye) s.cv.wait_for(lock, std::chrono::milliseconds(100));
      if (s.queue.empty()) {
        s.closed = true;  // post() completes anything that comes later itself
        break;
      }
      item = s.queue.front();
      s.queue.pop_front();
    }
    Status status = Status::kOk;
    if (txAborted())
      status = Status::kShutdown;
    else if (s.broken || peerState_[s.peer].load() != kPeerOk)
      status = failedStatus(s.peer);
    else
      status = sendChunk(s, item);
    if (status == Status::kOk && peerState_[s.peer].load() == kPeerFailed) status = Status::kPeerFailed;
    lane.finishChunk(item.op, status);
  }
  sayGoodbye(s);
}

Status TcpTransport::sendChunk(TxSocket& s, const TxItem& item) {
  iovec iov[2];
  iov[0].iov_base = const_cast<MessageHeader*>(&item.header);
  iov[0].iov_len = sizeof(MessageHeader);
  iov[1].iov_base = const_cast<char*>(item.data);
  iov[1].iov_len = item.header.chunkBytes;
  IoStatus io = sendFull(s.fd.get(), iov, 2, options_.timeoutNs,
                         [&] { return txAborted() || peerState_[s.peer].load() == kPeerFailed; });
  if (io.ok()) return Status::kOk;
  std::ostringstream why;
  why << "sending a chunk " << describe(item.header) << " to peer " << s.peer << " on lane " << s.lane << " socket "
      << s.index << " failed after " << io.done << " bytes: " << io.describe();
  return onSendFailure(s, io, why.str());
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
  IoStatus io = sendFull(s.fd.get(), &iov, 1, options_.timeoutNs, [&] { return txAborted(); });
  if (!io.ok())
    GDX_INFO("TCP transport rank " << rank_ << ": goodbye to peer " << s.peer << " lane " << s.lane << " socket "
                                   << s.index << " not sent: " << io.describe());
}

}  // namespace gdx::tcp
