// Blocking-with-deadline frame transfer for the client side of the bootstrap (the server has its own
// event loop in server.cpp): one frame = header + payload, see protocol.hpp.
#pragma once

#include <string>

#include "bootstrap/protocol.hpp"
#include "sockets/socket.hpp"

namespace gdx::bootstrap {

using net::Deadline;

struct Frame {
  MsgType type = MsgType::kHello;
  std::string payload;
};

/// How a frame transfer that did not throw ended.
enum class FrameIo { kOk, kTimeout, kClosed };

/// Sends one frame whose payload is `prefix` followed by `body` (so a large blob is not copied to prepend
/// a sequence number). kClosed when the peer is gone; socket errors other than a reset throw SystemError.
FrameIo sendFrame(int fd, MsgType type, const std::string& prefix, const std::string& body, Deadline deadline);
/// Receives one frame. A header with the wrong magic or version, or a payload longer than `maxPayload`,
/// throws gdx::Error(kProtocol).
FrameIo recvFrame(int fd, Frame& out, uint64_t maxPayload, Deadline deadline);

}  // namespace gdx::bootstrap
