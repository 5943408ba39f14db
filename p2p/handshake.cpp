#include "p2p/handshake.hpp"

#include "base/byte_codec.hpp"

namespace gdx::p2p {
namespace {

constexpr uint32_t kHelloMagic = 0x50584447;  // "GDXP"
constexpr uint16_t kHelloVersion = 3;         // 2: the dialler's TCP sockets and chunk size; 3: the job secret

/// "" when `r` starts with the magic and version, else why not.
std::string checkPreamble(ByteReader& r) {
  uint32_t magic = 0;
  uint16_t version = 0;
  if (!(r.get(&magic) && r.get(&version)) || magic != kHelloMagic) return "the peer is not a gdx endpoint";
  if (version != kHelloVersion)
    return "the peer speaks version " + std::to_string(version) + ", this one " + std::to_string(kHelloVersion);
  return "";
}

std::string overlong(const char* what, size_t extra) {
  return std::string("a ") + what + " with " + std::to_string(extra) + " bytes too many";
}

}  // namespace

std::string encodeHello(const Hello& h) {
  ByteWriter w;
  w.put(kHelloMagic).put(kHelloVersion).putString(h.transport).put<int32_t>(h.gpu).putString(h.secret);
  w.putString(h.address).put(h.sockets).put(h.chunkBytes).putString(h.jobSecret);
  return w.bytes();
}

std::string decodeHello(const std::string& blob, Hello* out) {
  if (blob.size() > kMaxHandshakeBytes) return "a hello of " + std::to_string(blob.size()) + " bytes";
  ByteReader r(blob);
  std::string why = checkPreamble(r);
  if (!why.empty()) return why;
  Hello h;
  if (!(r.getString(&h.transport, kMaxTransportNameBytes) && r.get(&h.gpu) && r.getString(&h.secret, kMaxSecretBytes) &&
        r.getString(&h.address, kMaxHandshakeBytes) && r.get(&h.sockets) && r.get(&h.chunkBytes) &&
        r.getString(&h.jobSecret, kMaxSecretBytes)))
    return "a truncated hello";
  if (r.left() != 0) return overlong("hello", r.left());
  if (h.gpu < -1) return "the peer names GPU " + std::to_string(h.gpu);
  if (h.transport == "tcp" &&
      (h.sockets < 1 || h.sockets > kMaxLinkSockets || h.chunkBytes < 1 || h.chunkBytes > kMaxLinkChunkBytes))
    return "the peer asks for " + std::to_string(h.sockets) + " sockets of " + std::to_string(h.chunkBytes) +
           "-byte chunks (1.." + std::to_string(kMaxLinkSockets) + " sockets, chunks up to 1 GiB)";
  *out = std::move(h);
  return "";
}

std::string encodeAnswer(const Answer& a) {
  ByteWriter w;
  w.put(kHelloMagic).put(kHelloVersion).put<uint8_t>(a.ok ? 1 : 0).putString(a.reason);
  if (a.ok) w.put<int32_t>(a.gpu).putString(a.address).put(a.token);
  return w.bytes();
}

std::string decodeAnswer(const std::string& blob, Answer* out) {
  if (blob.size() > kMaxHandshakeBytes) return "an answer of " + std::to_string(blob.size()) + " bytes";
  ByteReader r(blob);
  std::string why = checkPreamble(r);
  if (!why.empty()) return why;
  Answer a;
  uint8_t ok = 0;
  if (!(r.get(&ok) && r.getString(&a.reason, kMaxHandshakeBytes))) return "a truncated answer";
  if (ok > 1) return "an answer whose verdict is " + std::to_string(ok);
  a.ok = ok == 1;
  if (a.ok && !(r.get(&a.gpu) && r.getString(&a.address, kMaxHandshakeBytes) && r.get(&a.token)))
    return "a truncated answer";
  if (r.left() != 0) return overlong("answer", r.left());
  if (a.ok && a.gpu < -1) return "the peer names GPU " + std::to_string(a.gpu);
  *out = std::move(a);
  return "";
}

}  // namespace gdx::p2p
