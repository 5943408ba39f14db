#include "bootstrap/frame_io.hpp"

#include "gdx/error.hpp"

namespace gdx::bootstrap {
namespace {

FrameIo outcome(const net::IoStatus& s, const char* call) {
  if (s.ok()) return FrameIo::kOk;
  if (s.closed()) return FrameIo::kClosed;
  if (s.result == net::IoResult::kTimeout) return FrameIo::kTimeout;
  throw SystemError(call, s.err, __FILE__, __LINE__);
}

net::IoLimits until(Deadline deadline) {
  net::IoLimits limits;
  limits.deadline = deadline;
  return limits;
}

}  // namespace

FrameIo sendFrame(int fd, MsgType type, const std::string& prefix, const std::string& body, Deadline deadline) {
  unsigned char header[kHeaderBytes];
  FrameHeader h;
  h.type = type;
  h.length = prefix.size() + body.size();
  encodeHeader(h, header);
  iovec iov[3] = {{header, kHeaderBytes},
                  {const_cast<char*>(prefix.data()), prefix.size()},
                  {const_cast<char*>(body.data()), body.size()}};
  return outcome(net::sendFull(fd, iov, 3, until(deadline)), "sendmsg");
}

FrameIo recvFrame(int fd, Frame& out, uint64_t maxPayload, Deadline deadline) {
  unsigned char header[kHeaderBytes];
  FrameIo s = outcome(net::recvFull(fd, header, kHeaderBytes, until(deadline)), "recv");
  if (s != FrameIo::kOk) return s;
  FrameHeader h = decodeHeader(header);
  std::string bad = checkFrameHeader(h, maxPayload);
  if (!bad.empty()) throw Error(ErrorCode::kProtocol, "the rendezvous peer sent " + bad);
  out.type = h.type;
  out.payload.assign(h.length, '\0');
  return outcome(net::recvFull(fd, out.payload.data(), h.length, until(deadline)), "recv");
}

}  // namespace gdx::bootstrap
