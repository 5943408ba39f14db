// Receive side of the TCP transport: one thread per incoming socket. Every header is checked completely
// (format, lane, chunk length, window, range, ordering state) before a single payload byte is received, and
// the payload then goes straight into the window (under the window table's read lock, so that a window cannot be
// deregistered and its memory freed while a chunk is being received into it); anything malformed fails the peer
// instead. An atomic is checked the same way and performed by whichever receiver thread of its direction completes
// the messages before it (RxOrder); a control message names no window and is delivered the same way. A chunk for a
// GPU window is received into the thread's pinned staging buffer and copied to the GPU before it counts as placed.
#include <sys/socket.h>

#include <cstring>
#include <shared_mutex>
#include <sstream>

#include "base/log.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/common/window_table.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace gdx::tcp {

using net::IoResult;
using net::IoStatus;

void TcpTransport::receiverLoop(RxSocket& s) {
  common::CudaStaging staging(options_.chunkBytes, options_.timeoutNs);  // this thread's; pins memory only if needed
  while (receiveOne(s, staging)) {
  }
}

bool TcpTransport::receiveOne(RxSocket& s, common::CudaStaging& staging) {
  auto where = [&] {
    std::ostringstream os;
    os << "peer " << s.peer << " (lane " << s.lane << ", socket " << s.index << ")";
    return os.str();
  };
  // The connection broke: the peer may have said why on another socket (a refusal), which is waited for briefly.
  auto fail = [&](const std::string& what) {
    ::shutdown(s.fd.get(), SHUT_RDWR);
    if (!rxStop_.load()) failPeerAfterRefusalGrace(s.peer, where() + ": " + what);
    return false;
  };
  // What the peer sent is refused: it is told why before the connections close.
  auto refuse = [&](const std::string& what) {
    if (!rxStop_.load()) refusePeer(s.peer, where() + ": " + what);
    ::shutdown(s.fd.get(), SHUT_RDWR);
    return false;
  };
  net::IoLimits limits;
  limits.stallNs = options_.timeoutNs;
  limits.abort = [&] { return rxStop_.load() || peerState_[s.peer].load() == kPeerFailed; };
  limits.idleOk = true;

  MessageHeader h;
  IoStatus io = net::recvFull(s.fd.get(), &h, sizeof h, limits);
  if (!io.ok()) {
    if (io.result == IoResult::kAborted || rxStop_.load()) return false;
    if (io.result == IoResult::kEof && io.done == 0) return fail("connection closed without goodbye");
    return fail("receiving a header failed after " + std::to_string(io.done) + " bytes: " + io.describe());
  }
  std::string bad = checkHeader(h, static_cast<uint32_t>(s.lane), options_.chunkBytes);
  if (!bad.empty()) return refuse("malformed header: " + bad);
  if (h.type == static_cast<uint8_t>(MessageType::kRefusal)) {
    char reason[kMaxRefusalBytes];
    io = net::recvFull(s.fd.get(), reason, h.chunkBytes, limits);
    const std::string text = io.ok() ? std::string(reason, h.chunkBytes) : "(its reason was cut off)";
    ::shutdown(s.fd.get(), SHUT_RDWR);
    if (!rxStop_.load()) failPeer(s.peer, "peer " + std::to_string(s.peer) + " refused what this side sent: " + text);
    return false;
  }
  if (h.type == static_cast<uint8_t>(MessageType::kGoodbye)) {
    int expected = kPeerOk;
    if (peerState_[s.peer].compare_exchange_strong(expected, kPeerGoodbye))
      GDX_INFO("TCP transport rank " << rank_ << ": peer " << s.peer << " said goodbye");
    return false;
  }

  const bool atomic = h.type == static_cast<uint8_t>(MessageType::kAtomic);
  const bool control = h.type == static_cast<uint8_t>(MessageType::kControl);
  // An atomic's operand and a control message wait in RxOrder until their turn instead of going to a window.
  const bool deferred = atomic || control;
  char* dst = nullptr;
  int cudaDevice = -1;  // >= 0: dst is GPU memory of this device
  // Held until the payload is in the window: deregisterWindow() takes this lock exclusively, so it waits for a chunk
  // being received into the window, and a chunk that comes after it finds the window gone and is refused. Memory
  // is never written after its window was deregistered.
  std::shared_lock<std::shared_mutex> windowLock(windows_.mutex(), std::defer_lock);
  if (!control) {
    windowLock.lock();
    const common::LocalWindow* window = windows_.local(h.window);
    if (!window)
      return refuse(describe(h) + " names window " + std::to_string(h.window) + ", which is not registered here");
    if (window->access != RemoteAccess::kWrite &&
        (window->access == RemoteAccess::kNone || atomic || (h.flags & kFlagImm) == 0))
      return refuse(describe(h) + " into window " + std::to_string(h.window) + ": peers may not write there" +
                    (window->access == RemoteAccess::kNone ? "" : " except with an immediate") +
                    " (nothing was written)");
    bad = common::checkRange(h.offset, h.bytes, window->bytes);
    if (!bad.empty()) return refuse(describe(h) + " into window " + std::to_string(h.window) + ": " + bad);
    // checkHeader() put the chunk inside the message and checkRange() the message inside the window.
    dst = window->base + h.offset + h.chunkOffset;
    if (window->kind == MemoryKind::kCuda) cudaDevice = window->device;
    if (atomic && cudaDevice >= 0)
      return refuse(describe(h) + " on window " + std::to_string(h.window) + ": " + common::gpuAtomicRefusal("TCP"));
    if (atomic && reinterpret_cast<uintptr_t>(dst) % alignof(uint64_t) != 0)
      return refuse(describe(h) + ": the word is not 8-byte aligned in memory (window " + std::to_string(h.window) +
                    " starts at an unaligned address)");
  }
  RxOrder& order = *rxOrder_[static_cast<size_t>(s.lane) * world_ + s.peer];

  // A write's payload goes straight into the window; a deferred payload is received here first and admitted with
  // its message (checkHeader() bounded it by kMaxMessageBytes).
  uint8_t payload[kMaxMessageBytes];
  if (!deferred) {
    bad = order.admit(h);
    if (!bad.empty()) return refuse(describe(h) + ": " + bad);
  }
  void* into = deferred ? static_cast<void*>(payload) : dst;
  if (cudaDevice >= 0) {
    std::string why;
    into = staging.buffer(&why, cudaDevice);
    if (into == nullptr) return refuse("staging " + describe(h) + " for the GPU: " + why);
  }
  limits.idleOk = false;
  io = net::recvFull(s.fd.get(), into, h.chunkBytes, limits);
  if (!io.ok()) {
    if (io.result == IoResult::kAborted || rxStop_.load()) return false;
    return fail("receiving the payload of " + describe(h) + " failed after " + std::to_string(io.done) +
                " bytes: " + io.describe());
  }
  if (cudaDevice >= 0) {
    // Host -> GPU, finished before RxOrder hears of the chunk: announcements and atomics come after it.
    std::string why = staging.toDevice(dst, h.chunkBytes, cudaDevice);
    if (!why.empty())
      return refuse("placing " + describe(h) + " in GPU window " + std::to_string(h.window) + ": " + why);
  }
  if (deferred) {
    bad = order.admit(h, reinterpret_cast<uint64_t*>(dst), payload);
    if (!bad.empty()) return refuse(describe(h) + ": " + bad);
  }
  // The handlers below may call back into the transport (a relay sends); they run without the window lock.
  if (windowLock.owns_lock()) windowLock.unlock();
  order.placed(h, [&](const RxOrder::Message& m) {
    if (m.atomic) {
      uint64_t operand;
      std::memcpy(&operand, m.payload, sizeof operand);
      // Every earlier message of the direction is in place (their receivers released it through the order's
      // lock, which this thread holds), so a release here publishes all of it to whoever acquires the word.
      if (m.imm == static_cast<uint32_t>(SignalOp::kAdd))
        atomicFetchAdd(m.word, operand, kRelease);
      else
        atomicStore(m.word, operand, kRelease);
      return;
    }
    if (m.control) {
      RemoteMessage message;
      message.peer = s.peer;
      message.bytes = static_cast<uint32_t>(m.bytes);
      std::memcpy(message.data, m.payload, message.bytes);
      common::deliverMessage(messageHandler_, message, [&] { return "TCP transport rank " + std::to_string(rank_); });
      return;
    }
    if (!immHandler_) return;
    try {
      immHandler_(RemoteWrite{s.peer, m.window, m.offset, m.bytes, m.imm});
    } catch (const std::exception& e) {
      // The handler runs on a transport thread, where an exception would end the process.
      GDX_ERROR("TCP transport rank " << rank_ << ": the immediate handler threw for " << where() << ": " << e.what());
    }
  });
  return true;
}

}  // namespace gdx::tcp
