// The bytes two endpoints exchange besides the data itself: the control messages of a connection (carried by the
// transport's postMessage, at most kMaxMessageBytes each, in the per-peer order of the lane) and the descriptors
// advertise() hands to the application. Decoders accept only what they understand: a wrong length, an unknown type,
// a descriptor whose checksum does not match are refused with the reason, never acted on.
//
// Messages (first byte the type, then little-endian fields):
//   kKeyRequest   window secret               a writer asks for the transport key of an advertised window (`secret`,
//                                             carried in `offset`: that of a URL transport key, else 0)
//   kKeyPart      window bytes total at data   one piece of that key (keys are longer than one message)
//   kKeyRefused   window                      the window was never advertised on this connection (or is gone)
//   kClearToSend  seq window offset bytes credits   a receive of more than kEagerBytes is posted: the seq-th send
//                                             may write there, at most `bytes` (the buffer's size); `credits` eager
//                                             slots freed since the last report
//   kSendRefused  seq sendBytes               the seq-th send is larger than its receive's buffer; nothing was written
//   kFence        id                          answered by kFenceAck once every earlier write of the lane is in place
//   kFenceAck     id
//   kReadRequest  id srcWindow srcOffset bytes dstWindow dstOffset   the owner writes the range back, then kReadDone
//   kReadDone     id status
//   kCredit       credits                     eager slots freed since the last report, on their own
//   kReceiveRefused seq bytes                 the seq-th send is larger than its receive's buffer of `bytes`; the
//                                             receive failed
//   kRequestToSend seq bytes                  the seq-th send is larger than kEagerBytes (a small receive refuses it);
//                                             sent before its data, it tells the receive the message's size
//   kReceiveFailed seq code                   the seq-th send's receive failed (`code`: it timed out, another of its
//                                             buffers was refused, its memory was deregistered) and takes no data:
//                                             the send fails, and what still arrives for it is dropped
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gdx/error.hpp"
#include "transport/transport.hpp"

namespace gdx::p2p {

enum class MsgType : uint8_t {
  kKeyRequest = 1,
  kKeyPart = 2,
  kKeyRefused = 3,
  kClearToSend = 4,
  kSendRefused = 5,
  kFence = 6,
  kFenceAck = 7,
  kReadRequest = 8,
  kReadDone = 9,
  kCredit = 10,
  kReceiveRefused = 11,
  kRequestToSend = 12,
  kReceiveFailed = 13,
  kSendWithdrawn = 14,    ///< a send failed on the sender's side (timeout, ...): no receive may take it
  kWithdrawTooLate = 15,  ///< the receive for a withdrawn send had taken its data: the connection fails on both sides
};

/// Why a read was refused (kReadDone's status).
enum class ReadStatus : uint8_t { kOk = 0, kUnknownWindow = 1, kOutOfRange = 2, kFailed = 3 };

/// One control message, decoded. Only the fields of its type are meaningful.
struct ControlMsg {
  MsgType type = MsgType::kFence;
  uint64_t id = 0;  ///< seq (kClearToSend, kSendRefused) or id (kFence*, kRead*)
  uint32_t window = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;  ///< kKeyPart: the window's size; kSendRefused: the send's size
  uint32_t dstWindow = 0;
  uint64_t dstOffset = 0;
  ReadStatus status = ReadStatus::kOk;
  uint16_t keyTotal = 0;            ///< kKeyPart: length of the whole key
  uint16_t keyAt = 0;               ///< kKeyPart: where this piece goes
  uint32_t credits = 0;             ///< kClearToSend, kCredit: eager slots the receiver freed since its last report
  ErrorCode code = ErrorCode::kOk;  ///< kReceiveFailed, kSendWithdrawn, kWithdrawTooLate: how it failed (never kOk)
  std::string keyPiece;             ///< kKeyPart
};

/// Eager sends: a send of at most kEagerBytes does not wait for a clear-to-send (its receive sends none); it is
/// written at once into the next of kEagerSlots slots of the receiver's eager buffer (window kEagerWindow, host memory
/// the receiver registers on first use), and the receive copies it out. The sender holds one credit per free slot and
/// waits (in order, bounded by its deadline) when it has none; the receiver returns credits as receives take the data
/// out, and a returned credit is also what completes the send, so a message too large for its receive fails both sides
/// as it does for the other sends (connection.hpp). Both sides must agree on these numbers.
constexpr uint64_t kEagerBytes = 4096;
constexpr uint32_t kEagerSlots = 32;
/// The window of the eager buffer: just below the advertised windows, above every memory region id.
constexpr uint32_t kEagerWindow = 0x7fffffffu;

/// Key bytes that fit in one kKeyPart message.
constexpr size_t kKeyPieceBytes = kMaxMessageBytes - 1 - 4 - 8 - 2 - 2 - 1;
/// Longest key a peer may send (verbs keys are about 48 bytes, TCP keys a few dozen characters).
constexpr size_t kMaxKeyBytes = 1024;

MessageOp encode(const ControlMsg& m, int peer);
/// "" and *out when `m` is a well-formed message, else why not.
std::string decode(const RemoteMessage& m, ControlMsg* out);
const char* msgTypeName(MsgType t);

/// What advertise() returns: enough for the peer to address a range of this endpoint's memory on one connection.
struct Descriptor {
  uint64_t token = 0;   ///< the connection's token: a descriptor of another connection is refused
  uint32_t window = 0;  ///< the transport window that holds exactly the advertised range
  uint64_t bytes = 0;   ///< size of the advertised range
};
/// Size of an encoded Descriptor.
constexpr size_t kDescriptorBytes = 4 + 2 + 8 + 4 + 8 + 8;

std::string encodeDescriptor(const Descriptor& d);
/// "" and *out when `bytes` is a descriptor made by encodeDescriptor(), else why not (truncated, not a descriptor,
/// damaged: the checksum does not match).
std::string decodeDescriptor(const std::string& bytes, Descriptor* out);

/// What metadata() returns: where to dial an endpoint, and its GPU.
struct EndpointAddress {
  std::string ip;
  int32_t port = 0;
  int32_t gpu = -1;
};
/// Longest address in metadata.
constexpr size_t kMaxMetadataIpBytes = 255;

std::string encodeMetadata(const EndpointAddress& a);
/// "" and *out when `bytes` is metadata made by encodeMetadata(), else why not (not metadata, another version,
/// truncated or overlong, damaged, a port outside 1..65535, a GPU below -1).
std::string decodeMetadata(const std::string& bytes, EndpointAddress* out);

/// What advertiseIpc() returns: a range of a GPU allocation named by its CUDA IPC handle, on one host.
struct IpcDescriptor {
  static constexpr size_t kHandleBytes = 64;  ///< sizeof(cudaIpcMemHandle_t)
  uint64_t host = 0;                          ///< names the host (a handle opens only there)
  uint64_t pid = 0;                           ///< the owner process
  int32_t device = -1;
  char handle[kHandleBytes] = {};
  uint64_t allocBase = 0;  ///< the allocation's address in the owner (names it in the cache of opened handles)
  uint64_t offset = 0;     ///< where the range starts in the allocation
  uint64_t bytes = 0;
};

std::string encodeIpc(const IpcDescriptor& d);
/// "" and *out when `bytes` is a descriptor made by encodeIpc(), else why not (also a negative device, or a range
/// whose end does not fit in 64 bits).
std::string decodeIpc(const std::string& bytes, IpcDescriptor* out);

/// FNV-1a over `n` bytes: the checksum of descriptors and metadata (catches damage, not malice; the transport's own
/// checks bound what a forged one can reach).
uint64_t checksum(const void* p, size_t n);

}  // namespace gdx::p2p
