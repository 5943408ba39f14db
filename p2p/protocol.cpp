#include "p2p/protocol.hpp"

#include "base/byte_codec.hpp"

namespace gdx::p2p {
namespace {

constexpr uint32_t kDescriptorMagic = 0x44584447;  // "GDXD"
constexpr uint16_t kDescriptorVersion = 1;
constexpr uint32_t kMetadataMagic = 0x4d584447;  // "GDXM"
constexpr uint16_t kMetadataVersion = 1;
constexpr uint32_t kIpcMagic = 0x49584447;  // "GDXI"
constexpr uint16_t kIpcVersion = 1;

/// The checksum that ends `w`'s bytes.
void sealWithChecksum(ByteWriter& w) {
  w.put(checksum(w.bytes().data(), w.bytes().size()));
}

/// True when `r` holds exactly the checksum of the `body` bytes before it.
bool checksumMatches(ByteReader& r, const std::string& bytes) {
  const size_t body = r.consumed();
  uint64_t sum = 0;
  return r.get(&sum) && r.left() == 0 && sum == checksum(bytes.data(), body);
}

}  // namespace

uint64_t checksum(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

const char* msgTypeName(MsgType t) {
  switch (t) {
    case MsgType::kKeyRequest: return "key request";
    case MsgType::kKeyPart: return "key part";
    case MsgType::kKeyRefused: return "key refused";
    case MsgType::kClearToSend: return "clear to send";
    case MsgType::kSendRefused: return "send refused";
    case MsgType::kFence: return "fence";
    case MsgType::kFenceAck: return "fence ack";
    case MsgType::kReadRequest: return "read request";
    case MsgType::kReadDone: return "read done";
    case MsgType::kCredit: return "credit";
    case MsgType::kReceiveRefused: return "receive refused";
    case MsgType::kRequestToSend: return "request to send";
    case MsgType::kReceiveFailed: return "receive failed";
    case MsgType::kSendWithdrawn: return "send withdrawn";
    case MsgType::kWithdrawTooLate: return "withdrawal too late";
  }
  return "unknown";
}

MessageOp encode(const ControlMsg& m, int peer) {
  ByteWriter w;
  w.put<uint8_t>(static_cast<uint8_t>(m.type));
  switch (m.type) {
    case MsgType::kKeyRequest: w.put(m.window).put(m.offset); break;
    case MsgType::kKeyRefused: w.put(m.window); break;
    case MsgType::kKeyPart:
      w.put(m.window).put(m.bytes).put(m.keyTotal).put(m.keyAt).put<uint8_t>(static_cast<uint8_t>(m.keyPiece.size()));
      w.putRaw(m.keyPiece.data(), m.keyPiece.size());
      break;
    case MsgType::kClearToSend: w.put(m.id).put(m.window).put(m.offset).put(m.bytes).put(m.credits); break;
    case MsgType::kCredit: w.put(m.credits); break;
    case MsgType::kSendRefused:
    case MsgType::kReceiveRefused:
    case MsgType::kRequestToSend: w.put(m.id).put(m.bytes); break;
    case MsgType::kFence:
    case MsgType::kFenceAck: w.put(m.id); break;
    case MsgType::kReadRequest:
      w.put(m.id).put(m.window).put(m.offset).put(m.bytes).put(m.dstWindow).put(m.dstOffset);
      break;
    case MsgType::kReadDone: w.put(m.id).put<uint8_t>(static_cast<uint8_t>(m.status)); break;
    case MsgType::kReceiveFailed:
    case MsgType::kSendWithdrawn:
    case MsgType::kWithdrawTooLate: w.put(m.id).put<uint8_t>(static_cast<uint8_t>(m.code)); break;
  }
  MessageOp op;
  op.peer = peer;
  op.bytes = static_cast<uint32_t>(w.bytes().size());
  std::memcpy(op.data, w.bytes().data(), op.bytes);
  return op;
}

std::string decode(const RemoteMessage& msg, ControlMsg* out) {
  if (msg.bytes == 0 || msg.bytes > kMaxMessageBytes)
    return "a control message of " + std::to_string(msg.bytes) + " bytes";
  ByteReader r(msg.data, msg.bytes);
  uint8_t type = 0;
  r.get(&type);
  ControlMsg m;
  m.type = static_cast<MsgType>(type);
  switch (m.type) {
    case MsgType::kKeyRequest: r.get(&m.window) && r.get(&m.offset); break;
    case MsgType::kKeyRefused: r.get(&m.window); break;
    case MsgType::kKeyPart: {
      uint8_t len = 0;
      r.get(&m.window) && r.get(&m.bytes) && r.get(&m.keyTotal) && r.get(&m.keyAt) && r.get(&len);
      if (r.ok() && (len > kKeyPieceBytes || m.keyTotal > kMaxKeyBytes || size_t{m.keyAt} + len > m.keyTotal))
        return "a key part of " + std::to_string(len) + " bytes at " + std::to_string(m.keyAt) + " of a " +
               std::to_string(m.keyTotal) + "-byte key";
      m.keyPiece.resize(len);
      r.getRaw(&m.keyPiece[0], len);
      break;
    }
    case MsgType::kClearToSend:
      r.get(&m.id) && r.get(&m.window) && r.get(&m.offset) && r.get(&m.bytes) && r.get(&m.credits);
      break;
    case MsgType::kCredit: r.get(&m.credits); break;
    case MsgType::kSendRefused:
    case MsgType::kReceiveRefused:
    case MsgType::kRequestToSend: r.get(&m.id) && r.get(&m.bytes); break;
    case MsgType::kFence:
    case MsgType::kFenceAck: r.get(&m.id); break;
    case MsgType::kReadRequest:
      r.get(&m.id) && r.get(&m.window) && r.get(&m.offset) && r.get(&m.bytes) && r.get(&m.dstWindow) &&
          r.get(&m.dstOffset);
      break;
    case MsgType::kReadDone: {
      uint8_t s = 0;
      r.get(&m.id) && r.get(&s);
      if (r.ok() && s > static_cast<uint8_t>(ReadStatus::kFailed)) return "a read status " + std::to_string(s);
      m.status = static_cast<ReadStatus>(s);
      break;
    }
    case MsgType::kReceiveFailed:
    case MsgType::kSendWithdrawn:
    case MsgType::kWithdrawTooLate: {
      uint8_t code = 0;
      r.get(&m.id) && r.get(&code);
      if (r.ok() && (code == 0 || code > static_cast<uint8_t>(ErrorCode::kShutdown)))  // kOk, or past the last
        return std::string("a ") + msgTypeName(m.type) + " message with error code " + std::to_string(code);
      m.code = static_cast<ErrorCode>(code);
      break;
    }
    default: return "a control message of unknown type " + std::to_string(type);
  }
  if (!r.ok())
    return std::string("a truncated ") + msgTypeName(m.type) + " message (" + std::to_string(msg.bytes) + " bytes)";
  if (r.left() != 0)
    return std::string("a ") + msgTypeName(m.type) + " message with " + std::to_string(r.left()) + " bytes too many";
  *out = std::move(m);
  return "";
}

std::string encodeDescriptor(const Descriptor& d) {
  ByteWriter w;
  w.put(kDescriptorMagic).put(kDescriptorVersion).put(d.token).put(d.window).put(d.bytes);
  sealWithChecksum(w);
  return w.bytes();
}

std::string decodeDescriptor(const std::string& bytes, Descriptor* out) {
  if (bytes.size() != kDescriptorBytes)
    return "a descriptor is " + std::to_string(kDescriptorBytes) + " bytes, this one " + std::to_string(bytes.size()) +
           (bytes.size() < kDescriptorBytes ? " (truncated)" : "");
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  Descriptor d;
  uint64_t sum = 0;
  r.get(&magic) && r.get(&version) && r.get(&d.token) && r.get(&d.window) && r.get(&d.bytes) && r.get(&sum);
  if (magic != kDescriptorMagic) return "not a gdx descriptor (wrong magic)";
  if (version != kDescriptorVersion)
    return "descriptor version " + std::to_string(version) + ", expected " + std::to_string(kDescriptorVersion);
  if (sum != checksum(bytes.data(), kDescriptorBytes - 8)) return "damaged descriptor (checksum does not match)";
  *out = d;
  return "";
}

std::string encodeMetadata(const EndpointAddress& a) {
  ByteWriter w;
  w.put(kMetadataMagic).put(kMetadataVersion).putString(a.ip).put<int32_t>(a.port).put<int32_t>(a.gpu);
  sealWithChecksum(w);
  return w.bytes();
}

std::string decodeMetadata(const std::string& bytes, EndpointAddress* out) {
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  EndpointAddress a;
  if (!(r.get(&magic) && r.get(&version)) || magic != kMetadataMagic)
    return "not endpoint metadata (" + std::to_string(bytes.size()) + " bytes)";
  if (version != kMetadataVersion)
    return "metadata version " + std::to_string(version) + ", expected " + std::to_string(kMetadataVersion);
  if (!(r.getString(&a.ip, kMaxMetadataIpBytes) && r.get(&a.port) && r.get(&a.gpu)) || r.left() != 8)
    return "truncated or overlong metadata (" + std::to_string(bytes.size()) + " bytes)";
  if (!checksumMatches(r, bytes)) return "damaged metadata (checksum does not match)";
  if (a.ip.empty() || a.port < 1 || a.port > 65535 || a.gpu < -1)
    return "metadata naming " + (a.ip.empty() ? std::string("no address") : "'" + a.ip + "'") + ", port " +
           std::to_string(a.port) + ", GPU " + std::to_string(a.gpu);
  *out = std::move(a);
  return "";
}

std::string encodeIpc(const IpcDescriptor& d) {
  ByteWriter w;
  w.put(kIpcMagic).put(kIpcVersion).put(d.host).put(d.pid).put<int32_t>(d.device);
  w.putRaw(d.handle, IpcDescriptor::kHandleBytes).put(d.allocBase).put(d.offset).put(d.bytes);
  sealWithChecksum(w);
  return w.bytes();
}

std::string decodeIpc(const std::string& bytes, IpcDescriptor* out) {
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  IpcDescriptor d;
  if (!(r.get(&magic) && r.get(&version)) || magic != kIpcMagic) return "not a gdx IPC descriptor";
  if (version != kIpcVersion) return "IPC descriptor version " + std::to_string(version);
  if (!(r.get(&d.host) && r.get(&d.pid) && r.get(&d.device) && r.getRaw(d.handle, IpcDescriptor::kHandleBytes) &&
        r.get(&d.allocBase) && r.get(&d.offset) && r.get(&d.bytes)) ||
      r.left() != 8)
    return "a truncated or overlong IPC descriptor (" + std::to_string(bytes.size()) + " bytes)";
  if (!checksumMatches(r, bytes)) return "damaged IPC descriptor (checksum does not match)";
  if (d.device < 0 || d.offset > ~uint64_t{0} - d.bytes)
    return "an IPC descriptor of GPU " + std::to_string(d.device) + " naming " + std::to_string(d.bytes) +
           " bytes at offset " + std::to_string(d.offset);
  *out = d;
  return "";
}

}  // namespace gdx::p2p
