#include "transport/tcp/wire.hpp"

#include <algorithm>
#include <sstream>

#include "base/byte_codec.hpp"

namespace gdx::tcp {

const char* helloReplyName(HelloReply reply) {
  switch (reply) {
    case HelloReply::kAccepted: return "accepted";
    case HelloReply::kBadSecret: return "wrong job secret";
    case HelloReply::kBadRank: return "unknown rank";
    case HelloReply::kWorldMismatch: return "world size differs";
    case HelloReply::kBadLane: return "unknown lane or lane count differs";
    case HelloReply::kBadSocket: return "unknown socket index or socket count differs";
    case HelloReply::kDuplicate: return "duplicate connection";
    case HelloReply::kChunkTooLarge: return "sender's chunk size exceeds the receiver's";
  }
  return "unknown reply";
}

size_t helloBytesWanted(const std::string& buffer) {
  Hello hello;
  if (!ByteReader(buffer).get(&hello)) return sizeof(Hello);
  return sizeof(Hello) + std::min<size_t>(hello.secretBytes, kMaxSecretBytes);
}

HelloParse parseHello(const std::string& buffer, Hello* hello, std::string* secret) {
  ByteReader r(buffer);
  if (!r.get(hello)) return HelloParse::kIncomplete;
  if (hello->magic != kHelloMagic) return HelloParse::kNotGdx;
  if (hello->version != kWireVersion) return HelloParse::kBadVersion;
  if (hello->secretBytes > kMaxSecretBytes) return HelloParse::kOversized;
  if (!r.getBytes(secret, hello->secretBytes)) return HelloParse::kIncomplete;
  return HelloParse::kComplete;
}

HelloReply checkHello(const Hello& hello, const std::string& secret, const HelloExpectations& expected) {
  if (secret != expected.secret) return HelloReply::kBadSecret;
  if (hello.worldSize != expected.worldSize) return HelloReply::kWorldMismatch;
  if (hello.rank < 0 || hello.rank >= expected.worldSize) return HelloReply::kBadRank;
  if (hello.lanes != expected.lanes || hello.lane >= hello.lanes) return HelloReply::kBadLane;
  if (hello.socketsPerPeer != expected.socketsPerPeer || hello.socketIndex >= hello.socketsPerPeer)
    return HelloReply::kBadSocket;
  if (hello.chunkBytes > expected.chunkBytes) return HelloReply::kChunkTooLarge;
  return HelloReply::kAccepted;
}

std::string checkHeader(const MessageHeader& h, uint32_t expectedLane, uint64_t maxChunk) {
  // Called for every message received: a well-formed header returns at the end without building any text.
  if (h.magic != kMessageMagic) return errorText("bad magic 0x", std::hex, h.magic);
  if (h.version != kWireVersion) return errorText("unsupported wire version ", h.version);
  if (h.type != static_cast<uint8_t>(MessageType::kWrite) && h.type != static_cast<uint8_t>(MessageType::kGoodbye) &&
      h.type != static_cast<uint8_t>(MessageType::kAtomic) && h.type != static_cast<uint8_t>(MessageType::kControl) &&
      h.type != static_cast<uint8_t>(MessageType::kRefusal))
    return errorText("unknown message type ", static_cast<int>(h.type));
  if ((h.flags & ~kFlagImm) != 0) return errorText("unknown flags 0x", std::hex, static_cast<int>(h.flags));
  if (h.lane != expectedLane) return errorText("lane ", h.lane, " on a connection of lane ", expectedLane);
  if (h.type == static_cast<uint8_t>(MessageType::kWrite)) {
    if (h.bytes == 0 || h.chunkBytes == 0) return "empty write";
    if (h.chunkBytes > maxChunk)
      return errorText("chunk of ", h.chunkBytes, " bytes exceeds the chunk limit of ", maxChunk);
    if (h.chunkBytes > h.bytes || h.chunkOffset > h.bytes - h.chunkBytes)
      return errorText("chunk [", h.chunkOffset, ", +", h.chunkBytes, ") lies outside its message of ", h.bytes,
                       " bytes");
  } else if (h.type == static_cast<uint8_t>(MessageType::kAtomic)) {
    if (h.flags != 0)
      return errorText("atomic with flags 0x", std::hex, static_cast<int>(h.flags), " (an atomic is never announced)");
    if (h.imm != static_cast<uint32_t>(SignalOp::kAdd) && h.imm != static_cast<uint32_t>(SignalOp::kSet))
      return errorText("unknown atomic kind ", h.imm);
    if (h.bytes != kAtomicBytes || h.chunkBytes != kAtomicBytes || h.chunkOffset != 0)
      return errorText("atomic of ", h.bytes, " bytes with chunk [", h.chunkOffset, ", +", h.chunkBytes,
                       "); it must be one 8-byte word");
    if (h.offset % kAtomicBytes != 0) return errorText("atomic at offset ", h.offset, ", which is not 8-byte aligned");
  } else if (h.type == static_cast<uint8_t>(MessageType::kControl)) {
    if (h.bytes == 0 || h.bytes > kMaxMessageBytes || h.chunkBytes != h.bytes)
      return errorText("control message of ", h.bytes, " bytes with a chunk of ", h.chunkBytes,
                       " bytes; it must be 1..", kMaxMessageBytes, " bytes in one chunk");
    if (h.flags != 0 || h.window != 0 || h.offset != 0 || h.chunkOffset != 0 || h.imm != 0)
      return "control message with window, offset, flags or immediate set";
  } else if (h.type == static_cast<uint8_t>(MessageType::kRefusal)) {
    if (h.bytes == 0 || h.bytes > kMaxRefusalBytes || h.chunkBytes != h.bytes)
      return errorText("refusal of ", h.bytes, " bytes with a chunk of ", h.chunkBytes, " bytes; it must be 1..",
                       kMaxRefusalBytes, " bytes in one chunk");
    if (h.flags != 0 || h.window != 0 || h.offset != 0 || h.chunkOffset != 0 || h.imm != 0)
      return "refusal with window, offset, flags or immediate set";
  } else if (h.chunkBytes != 0) {
    return errorText("goodbye with ", h.chunkBytes, " payload bytes");
  }
  return {};
}

std::string describe(const MessageHeader& h) {
  std::ostringstream os;
  if (h.type == static_cast<uint8_t>(MessageType::kAtomic)) {
    os << "atomic {kind " << h.imm << ", lane " << h.lane << ", window " << h.window << ", seq " << h.seq << ", offset "
       << h.offset << "}";
    return os.str();
  }
  if (h.type == static_cast<uint8_t>(MessageType::kControl)) {
    os << "message {lane " << h.lane << ", seq " << h.seq << ", bytes " << h.bytes << "}";
    return os.str();
  }
  os << "write {type " << static_cast<int>(h.type) << ", lane " << h.lane << ", window " << h.window << ", seq "
     << h.seq << ", offset " << h.offset << ", bytes " << h.bytes << ", chunk [" << h.chunkOffset << ", +"
     << h.chunkBytes << ")}";
  return os.str();
}

}  // namespace gdx::tcp
