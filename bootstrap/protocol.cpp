#include "bootstrap/protocol.hpp"

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

namespace {
void put(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
}  // namespace

void encodeHeader(const FrameHeader& h, unsigned char out[kHeaderBytes]) {
  put(out, h.magic, 4);
  put(out + 4, h.version, 2);
  put(out + 6, static_cast<uint16_t>(h.type), 2);
  put(out + 8, h.length, 8);
}

FrameHeader decodeHeader(const unsigned char in[kHeaderBytes]) {
  FrameHeader h;
  h.magic = static_cast<uint32_t>(get(in, 4));
  h.version = static_cast<uint16_t>(get(in + 4, 2));
  h.type = static_cast<MsgType>(get(in + 6, 2));
  h.length = get(in + 8, 8);
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

Writer& Writer::u32(uint32_t v) {
  unsigned char b[4];
  put(b, v, 4);
  out_.append(reinterpret_cast<const char*>(b), 4);
  return *this;
}

Writer& Writer::u64(uint64_t v) {
  unsigned char b[8];
  put(b, v, 8);
  out_.append(reinterpret_cast<const char*>(b), 8);
  return *this;
}

Writer& Writer::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  out_ += s;
  return *this;
}

void Reader::need(uint64_t n) {
  if (n > in_.size() - pos_)
    throw Error(ErrorCode::kProtocol,
                std::string("truncated ") + what_ + " message (" + std::to_string(in_.size()) + " bytes)");
}

uint32_t Reader::u32() {
  need(4);
  auto v = static_cast<uint32_t>(get(reinterpret_cast<const unsigned char*>(in_.data()) + pos_, 4));
  pos_ += 4;
  return v;
}

uint64_t Reader::u64() {
  need(8);
  uint64_t v = get(reinterpret_cast<const unsigned char*>(in_.data()) + pos_, 8);
  pos_ += 8;
  return v;
}

std::string Reader::str() {
  return bytes(u32());
}

std::string Reader::bytes(uint64_t n) {
  need(n);
  std::string s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

std::string Reader::rest() {
  return bytes(in_.size() - pos_);
}

std::string encodeHello(const Hello& h) {
  Writer w;
  w.u32(h.rank).u32(h.worldSize).str(h.secret).str(h.hostname);
  return std::move(w.out());
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
  Writer w;
  w.u32(static_cast<uint32_t>(hostnames.size()));
  for (const std::string& h : hostnames) w.str(h);
  return std::move(w.out());
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
  Writer w;
  w.str(reason);
  return std::move(w.out());
}

std::string decodeRefuse(const std::string& payload) {
  return Reader(payload, "refuse").str();
}

std::string encodeAbort(ErrorCode code, const std::string& message) {
  Writer w;
  w.u32(static_cast<uint32_t>(code)).str(message);
  return std::move(w.out());
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
  Writer w;
  w.u64(seq).raw(blob);
  return std::move(w.out());
}

std::pair<uint64_t, std::string> decodeGather(const std::string& payload) {
  Reader r(payload, "gather");
  uint64_t seq = r.u64();
  return {seq, r.rest()};
}

std::string encodeGatherResult(uint64_t seq, const std::vector<std::string>& blobs) {
  Writer w;
  w.u64(seq).u32(static_cast<uint32_t>(blobs.size()));
  for (const std::string& b : blobs) w.u64(b.size()).raw(b);
  return std::move(w.out());
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
