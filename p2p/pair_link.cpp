#include "p2p/pair_link.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "p2p/handshake.hpp"
#include "transport/factory.hpp"

namespace gdx::p2p {
namespace {

std::string hexSecret() {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(randomU64()),
                static_cast<unsigned long long>(randomU64()));
  return buf;
}

/// `given`, its zero fields from the environment (GDX_TCP_SOCKETS, GDX_TCP_CHUNK).
TcpShape tcpShapeOr(TcpShape given) {
  TcpTransportOptions t = TcpTransportOptions::fromEnv(0, 2, "");
  if (given.sockets == 0) given.sockets = static_cast<uint16_t>(t.socketsPerPeer);
  if (given.chunkBytes == 0) given.chunkBytes = t.chunkBytes;
  return given;
}

/// Eager sends and control messages, and a little more.
constexpr size_t kInlineSendBytes = 16 << 10;

std::unique_ptr<Transport> makePairTransport(const std::string& kind, int rank, const std::string& secret,
                                             const std::string& bindAddress, uint64_t timeoutNs, const TcpShape& shape,
                                             std::string* detail) {
  TransportParams params;
  params.rank = rank;
  params.worldSize = 2;
  params.secret = secret;
  params.bindAddress = bindAddress;
  params.timeoutNs = timeoutNs;
  params.socketsPerPeer = shape.sockets;
  params.chunkBytes = shape.chunkBytes;
  // An endpoint's caller posts a small message and waits for it: sending it from that thread saves a hand-off.
  params.inlineSendBytes = kInlineSendBytes;
  params.lanes = 1;
  std::unique_ptr<Transport> transport = makeTransport(kind, params);
  *detail = kind == "tcp" ? "tcp, " + std::to_string(shape.sockets) + " sockets, " + std::to_string(shape.chunkBytes) +
                                "-byte chunks"
                          : std::string("verbs, RC");
  return transport;
}

[[noreturn]] void refused(const std::string& who, const std::string& why) {
  throw Error(ErrorCode::kProtocol, who + ": " + why);
}

}  // namespace

bool sameSecret(const std::string& a, const std::string& b) {
  // Every byte compared whatever the first difference, so that the time taken tells nothing about the secret.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

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

namespace {

ErrorCode blobError(const net::IoStatus& s) {
  if (s.result == net::IoResult::kTimeout) return ErrorCode::kTimeout;
  return s.result == net::IoResult::kAborted ? ErrorCode::kShutdown : ErrorCode::kPeerFailed;
}

}  // namespace

void sendBlob(int fd, const std::string& blob, net::Deadline deadline, const std::string& who,
              const net::AbortCheck& abort) {
  uint32_t len = static_cast<uint32_t>(blob.size());
  iovec iov[2] = {{&len, sizeof len}, {const_cast<char*>(blob.data()), blob.size()}};
  net::IoLimits limits;
  limits.deadline = deadline;
  limits.abort = abort;
  net::IoStatus s = net::sendFull(fd, iov, 2, limits);
  if (!s.ok()) throw Error(blobError(s), who + ": sending the handshake: " + s.describe());
}

std::string recvBlob(int fd, size_t max, net::Deadline deadline, const std::string& who, const net::AbortCheck& abort) {
  net::IoLimits limits;
  limits.deadline = deadline;
  limits.abort = abort;
  uint32_t len = 0;
  net::IoStatus s = net::recvFull(fd, &len, sizeof len, limits);
  if (s.ok() && len > max)
    throw Error(ErrorCode::kProtocol,
                who + ": a handshake of " + std::to_string(len) + " bytes (at most " + std::to_string(max) + ")");
  std::string blob(len, '\0');
  if (s.ok() && len > 0) s = net::recvFull(fd, &blob[0], len, limits);
  if (!s.ok()) throw Error(blobError(s), who + ": receiving the handshake: " + s.describe());
  return blob;
}

PairLink dialLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                  net::Deadline deadline, const std::string& who, const std::string& jobSecret,
                  const net::AbortCheck& abort, TcpShape given) {
  PairLink link;
  link.self = 0;
  link.peerIp = net::peerName(fd.get());
  const std::string secret = hexSecret();
  const TcpShape shape = transport == "tcp" ? tcpShapeOr(given) : TcpShape{};
  link.transport = makePairTransport(transport, 0, secret, net::localAddress(fd.get()), timeoutNs, shape, &link.detail);
  Hello hello;
  hello.transport = transport;
  hello.gpu = localGpu;
  hello.secret = secret;
  hello.address = link.transport->localAddress();
  hello.sockets = shape.sockets;
  hello.chunkBytes = shape.chunkBytes;
  hello.jobSecret = jobSecret;
  sendBlob(fd.get(), encodeHello(hello), deadline, who, abort);

  Answer answer;
  const std::string bad = decodeAnswer(recvBlob(fd.get(), kMaxHandshakeBytes, deadline, who, abort), &answer);
  if (!bad.empty()) refused(who, bad);
  if (!answer.ok) throw Error(ErrorCode::kInvalidArgument, who + ": refused by the peer: " + answer.reason);
  link.token = answer.token;
  link.peerGpu = answer.gpu;
  link.addresses = {link.transport->localAddress(), answer.address};
  return link;
}

uint64_t helloWaitNs(uint64_t timeoutNs) {
  return std::min<uint64_t>(timeoutNs, static_cast<uint64_t>(envInt("GDX_P2P_HELLO_MS", 5000)) * 1000000ull);
}

PairLink answerLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                    net::Deadline deadline, const std::string& who, const std::string& jobSecret,
                    const net::AbortCheck& abort, const std::function<void()>& heard) {
  Hello hello;
  const net::Deadline helloBy = std::min<net::Deadline>(deadline, net::deadlineIn(helloWaitNs(timeoutNs)));
  std::string why = decodeHello(recvBlob(fd.get(), kMaxHandshakeBytes, helloBy, who + " (its hello)", abort), &hello);
  if (why.empty() && heard) heard();
  if (why.empty() && hello.transport != transport)
    why = "the peer uses transport '" + hello.transport + "', this endpoint '" + transport +
          "' (set GDX_TRANSPORT alike on both sides)";
  if (why.empty() && !sameSecret(hello.jobSecret, jobSecret))
    why = hello.jobSecret.empty() ? "this endpoint requires a secret and the peer presented none"
                                  : "the peer presented the wrong secret";
  Answer answer;
  if (!why.empty()) {
    answer.reason = why;
    try {
      sendBlob(fd.get(), encodeAnswer(answer), deadline, who, abort);
    } catch (const Error&) {
      // the refusal is best effort; the error below says why
    }
    throw Error(ErrorCode::kProtocol, who + ": refused a connection from " + net::peerName(fd.get()) + ": " + why);
  }
  PairLink link;
  link.self = 1;
  link.peerIp = net::peerName(fd.get());
  link.peerGpu = hello.gpu;
  link.token = randomU64();
  const TcpShape shape{hello.sockets, hello.chunkBytes};
  link.transport =
      makePairTransport(transport, 1, hello.secret, net::localAddress(fd.get()), timeoutNs, shape, &link.detail);
  link.addresses = {hello.address, link.transport->localAddress()};
  answer.ok = true;
  answer.gpu = localGpu;
  answer.address = link.transport->localAddress();
  answer.token = link.token;
  sendBlob(fd.get(), encodeAnswer(answer), deadline, who, abort);
  return link;
}

}  // namespace gdx::p2p
