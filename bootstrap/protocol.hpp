// Wire protocol of the bootstrap rendezvous (rank 0's server <-> every rank's client), over one TCP
// connection per rank.
//
// Every message is a frame: a 16-byte header, then `length` payload bytes. All integers little-endian.
//   u32 magic 'GDXB' (0x42584447) | u16 version (kProtocolVersion) | u16 type (MsgType) | u64 length
// A frame with another magic or version is refused, so a stray client or an older build fails loudly.
//
// Payloads (str = u32 length + bytes):
//   kHello         client -> server  u32 rank, u32 worldSize, str secret, str hostname
//   kWelcome       server -> client  u32 worldSize, worldSize x str hostname (indexed by rank); all joined
//   kRefuse        server -> client  str reason; the server then closes the connection
//   kAbort         server -> client  u32 ErrorCode, str message; the job is over (timeout, dead rank, misuse)
//   kGather        client -> server  u64 sequence number (1, 2, ...), then the blob (the rest of the payload): the
//                                    caller's bytes behind a collective tag (collective_tag.hpp) that the server
//                                    passes on untouched and the clients check against each other
//   kGatherResult  server -> client  u64 sequence number, u32 n, n x (u64 length + bytes), indexed by rank
//   kGoodbye       client -> server  (empty) the rank leaves cleanly; its EOF that follows is no failure
//
// Session: client sends kHello; the server answers kRefuse (and closes) or, once every rank has joined,
// kWelcome to all. Then any number of kGather rounds: the server answers all ranks with kGatherResult once all
// have sent the same sequence number. kAbort may replace any answer. The secret travels in clear text: it keeps
// strangers and other jobs out, it is not a defence against someone who can read the network.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/byte_codec.hpp"
#include "gdx/error.hpp"

namespace gdx::bootstrap {

constexpr uint32_t kMagic = 0x42584447;  // "GDXB" in little-endian byte order
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kHeaderBytes = 16;
/// Largest blob one rank may contribute to allGather.
constexpr uint64_t kMaxBlobBytes = 64ull << 20;
/// Largest frame the server accepts before the hello is authenticated: a stranger cannot make it allocate much.
constexpr uint64_t kMaxHelloBytes = 64 << 10;
/// Largest collective tag in front of a blob (collective_tag.hpp).
constexpr uint64_t kMaxTagBytes = 512;
/// Largest frame the server accepts from a joined rank: sequence number, tag, blob.
constexpr uint64_t kMaxClientFrameBytes = kMaxBlobBytes + kMaxTagBytes + 8;

enum class MsgType : uint16_t {
  kHello = 1,
  kWelcome = 2,
  kRefuse = 3,
  kAbort = 4,
  kGather = 5,
  kGatherResult = 6,
  kGoodbye = 7,
};
const char* msgTypeName(MsgType type);

struct FrameHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  MsgType type = MsgType::kHello;
  uint64_t length = 0;
};

void encodeHeader(const FrameHeader& h, unsigned char out[kHeaderBytes]);
FrameHeader decodeHeader(const unsigned char in[kHeaderBytes]);
/// "" when a peer's frame header may be acted on: the magic and version of this build, a payload of at most
/// `maxPayload` bytes; else why not (the server refuses the connection or aborts the job, a client fails).
std::string checkFrameHeader(const FrameHeader& h, uint64_t maxPayload);
/// A whole frame (header + payload) in one buffer, for the small and the broadcast messages.
std::string encodeFrame(MsgType type, const std::string& payload);

/// Reads a payload's fields (base/byte_codec.hpp); a payload that ends early throws gdx::Error(kProtocol) naming
/// `what`, so that a decoder reads its fields in order without a check after each.
class Reader {
 public:
  Reader(const std::string& in, const char* what) : in_(in), what_(what) {}
  uint32_t u32();
  uint64_t u64();
  std::string str();
  std::string bytes(uint64_t n);
  std::string rest();
  bool done() const { return in_.done(); }

 private:
  /// Throws unless the last read found its bytes.
  void check() const;
  ByteReader in_;
  const char* what_;
};

struct Hello {
  uint32_t rank = 0;
  uint32_t worldSize = 0;
  std::string secret;
  std::string hostname;
};
std::string encodeHello(const Hello& h);
Hello decodeHello(const std::string& payload);

/// The server's answers, as encoded by the server and decoded by the clients. Each decoder throws gdx::Error(kProtocol)
/// on a payload that ends early, has bytes left over or describes another world (`worldSize`, `seq`: what the client
/// expects), so a client never acts on half a message.
std::string encodeWelcome(const std::vector<std::string>& hostnames);
std::vector<std::string> decodeWelcome(const std::string& payload, uint32_t worldSize);
std::string encodeRefuse(const std::string& reason);
std::string decodeRefuse(const std::string& payload);
struct Abort {
  ErrorCode code = ErrorCode::kPeerFailed;  ///< a code the sender named that is no ErrorCode becomes kPeerFailed
  std::string message;
};
std::string encodeAbort(ErrorCode code, const std::string& message);
Abort decodeAbort(const std::string& payload);
/// kGather: the sequence number, then the blob. decodeGather() throws on a payload shorter than the number.
std::string encodeGather(uint64_t seq, const std::string& blob);
std::pair<uint64_t, std::string> decodeGather(const std::string& payload);
std::string encodeGatherResult(uint64_t seq, const std::vector<std::string>& blobs);
std::vector<std::string> decodeGatherResult(const std::string& payload, uint64_t seq, uint32_t worldSize);

/// Compares two secrets in time that depends only on their lengths, not on where they first differ, so a
/// stranger cannot learn the secret byte by byte from the server's response time.
bool constantTimeEqual(const std::string& a, const std::string& b);

}  // namespace gdx::bootstrap
