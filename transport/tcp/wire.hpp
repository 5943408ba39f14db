// Wire format of the TCP transport. Every connection carries one direction (the rank that connects is the one
// that sends), starts with a Hello that the acceptor answers with a HelloAck, and then carries a stream of
// MessageHeaders, each followed by `chunkBytes` bytes of payload (a chunk of a write, an atomic's operand or a control
// message). The
// structs are sent as they are laid out in memory: every field is naturally aligned (no padding, checked below) and gdx
// only runs on little-endian hosts.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "transport/transport.hpp"

namespace gdx::tcp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP wire format is little-endian");

constexpr uint32_t kHelloMagic = 0x48584447;    // "GDXH"
constexpr uint32_t kAckMagic = 0x41584447;      // "GDXA"
constexpr uint32_t kMessageMagic = 0x4D584447;  // "GDXM"
constexpr uint16_t kWireVersion = 4;            ///< 2: kAtomic; 3: kControl; 4: kRefusal
/// Longest job secret a Hello may carry; bounds what the acceptor reads from a stranger.
constexpr uint32_t kMaxSecretBytes = 4096;
/// Largest chunk the format can describe (MessageHeader::chunkBytes is 32 bits; 1 GiB keeps it far from that).
constexpr uint64_t kMaxChunkBytes = 1ull << 30;

/// First bytes on every connection, followed by `secretBytes` bytes of the job secret.
struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kWireVersion;
  uint16_t reserved = 0;
  int32_t rank = -1;  ///< the sender
  int32_t worldSize = 0;
  uint32_t lane = 0;
  uint32_t lanes = 0;
  uint32_t socketIndex = 0;
  uint32_t socketsPerPeer = 0;
  uint32_t secretBytes = 0;
  uint32_t reserved2 = 0;
  uint64_t chunkBytes = 0;  ///< the sender's chunk size; must not exceed the receiver's
};
static_assert(sizeof(Hello) == 48 && std::is_trivially_copyable_v<Hello>);

/// Why an acceptor refused a Hello (kAccepted: it did not).
enum class HelloReply : uint32_t {
  kAccepted = 0,
  kBadSecret,
  kBadRank,
  kWorldMismatch,
  kBadLane,
  kBadSocket,
  kDuplicate,
  kChunkTooLarge,
};
const char* helloReplyName(HelloReply reply);

/// How far the bytes an acceptor received so far (`buffer`, read no further than helloBytesWanted()) go towards a
/// Hello.
enum class HelloParse {
  kIncomplete,  ///< more bytes are needed
  kComplete,    ///< *hello and *secret hold it
  kNotGdx,      ///< another magic: not a gdx connection (dropped without an answer)
  kBadVersion,  ///< a gdx Hello of another wire version (dropped without an answer)
  kOversized,   ///< a secret longer than kMaxSecretBytes (refused as kBadSecret)
};
HelloParse parseHello(const std::string& buffer, Hello* hello, std::string* secret);
/// How many bytes the Hello that begins `buffer` has in all (its header, then its secret): the acceptor reads no
/// further, since what follows belongs to the data stream.
size_t helloBytesWanted(const std::string& buffer);

/// What an acceptor expects of a complete Hello.
struct HelloExpectations {
  std::string secret;
  int32_t worldSize = 0;
  uint32_t lanes = 0;
  uint32_t socketsPerPeer = 0;
  uint64_t chunkBytes = 0;  ///< the receiver's: the sender's must not exceed it
};
/// kAccepted when the Hello belongs to this job and names a rank, lane and socket that exist; else why not (the
/// secret first, so that a stranger learns nothing else about the job).
HelloReply checkHello(const Hello& hello, const std::string& secret, const HelloExpectations& expected);

/// The acceptor's answer to a Hello; on a refusal the connection is closed right after it.
struct HelloAck {
  uint32_t magic = kAckMagic;
  uint32_t reply = 0;  ///< a HelloReply
};
static_assert(sizeof(HelloAck) == 8 && std::is_trivially_copyable_v<HelloAck>);

enum class MessageType : uint8_t {
  kWrite = 1,    ///< a chunk of a one-sided write; chunkBytes of payload follow
  kGoodbye = 2,  ///< the sender closes this connection on purpose; nothing follows
  kAtomic = 3,   ///< a remote atomic on the 64-bit word at `offset`; its 8-byte operand follows (see below)
  kControl = 4,  ///< a control message (TransportLane::postMessage); its payload follows (see below)
  kRefusal = 5,  ///< the sender refuses what it received and closes; why (text, `bytes` in one chunk) follows
};
/// Longest reason a kRefusal carries.
constexpr uint64_t kMaxRefusalBytes = 1024;
constexpr uint8_t kFlagImm = 1;  ///< the write carries an immediate to announce once it is in place

/// An atomic is one message of one chunk, numbered in the same `seq` sequence as the writes of its direction:
/// `imm` holds the SignalOp, `bytes` and `chunkBytes` are 8, `chunkOffset` and `flags` are 0, `offset` is
/// 8-byte aligned, and the payload is the operand.
constexpr uint32_t kAtomicBytes = 8;

/// A control message is likewise one message of one chunk in the `seq` sequence: `bytes` and `chunkBytes` are its
/// length (1..kMaxMessageBytes), every other field but `lane` and `seq` is 0, and the payload is the message. It is
/// delivered in sequence order, like an immediate.
static_assert(kMaxMessageBytes >= kAtomicBytes, "an atomic's operand and a message share the inline payload buffer");

/// Precedes every chunk. One write of `bytes` bytes at `offset` of window `window` is sent as one or more chunks
/// (possibly over several sockets of the lane), all carrying the same message fields and the message's `seq`,
/// the number of the write within its (lane, sender, receiver) direction.
struct MessageHeader {
  uint32_t magic = kMessageMagic;
  uint16_t version = kWireVersion;
  uint8_t type = 0;  ///< a MessageType
  uint8_t flags = 0;
  uint32_t lane = 0;
  uint32_t window = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;       ///< of the whole write in the window
  uint64_t bytes = 0;        ///< of the whole write
  uint64_t chunkOffset = 0;  ///< of this chunk within the write
  uint32_t chunkBytes = 0;   ///< payload bytes that follow this header
  uint32_t imm = 0;
};
static_assert(sizeof(MessageHeader) == 56 && std::is_trivially_copyable_v<MessageHeader>);

/// Checks everything about a header that does not depend on the receiver's windows: magic, version, type,
/// flags, lane, a write's chunk length (<= maxChunk) and that the chunk lies inside its message (an atomic's operand
/// and a control message are received inline, bounded by kMaxMessageBytes, whatever maxChunk is); for an atomic its
/// kind, size and alignment; for a control message its length. Returns "" when it is well formed, else what is wrong.
std::string checkHeader(const MessageHeader& h, uint32_t expectedLane, uint64_t maxChunk);

/// The parts streamed into one string, for the text of an error: checks on the receive path call it only once one
/// has failed, so that a well-formed message costs no formatting.
template <typename... Parts>
std::string errorText(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// A short human-readable rendering of a header for error messages ("write {...}", "atomic {...}", "message {...}").
std::string describe(const MessageHeader& h);

}  // namespace gdx::tcp
