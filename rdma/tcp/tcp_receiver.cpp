// Receive side of the TCP transport: one thread per incoming socket. Every header is checked completely
// (format, lane, chunk length, window, range, ordering state) before a single payload byte is received, and
// the payload then goes straight into the window; anything malformed fails the peer instead.
#include <sys/socket.h>

#include <sstream>

#include "gdx/log.hpp"
#include "rdma/tcp/tcp_transport.hpp"

namespace gdx::tcp {

void TcpTransport::receiverLoop(RxSocket& s) {
  while (receiveOne(s)) {
  }
}

bool TcpTransport::receiveOne(RxSocket& s) {
  auto where = [&] {
    std::ostringstream os;
    os << "peer " << s.peer << " (lane " << s.lane << ", socket " << s.index << ")";
    return os.str();
  };
  auto fail = [&](const std::string& what) {
    ::shutdown(s.fd.get(), SHUT_RDWR);
    if (!rxStop_.load()) failPeer(s.peer, where() + ": " + what);
    return false;
  };
  AbortCheck abort = [&] { return rxStop_.load() || peerState_[s.peer].load() == kPeerFailed; };

  MessageHeader h;
  IoStatus io = recvFull(s.fd.get(), &h, sizeof h, options_.timeoutNs, abort, /*idleOk=*/true);
  if (!io.ok()) {
    if (io.result == IoResult::kAborted || rxStop_.load()) return false;
    if (io.result == IoResult::kEof && io.done == 0) return fail("connection closed without goodbye");
    return fail("receiving a header failed after " + std::to_string(io.done) + " bytes: " + io.describe());
  }
  std::string bad = checkHeader(h, static_cast<uint32_t>(s.lane), options_.chunkBytes);
  if (!bad.empty()) return fail("malformed header: " + bad);
  if (h.type == static_cast<uint8_t>(MessageType::kGoodbye)) {
    int expected = kPeerOk;
    if (peerState_[s.peer].compare_exchange_strong(expected, kPeerGoodbye))
      GDX_INFO("TCP transport rank " << rank_ << ": peer " << s.peer << " said goodbye");
    return false;
  }

  char* dst = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(windowsMutex_);
    auto it = windows_.find(h.window);
    if (it == windows_.end())
      return fail("write " + describe(h) + " names window " + std::to_string(h.window) +
                  ", which is not registered here");
    bad = checkRange(h.offset, h.bytes, it->second.bytes);
    if (!bad.empty()) return fail("write " + describe(h) + " into window " + std::to_string(h.window) + ": " + bad);
    // checkHeader() put the chunk inside the message and checkRange() the message inside the window.
    dst = it->second.base + h.offset + h.chunkOffset;
  }
  RxOrder& order = *rxOrder_[static_cast<size_t>(s.lane) * world_ + s.peer];
  bad = order.admit(h);
  if (!bad.empty()) return fail("write " + describe(h) + ": " + bad);

  io = recvFull(s.fd.get(), dst, h.chunkBytes, options_.timeoutNs, abort, /*idleOk=*/false);
  if (!io.ok()) {
    if (io.result == IoResult::kAborted || rxStop_.load()) return false;
    return fail("receiving the payload of " + describe(h) + " failed after " + std::to_string(io.done) +
                " bytes: " + io.describe());
  }
  order.placed(h, [&](const RxOrder::Message& m) {
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
