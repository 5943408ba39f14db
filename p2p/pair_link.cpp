#include "p2p/pair_link.hpp"

#include <cstdio>
#include <mutex>
#include <random>

#include "gdx/config.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"
#include "p2p/bytes.hpp"

namespace gdx::p2p {
namespace {

constexpr uint32_t kHelloMagic = 0x50584447;  // "GDXP"
constexpr uint16_t kHelloVersion = 2;         // 2: the dialler's TCP sockets and chunk size
constexpr size_t kMaxHandshakeBytes = 16384;

std::string hexSecret() {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(randomU64()),
                static_cast<unsigned long long>(randomU64()));
  return buf;
}

/// How the TCP transport of a connection splits its data; the dialler's environment decides for both sides.
struct TcpShape {
  uint16_t sockets = 0;
  uint64_t chunkBytes = 0;
};

TcpShape tcpShapeFromEnv() {
  TcpTransportOptions t = TcpTransportOptions::fromEnv(0, 2, "");
  return TcpShape{static_cast<uint16_t>(t.socketsPerPeer), t.chunkBytes};
}

/// Eager sends and control messages, and a little more.
constexpr size_t kInlineSendBytes = 16 << 10;

std::unique_ptr<Transport> makePairTransport(const std::string& kind, int rank, const std::string& secret,
                                             const std::string& bindAddress, uint64_t timeoutNs, const TcpShape& shape,
                                             std::string* detail) {
  if (kind == "tcp") {
    TcpTransportOptions t = TcpTransportOptions::fromEnv(rank, 2, secret);
    t.bindAddress = bindAddress;
    t.timeoutNs = timeoutNs;
    t.socketsPerPeer = shape.sockets;
    t.chunkBytes = shape.chunkBytes;
    // An endpoint's caller posts a small message and waits for it: sending it from that thread saves a hand-off.
    t.inlineSendBytes = kInlineSendBytes;
    *detail = "tcp, " + std::to_string(t.socketsPerPeer) + " sockets, " + std::to_string(t.chunkBytes) + "-byte chunks";
    return makeTcpTransport(t);
  }
  if (kind == "verbs") {
#if defined(GDX_HAVE_VERBS)
    VerbsTransportOptions v = VerbsTransportOptions::fromEnv(rank, 2);
    v.lanes = 1;
    v.timeoutNs = timeoutNs;
    *detail = "verbs, RC";
    return makeVerbsTransport(v);
#else
    throw Error(ErrorCode::kInvalidArgument, "transport 'verbs': gdx was built without libibverbs");
#endif
  }
  throw Error(ErrorCode::kInvalidArgument,
              "transport '" + kind + "' cannot connect two endpoints; use tcp or verbs (GDX_TRANSPORT)");
}

[[noreturn]] void refused(const std::string& who, const std::string& why) {
  throw Error(ErrorCode::kProtocol, who + ": " + why);
}

}  // namespace

uint64_t randomU64() {
  static std::random_device rd;
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  return (uint64_t{rd()} << 32) ^ rd();
}

std::string linkTransportFromEnv() {
  std::string t = envChoice("GDX_TRANSPORT", "tcp");
  if (t == "loopback") return "tcp";  // a link always has two sides; loopback is the Context's world of one
  return t;
}

void sendBlob(int fd, const std::string& blob, net::Deadline deadline, const std::string& who) {
  uint32_t len = static_cast<uint32_t>(blob.size());
  iovec iov[2] = {{&len, sizeof len}, {const_cast<char*>(blob.data()), blob.size()}};
  net::IoLimits limits;
  limits.deadline = deadline;
  net::IoStatus s = net::sendFull(fd, iov, 2, limits);
  if (!s.ok())
    throw Error(s.result == net::IoResult::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerFailed,
                who + ": sending the handshake: " + s.describe());
}

std::string recvBlob(int fd, size_t max, net::Deadline deadline, const std::string& who) {
  net::IoLimits limits;
  limits.deadline = deadline;
  uint32_t len = 0;
  net::IoStatus s = net::recvFull(fd, &len, sizeof len, limits);
  if (s.ok() && len > max)
    throw Error(ErrorCode::kProtocol,
                who + ": a handshake of " + std::to_string(len) + " bytes (at most " + std::to_string(max) + ")");
  std::string blob(len, '\0');
  if (s.ok() && len > 0) s = net::recvFull(fd, &blob[0], len, limits);
  if (!s.ok())
    throw Error(s.result == net::IoResult::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerFailed,
                who + ": receiving the handshake: " + s.describe());
  return blob;
}

PairLink dialLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                  net::Deadline deadline, const std::string& who) {
  PairLink link;
  link.self = 0;
  link.peerIp = net::peerName(fd.get());
  const std::string secret = hexSecret();
  const TcpShape shape = transport == "tcp" ? tcpShapeFromEnv() : TcpShape{};
  link.transport = makePairTransport(transport, 0, secret, net::localAddress(fd.get()), timeoutNs, shape, &link.detail);
  ByteWriter hello;
  hello.put(kHelloMagic).put(kHelloVersion).putString(transport).put<int32_t>(localGpu).putString(secret);
  hello.putString(link.transport->localAddress()).put(shape.sockets).put(shape.chunkBytes);
  sendBlob(fd.get(), hello.bytes(), deadline, who);

  const std::string blob = recvBlob(fd.get(), kMaxHandshakeBytes, deadline, who);
  ByteReader r(blob);
  uint32_t magic = 0;
  uint16_t version = 0;
  uint8_t ok = 0;
  std::string reason, address;
  int32_t gpu = -1;
  if (!(r.get(&magic) && r.get(&version)) || magic != kHelloMagic) refused(who, "the peer is not a gdx endpoint");
  if (version != kHelloVersion)
    refused(who, "the peer speaks version " + std::to_string(version) + ", this one " + std::to_string(kHelloVersion));
  if (!(r.get(&ok) && r.getString(&reason, kMaxHandshakeBytes))) refused(who, "a truncated answer");
  if (!ok) throw Error(ErrorCode::kInvalidArgument, who + ": refused by the peer: " + reason);
  if (!(r.get(&gpu) && r.getString(&address, kMaxHandshakeBytes) && r.get(&link.token)))
    refused(who, "a truncated answer");
  link.peerGpu = gpu;
  link.addresses = {link.transport->localAddress(), address};
  return link;
}

PairLink answerLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                    net::Deadline deadline, const std::string& who) {
  const std::string blob = recvBlob(fd.get(), kMaxHandshakeBytes, deadline, who);
  ByteReader r(blob);
  uint32_t magic = 0;
  uint16_t version = 0;
  std::string theirTransport, secret, address;
  int32_t gpu = -1;
  TcpShape shape;
  std::string why;
  if (!(r.get(&magic) && r.get(&version)) || magic != kHelloMagic) {
    why = "the peer is not a gdx endpoint";
  } else if (version != kHelloVersion) {
    why = "the peer speaks version " + std::to_string(version) + ", this one " + std::to_string(kHelloVersion);
  } else if (!(r.getString(&theirTransport, 64) && r.get(&gpu) && r.getString(&secret, 4096) &&
               r.getString(&address, kMaxHandshakeBytes) && r.get(&shape.sockets) && r.get(&shape.chunkBytes))) {
    why = "a truncated hello";
  } else if (theirTransport != transport) {
    why = "the peer uses transport '" + theirTransport + "', this endpoint '" + transport +
          "' (set GDX_TRANSPORT alike on both sides)";
  } else if (transport == "tcp" &&
             (shape.sockets < 1 || shape.sockets > 64 || shape.chunkBytes < 1 || shape.chunkBytes > (1u << 30))) {
    why = "the peer asks for " + std::to_string(shape.sockets) + " sockets of " + std::to_string(shape.chunkBytes) +
          "-byte chunks (1..64 sockets, chunks up to 1 GiB)";
  }
  ByteWriter answer;
  answer.put(kHelloMagic).put(kHelloVersion);
  if (!why.empty()) {
    answer.put<uint8_t>(0).putString(why);
    try {
      sendBlob(fd.get(), answer.bytes(), deadline, who);
    } catch (const Error&) {
      // the refusal is best effort; the error below says why
    }
    throw Error(ErrorCode::kProtocol, who + ": refused a connection from " + net::peerName(fd.get()) + ": " + why);
  }
  PairLink link;
  link.self = 1;
  link.peerIp = net::peerName(fd.get());
  link.peerGpu = gpu;
  link.token = randomU64();
  link.transport = makePairTransport(transport, 1, secret, net::localAddress(fd.get()), timeoutNs, shape, &link.detail);
  link.addresses = {address, link.transport->localAddress()};
  answer.put<uint8_t>(1).putString("").put<int32_t>(localGpu).putString(link.transport->localAddress()).put(link.token);
  sendBlob(fd.get(), answer.bytes(), deadline, who);
  return link;
}

}  // namespace gdx::p2p
