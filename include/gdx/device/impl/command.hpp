// The 16-byte command that producers (host threads or GPU threads) write into a command ring and a proxy
// thread turns into transport operations.
//
// Layout: two 64-bit words. Bit 63 of each word is the ring's lap bit (see ring.hpp); the other
// 126 bits are the payload, numbered 0..62 in word 0 and 63..125 in word 1. Fields are placed at fixed payload
// bit positions given by the constants below; a field may straddle the two words. Because both words carry
// the lap bit, a consumer that reads the two halves at different times can tell a torn read from a valid one.
//
//   payload bit  0.. 3  opcode
//   payload bit  4..15  peer (destination rank, or the relay of a relayed command)
//   put / putWithSignal / relayPut:
//                16..21  source window id       22..27  destination window id
//                28..51  size in bytes (< 16 MiB; larger puts are split by the API)
//                52..88  source offset           89..125 destination offset (< 128 GiB each)
//   signal set / add (also the second slot of a putWithSignal):
//                16..31  signal id               32..95  64-bit value
//                96..107 forward: 0, or 1 + the rank the peer forwards the data and the signal to (relay)
//   relayTo (the second slot of a relayPut):
//                96..107 1 + the rank the relay forwards the put's data to
//   atomic add:  16..21  destination window id   22..58  destination offset   59..122  64-bit addend
//
// Two commands occupy two consecutive ring slots (slotsFor): a putWithSignal, followed by a kSignalSet or kSignalAdd
// command for the same peer (the proxy turns the pair into one write-with-immediate), and a relayPut, followed by a
// relayTo command that names the rank the relay forwards the data to (a relayed put without a signal).
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/types.hpp"

namespace gdx {

enum class Opcode : uint8_t {
  kNop = 0,
  kPut = 1,
  kPutWithSignal = 2,
  kSignalSet = 3,
  kSignalAdd = 4,
  kAtomicAdd = 5,
  kRelayPut = 6,
  kRelayTo = 7,
};
constexpr int kNumOpcodes = 8;

/// Field widths, in bits.
constexpr int kOpcodeBits = 4;
constexpr int kPeerBits = 12;
constexpr int kWindowIdBits = 6;
constexpr int kSizeBits = 24;
constexpr int kOffsetBits = 37;
constexpr int kSignalIdBits = 16;
constexpr int kValueBits = 64;

/// Field limits derived from the widths.
constexpr uint32_t kMaxPeers = 1u << kPeerBits;
constexpr uint32_t kMaxWindows = 1u << kWindowIdBits;
constexpr uint64_t kMaxCommandBytes = (uint64_t{1} << kSizeBits) - 1;
constexpr uint64_t kMaxWindowOffset = (uint64_t{1} << kOffsetBits) - 1;
constexpr uint32_t kMaxSignals = 1u << kSignalIdBits;

/// Payload bit positions.
constexpr int kOpcodePos = 0;
constexpr int kPeerPos = kOpcodePos + kOpcodeBits;   // 4
constexpr int kSrcWindowPos = kPeerPos + kPeerBits;  // 16
constexpr int kDstWindowPos = kSrcWindowPos + kWindowIdBits;
constexpr int kSizePos = kDstWindowPos + kWindowIdBits;
constexpr int kSrcOffsetPos = kSizePos + kSizeBits;
constexpr int kDstOffsetPos = kSrcOffsetPos + kOffsetBits;
constexpr int kSignalIdPos = kPeerPos + kPeerBits;  // 16
constexpr int kSignalValuePos = kSignalIdPos + kSignalIdBits;
constexpr int kForwardPos = kSignalValuePos + kValueBits;  // 96
constexpr int kAtomicWindowPos = kPeerPos + kPeerBits;     // 16
constexpr int kAtomicOffsetPos = kAtomicWindowPos + kWindowIdBits;
constexpr int kAtomicValuePos = kAtomicOffsetPos + kOffsetBits;
constexpr int kPayloadBits = 126;
static_assert(kDstOffsetPos + kOffsetBits == kPayloadBits, "put fields fill the payload exactly");
static_assert(kForwardPos + kPeerBits <= kPayloadBits, "signal fields fit");
static_assert(kAtomicValuePos + kValueBits <= kPayloadBits, "atomic fields fit");

constexpr uint64_t kLapBit = uint64_t{1} << 63;

struct alignas(16) Command {
  uint64_t word[2];

  /// Reads `width` bits at payload position `pos` (the lap bits are skipped).
  GDX_HOST_DEVICE_INLINE uint64_t field(int pos, int width) const {
    uint64_t lo = word[0] & ~kLapBit;
    uint64_t hi = word[1] & ~kLapBit;
    uint64_t v;
    if (pos >= 63) {
      v = hi >> (pos - 63);
    } else {
      v = lo >> pos;
      if (pos + width > 63) v |= hi << (63 - pos);
    }
    return width == 64 ? v : v & ((uint64_t{1} << width) - 1);
  }
  /// Writes `width` bits at payload position `pos`; bits of `v` beyond the width are dropped, never spilled into
  /// the next field (callers check ranges first: a truncated offset would address the wrong bytes).
  GDX_HOST_DEVICE_INLINE void setField(int pos, int width, uint64_t v) {
    if (width < 64) v &= (uint64_t{1} << width) - 1;
    if (pos >= 63) {
      word[1] |= (v << (pos - 63)) & ~kLapBit;
    } else {
      word[0] |= (v << pos) & ~kLapBit;
      if (pos + width > 63) word[1] |= (v >> (63 - pos)) & ~kLapBit;
    }
  }

  GDX_HOST_DEVICE_INLINE Opcode opcode() const { return static_cast<Opcode>(field(kOpcodePos, kOpcodeBits)); }
  GDX_HOST_DEVICE_INLINE uint32_t peer() const { return static_cast<uint32_t>(field(kPeerPos, kPeerBits)); }
  GDX_HOST_DEVICE_INLINE uint32_t srcWindow() const {
    return static_cast<uint32_t>(field(kSrcWindowPos, kWindowIdBits));
  }
  GDX_HOST_DEVICE_INLINE uint32_t dstWindow() const {
    return static_cast<uint32_t>(
        field(opcode() == Opcode::kAtomicAdd ? kAtomicWindowPos : kDstWindowPos, kWindowIdBits));
  }
  GDX_HOST_DEVICE_INLINE uint64_t size() const { return field(kSizePos, kSizeBits); }
  GDX_HOST_DEVICE_INLINE uint64_t srcOffset() const { return field(kSrcOffsetPos, kOffsetBits); }
  GDX_HOST_DEVICE_INLINE uint64_t dstOffset() const {
    return field(opcode() == Opcode::kAtomicAdd ? kAtomicOffsetPos : kDstOffsetPos, kOffsetBits);
  }
  GDX_HOST_DEVICE_INLINE uint32_t signalId() const { return static_cast<uint32_t>(field(kSignalIdPos, kSignalIdBits)); }
  GDX_HOST_DEVICE_INLINE uint64_t value() const {
    return field(opcode() == Opcode::kAtomicAdd ? kAtomicValuePos : kSignalValuePos, kValueBits);
  }
  /// Signal and relayTo slots: the rank the receiving peer forwards to (a relay), or -1 when the peer is the
  /// destination.
  GDX_HOST_DEVICE_INLINE int forwardTo() const { return static_cast<int>(field(kForwardPos, kPeerBits)) - 1; }
  /// The lap bit this command was published with (both words agree unless the read was torn).
  GDX_HOST_DEVICE_INLINE bool lapsAgree(uint64_t lap) const {
    uint64_t want = lap ? kLapBit : 0;
    return (word[0] & kLapBit) == want && (word[1] & kLapBit) == want;
  }
  GDX_HOST_DEVICE_INLINE Command withLap(uint64_t lap) const {
    Command c = *this;
    if (lap) {
      c.word[0] |= kLapBit;
      c.word[1] |= kLapBit;
    } else {
      c.word[0] &= ~kLapBit;
      c.word[1] &= ~kLapBit;
    }
    return c;
  }

  /// A put; `op` kPutWithSignal or kRelayPut makes it the first slot of such a pair.
  GDX_HOST_DEVICE_INLINE static Command put(uint32_t peer, uint32_t srcWindow, uint64_t srcOffset, uint32_t dstWindow,
                                            uint64_t dstOffset, uint64_t bytes, Opcode op = Opcode::kPut) {
    Command c{{0, 0}};
    c.setField(kOpcodePos, kOpcodeBits, static_cast<uint64_t>(op));
    c.setField(kPeerPos, kPeerBits, peer);
    c.setField(kSrcWindowPos, kWindowIdBits, srcWindow);
    c.setField(kDstWindowPos, kWindowIdBits, dstWindow);
    c.setField(kSizePos, kSizeBits, bytes);
    c.setField(kSrcOffsetPos, kOffsetBits, srcOffset);
    c.setField(kDstOffsetPos, kOffsetBits, dstOffset);
    return c;
  }
  /// A signal update (kSignalAdd or kSignalSet). forwardTo >= 0: `peer` is a relay that forwards the update (and,
  /// in the second slot of a putWithSignal, the put's data) to rank forwardTo.
  GDX_HOST_DEVICE_INLINE static Command signal(uint32_t peer, uint32_t signalId, uint64_t value, SignalOp op,
                                               int forwardTo = -1) {
    Command c{{0, 0}};
    c.setField(kOpcodePos, kOpcodeBits,
               static_cast<uint64_t>(op == SignalOp::kAdd ? Opcode::kSignalAdd : Opcode::kSignalSet));
    c.setField(kPeerPos, kPeerBits, peer);
    c.setField(kSignalIdPos, kSignalIdBits, signalId);
    c.setField(kSignalValuePos, kValueBits, value);
    if (forwardTo >= 0) c.setField(kForwardPos, kPeerBits, static_cast<uint64_t>(forwardTo) + 1);
    return c;
  }
  /// The second slot of a relayPut: the relay `peer` forwards the put's data to rank `forwardTo`.
  GDX_HOST_DEVICE_INLINE static Command relayTo(uint32_t peer, int forwardTo) {
    Command c{{0, 0}};
    c.setField(kOpcodePos, kOpcodeBits, static_cast<uint64_t>(Opcode::kRelayTo));
    c.setField(kPeerPos, kPeerBits, peer);
    c.setField(kForwardPos, kPeerBits, static_cast<uint64_t>(forwardTo) + 1);
    return c;
  }
  /// The signal update a kSignalSet / kSignalAdd slot carries.
  GDX_HOST_DEVICE_INLINE SignalOp signalOp() const {
    return opcode() == Opcode::kSignalSet ? SignalOp::kSet : SignalOp::kAdd;
  }
  GDX_HOST_DEVICE_INLINE static Command atomicAdd(uint32_t peer, uint32_t dstWindow, uint64_t dstOffset,
                                                  uint64_t addend) {
    Command c{{0, 0}};
    c.setField(kOpcodePos, kOpcodeBits, static_cast<uint64_t>(Opcode::kAtomicAdd));
    c.setField(kPeerPos, kPeerBits, peer);
    c.setField(kAtomicWindowPos, kWindowIdBits, dstWindow);
    c.setField(kAtomicOffsetPos, kOffsetBits, dstOffset);
    c.setField(kAtomicValuePos, kValueBits, addend);
    return c;
  }
};

static_assert(sizeof(Command) == 16, "a command is exactly 16 bytes");
static_assert(alignof(Command) == 16, "a command is published with one 16-byte store");
static_assert(std::is_trivially_copyable<Command>::value, "commands are copied as raw bytes");

/// Where the last command of a put of `bytes` starts: puts larger than kMaxCommandBytes are split into full
/// commands and a last one of 1..kMaxCommandBytes bytes, which carries the signal of a putWithSignal.
GDX_HOST_DEVICE_INLINE uint64_t lastCommandOffset(uint64_t bytes) {
  return bytes <= kMaxCommandBytes ? 0 : (bytes - 1) / kMaxCommandBytes * kMaxCommandBytes;
}

/// Number of ring slots a command of this opcode occupies.
GDX_HOST_DEVICE_INLINE int slotsFor(Opcode op) {
  return op == Opcode::kPutWithSignal || op == Opcode::kRelayPut ? 2 : 1;
}

/// Printable opcode name for error messages.
inline const char* opcodeName(Opcode op) {
  switch (op) {
    case Opcode::kNop: return "nop";
    case Opcode::kPut: return "put";
    case Opcode::kPutWithSignal: return "putWithSignal";
    case Opcode::kSignalSet: return "signalSet";
    case Opcode::kSignalAdd: return "signalAdd";
    case Opcode::kAtomicAdd: return "atomicAdd";
    case Opcode::kRelayPut: return "relayPut";
    case Opcode::kRelayTo: return "relayTo";
  }
  return "unknown";
}

}  // namespace gdx
