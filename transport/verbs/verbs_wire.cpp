#include "transport/verbs/verbs_wire.hpp"

#include <algorithm>
#include <cstring>

#include "base/byte_codec.hpp"

namespace gdx::verbs {

std::string decodeSend(const void* data, size_t bytes, SendRecord* out) {
  if (bytes > kRecvSlotBytes) return "a SEND of " + std::to_string(bytes) + " bytes, more than a receive slot";
  // The kind lies where both records have it; a SEND too short to hold it is neither.
  uint32_t kind = ~0u;
  ByteReader peek(data, bytes);
  if (peek.skip(offsetof(ControlRecord, kind))) peek.get(&kind);
  if (kind == kControlMessage) {
    MessageRecord& r = out->message;
    r = MessageRecord{};
    ByteReader(data, bytes).getRaw(&r, std::min<size_t>(bytes, sizeof r));
    if (r.bytes == 0 || r.bytes > kMaxMessageBytes || bytes != kMessageHeaderBytes + r.bytes)
      return "a message record claiming " + std::to_string(r.bytes) + " bytes";
    out->kind = SendRecord::Kind::kMessage;
    return "";
  }
  ControlRecord& r = out->control;
  ByteReader record(data, bytes);
  if (!record.get(&r) || !record.done()) return "neither a control record nor a message";
  if (r.kind == kControlStaged || r.kind == kControlStagedImm) {
    if (r.slot >= kStageSlots || r.value == 0 || r.value > kStageSlotBytes)
      return "slot " + std::to_string(r.slot) + " / " + std::to_string(r.value) + " bytes is not a staging slot";
    out->kind = SendRecord::Kind::kStaged;
    return "";
  }
  if (r.kind > static_cast<uint32_t>(SignalOp::kSet)) return "unknown atomic kind " + std::to_string(r.kind);
  out->kind = SendRecord::Kind::kAtomic;
  return "";
}

std::string encodeAddress(const AddressHeader& header, const AddressEntry* entries, size_t count) {
  ByteWriter w;
  w.put(header).putRaw(entries, count * sizeof *entries);
  return w.take();
}

std::string decodeAddress(const std::string& blob, int peer, int world, int lanes, bool ethernet,
                          AddressHeader* header) {
  AddressHeader& h = *header;
  ByteReader r(blob);
  if (!r.get(&h)) return "a blob of " + std::to_string(blob.size()) + " bytes";
  if (h.magic != kAddressMagic) return "not a verbs address";
  if (h.rank != static_cast<uint32_t>(peer)) return "the address of rank " + std::to_string(h.rank);
  if (h.world != static_cast<uint32_t>(world)) return "an address in a world of " + std::to_string(h.world);
  if (h.lanes < static_cast<uint32_t>(lanes)) return "an address with " + std::to_string(h.lanes) + " lanes";
  // In 64 bits: lanes and world are 32-bit, so their product times 8 cannot overflow.
  if (r.left() != uint64_t{h.lanes} * uint64_t{h.world} * sizeof(AddressEntry))
    return "an address of " + std::to_string(blob.size()) + " bytes for " + std::to_string(h.lanes) + " lanes";
  if ((h.ethernet != 0) != ethernet) return "an address on another link layer";
  return "";
}

AddressEntry addressEntry(const std::string& blob, int lane, int world, int rank) {
  AddressEntry e;
  const size_t index =
      static_cast<size_t>(static_cast<uint32_t>(lane)) * static_cast<size_t>(world) + static_cast<size_t>(rank);
  std::memcpy(&e, blob.data() + sizeof(AddressHeader) + index * sizeof e, sizeof e);
  return e;
}

std::string decodeWindowKey(const std::string& key, uint64_t bytes, WindowKey* out) {
  if (key.size() != sizeof *out) return "a key of " + std::to_string(key.size()) + " bytes";
  ByteReader(key).get(out);
  if (out->bytes != bytes) return "a key for " + std::to_string(out->bytes) + " bytes";
  return "";
}

}  // namespace gdx::verbs
