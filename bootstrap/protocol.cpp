#include "bootstrap/protocol.hpp"

#include <cstring>

namespace gdx::bootstrap {

const char* msgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kHello: return "hello";
    case MsgType::kWelcome: return "welcome";
    case MsgType::kRefuse: return "refuse";
    case MsgType::kAbort: return "abort";
    case MsgType::kGather: return "gather";
    case MsgType::kGatherResult: return "gather-result";
    case MsgType::kGoodbye: return "goodbye";
  }
  return "unknown";
}

void encodeHeader(const FrameHeader& h, unsigned char out[kHeaderBytes]) {
  ByteWriter w;
  w.put(h.magic).put(h.version).put(static_cast<uint16_t>(h.type)).put(h.length);
  std::memcpy(out, w.bytes().data(), kHeaderBytes);
}

FrameHeader decodeHeader(const unsigned char in[kHeaderBytes]) {
  // kHeaderBytes are there: every read finds its bytes.
  ByteReader r(in, kHeaderBytes);
  FrameHeader h;
  uint16_t type = 0;
  r.get(&h.magic);
  r.get(&h.version);
  r.get(&type);
  r.get(&h.length);
  h.type = static_cast<MsgType>(type);
  return h;
}

std::string checkFrameHeader(const FrameHeader& h, uint64_t maxPayload) {
  if (h.magic != kMagic) return "not a gdx bootstrap frame (bad magic " + std::to_string(h.magic) + ")";
  if (h.version != kProtocolVersion)
    return "bootstrap protocol version " + std::to_string(h.version) + ", this build speaks " +
           std::to_string(kProtocolVersion);
  if (h.length > maxPayload)
    return std::string("bootstrap ") + msgTypeName(h.type) + " message of " + std::to_string(h.length) +
           " bytes exceeds the limit of " + std::to_string(maxPayload);
  return "";
}

std::string encodeFrame(MsgType type, const std::string& payload) {
  unsigned char header[kHeaderBytes];
  FrameHeader h;
  h.type = type;
  h.length = payload.size();
  encodeHeader(h, header);
  std::string frame(reinterpret_cast<const char*>(header), kHeaderBytes);
  frame += payload;
  return frame;
}

void Reader::check() const {
  if (!in_.ok())
    throw Error(ErrorCode::kProtocol,
                std::string("truncated ") + what_ + " message (" + std::to_string(in_.size()) + " bytes)");
}

uint32_t Reader::u32() {
  uint32_t v = 0;
  in_.get(&v);
  check();
  return v;
}

uint64_t Reader::u64() {
  uint64_t v = 0;
  in_.get(&v);
  check();
  return v;
}

std::string Reader::str() {
  return bytes(u32());
}

std::string Reader::bytes(uint64_t n) {
  std::string s;
  in_.getBytes(&s, n);
  check();
  return s;
}

std::string Reader::rest() {
  return bytes(in_.left());
}

std::string encodeHello(const Hello& h) {
  ByteWriter w;
  w.put(h.rank).put(h.worldSize).putString(h.secret).putString(h.hostname);
  return w.take();
}

Hello decodeHello(const std::string& payload) {
  Reader r(payload, "hello");
  Hello h;
  h.rank = r.u32();
  h.worldSize = r.u32();
  h.secret = r.str();
  h.hostname = r.str();
  return h;
}

std::string encodeWelcome(const std::vector<std::string>& hostnames) {
  ByteWriter w;
  w.put(static_cast<uint32_t>(hostnames.size()));
  for (const std::string& h : hostnames) w.putString(h);
  return w.take();
}

std::vector<std::string> decodeWelcome(const std::string& payload, uint32_t worldSize) {
  Reader r(payload, "welcome");
  if (r.u32() != worldSize) throw Error(ErrorCode::kProtocol, "welcome names another world size");
  std::vector<std::string> hostnames;
  // Not reserved from worldSize: the payload's own length bounds how many names it can hold.
  for (uint32_t i = 0; i < worldSize; ++i) hostnames.push_back(r.str());
  if (!r.done()) throw Error(ErrorCode::kProtocol, "trailing bytes in the welcome");
  return hostnames;
}

std::string encodeRefuse(const std::string& reason) {
  ByteWriter w;
  w.putString(reason);
  return w.take();
}

std::string decodeRefuse(const std::string& payload) {
  return Reader(payload, "refuse").str();
}

std::string encodeAbort(ErrorCode code, const std::string& message) {
  ByteWriter w;
  w.put(static_cast<uint32_t>(code)).putString(message);
  return w.take();
}

Abort decodeAbort(const std::string& payload) {
  Reader r(payload, "abort");
  uint32_t code = r.u32();
  Abort a;
  a.message = r.str();
  if (code >= static_cast<uint32_t>(ErrorCode::kInvalidArgument) && code <= static_cast<uint32_t>(ErrorCode::kShutdown))
    a.code = static_cast<ErrorCode>(code);
  return a;
}

std::string encodeGather(uint64_t seq, const std::string& blob) {
  ByteWriter w;
  w.put(seq).putBytes(blob);
  return w.take();
}

std::pair<uint64_t, std::string> decodeGather(const std::string& payload) {
  Reader r(payload, "gather");
  uint64_t seq = r.u64();
  return {seq, r.rest()};
}

std::string encodeGatherResult(uint64_t seq, const std::vector<std::string>& blobs) {
  ByteWriter w;
  w.put(seq).put(static_cast<uint32_t>(blobs.size()));
  for (const std::string& b : blobs) w.put(uint64_t{b.size()}).putBytes(b);
  return w.take();
}

std::vector<std::string> decodeGatherResult(const std::string& payload, uint64_t seq, uint32_t worldSize) {
  Reader r(payload, "gather result");
  if (r.u64() != seq) throw Error(ErrorCode::kProtocol, "gather result for another call");
  if (r.u32() != worldSize) throw Error(ErrorCode::kProtocol, "gather result of another size");
  std::vector<std::string> all;
  for (uint32_t i = 0; i < worldSize; ++i) all.push_back(r.bytes(r.u64()));
  if (!r.done()) throw Error(ErrorCode::kProtocol, "trailing bytes in the gather result");
  return all;
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  // Every byte of the longer string is visited and the differences are OR-ed together; no early exit.
  size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

}  // namespace gdx::bootstrap
