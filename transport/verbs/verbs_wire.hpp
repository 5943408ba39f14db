// What verbs peers send each other as bytes, apart from the data itself: the address blob exchanged through the
// bootstrap before the queue pairs connect, the window keys, and the records of IBV_WR_SEND (software atomics, staged
// chunks, control messages). Their decoders are here, free of libibverbs, so that they can be tested and fuzzed
// without a device; everything they accept is safe to act on as far as it does not depend on the receiver's windows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.hpp"

namespace gdx::verbs {

/// A receive's buffer and a lane's control send slot: room for a ControlRecord or a MessageRecord.
constexpr size_t kRecvSlotBytes = 128;
constexpr size_t kControlSlotBytes = 128;
/// Slots of each staging ring (lane, sender) and their size: a staged chunk is at most one slot.
constexpr uint32_t kStageSlots = 4;
constexpr uint64_t kStageSlotBytes = 1 << 20;

/// A window's key as registerWindow() returns it.
struct WindowKey {
  uint64_t addr;
  uint64_t bytes;
  uint32_t rkey;
  uint32_t cuda;
  uint64_t stagingAddr;  ///< staged windows: the owner's receive staging area
  uint32_t stagingRkey;
  uint32_t stagingLanes;  ///< lanes the owner's staging area has rings for
  uint32_t staged;
  uint32_t reserved;
};
/// Control kinds: SignalOp values, then staged chunks.
constexpr uint32_t kControlStaged = 2;
constexpr uint32_t kControlStagedImm = 3;
/// A software atomic or a staged chunk as it travels in an IBV_WR_SEND.
struct ControlRecord {
  uint32_t window;
  uint32_t kind;
  uint64_t offset;
  uint64_t value;  ///< atomics: the operand; staged chunks: the byte count
  uint32_t slot;   ///< staged chunks: the slot of the ring (lane, sender)
  uint32_t imm;    ///< kControlStagedImm: the immediate announced once the chunk is in place
};
static_assert(sizeof(ControlRecord) <= kRecvSlotBytes && sizeof(ControlRecord) <= kControlSlotBytes, "slot size");
/// The control kind of a MessageRecord.
constexpr uint32_t kControlMessage = 4;
/// A control message as it travels in an IBV_WR_SEND: the header and then only `bytes` bytes of data. `kind` lies
/// where a ControlRecord has it, so the receiver tells the two apart by it (their lengths may coincide).
struct MessageRecord {
  uint32_t bytes;  ///< 1..kMaxMessageBytes
  uint32_t kind;   ///< kControlMessage
  uint8_t data[kMaxMessageBytes];
};
constexpr uint32_t kMessageHeaderBytes = offsetof(MessageRecord, data);
static_assert(offsetof(MessageRecord, kind) == offsetof(ControlRecord, kind), "the kind must be where both have it");
static_assert(sizeof(MessageRecord) <= kRecvSlotBytes && sizeof(MessageRecord) <= kControlSlotBytes, "slot size");

/// A SEND as the receiver understands it.
struct SendRecord {
  enum class Kind { kAtomic, kStaged, kMessage };
  Kind kind = Kind::kAtomic;
  ControlRecord control{};  ///< kAtomic (kind is a SignalOp) and kStaged (slot < kStageSlots, 1..kStageSlotBytes)
  MessageRecord message{};  ///< kMessage (1..kMaxMessageBytes bytes)
};
/// Decodes the `bytes` bytes a SEND delivered: "" and *out when they are a record a peer may send, else why not.
/// Only what the receiver's windows decide (the window exists, the range lies in it, alignment in memory) is left
/// to check.
std::string decodeSend(const void* data, size_t bytes, SendRecord* out);

/// The start of the address blob; then an AddressEntry per (lane, peer), lane-major.
constexpr uint32_t kAddressMagic = 0x56584447;  // "GDXV"
struct AddressHeader {
  uint32_t magic;
  uint32_t rank;
  uint32_t world;
  uint32_t lanes;
  uint16_t lid;
  uint8_t mtu;
  uint8_t ethernet;
  uint8_t gid[16];
};
struct AddressEntry {
  uint32_t qpn;
  uint32_t psn;
};
static_assert(sizeof(AddressHeader) == 36 && sizeof(AddressEntry) == 8, "sent as laid out in memory");

/// The address blob of rank `rank` with the entries of `lanes` lanes of a world of `world` (`entries`: lane-major).
std::string encodeAddress(const AddressHeader& header, const AddressEntry* entries, size_t count);
/// "" and *header when `blob` is the address of rank `peer` of a world of `world` ranks with at least `lanes` lanes,
/// an entry for each of them and for every rank, on a link layer of the same kind (`ethernet`); else why not.
std::string decodeAddress(const std::string& blob, int peer, int world, int lanes, bool ethernet,
                          AddressHeader* header);
/// The entry of `blob` (accepted by decodeAddress() with `world`) for lane `lane` and rank `rank`.
AddressEntry addressEntry(const std::string& blob, int lane, int world, int rank);

/// "" and *key when `key` is a verbs window key for a window of `bytes` bytes, else why not.
std::string decodeWindowKey(const std::string& key, uint64_t bytes, WindowKey* out);

}  // namespace gdx::verbs
