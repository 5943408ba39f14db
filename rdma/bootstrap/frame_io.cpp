#include "rdma/bootstrap/frame_io.hpp"

namespace gdx::bootstrap {

IoStatus sendFrame(int fd, MsgType type, const std::string& prefix, const std::string& body, Deadline deadline) {
  unsigned char header[kHeaderBytes];
  FrameHeader h;
  h.type = type;
  h.length = prefix.size() + body.size();
  encodeHeader(h, header);
  std::vector<iovec> iov = {{header, kHeaderBytes},
                            {const_cast<char*>(prefix.data()), prefix.size()},
                            {const_cast<char*>(body.data()), body.size()}};
  return sendAll(fd, std::move(iov), deadline);
}

IoStatus recvFrame(int fd, Frame& out, uint64_t maxPayload, Deadline deadline) {
  unsigned char header[kHeaderBytes];
  IoStatus s = recvExact(fd, header, kHeaderBytes, deadline);
  if (s != IoStatus::kOk) return s;
  FrameHeader h = decodeHeader(header);
  if (h.magic != kMagic)
    throw Error(ErrorCode::kProtocol,
                "the rendezvous peer is not a gdx bootstrap (bad magic " + std::to_string(h.magic) + ")");
  if (h.version != kProtocolVersion)
    throw Error(ErrorCode::kProtocol, "the rendezvous peer speaks bootstrap protocol version " +
                                          std::to_string(h.version) + ", this build speaks " +
                                          std::to_string(kProtocolVersion));
  if (h.length > maxPayload)
    throw Error(ErrorCode::kProtocol, std::string("bootstrap ") + msgTypeName(h.type) + " message of " +
                                          std::to_string(h.length) + " bytes exceeds the limit of " +
                                          std::to_string(maxPayload));
  out.type = h.type;
  out.payload.assign(h.length, '\0');
  return recvExact(fd, out.payload.data(), h.length, deadline);
}

}  // namespace gdx::bootstrap
