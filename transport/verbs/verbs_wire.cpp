#include "transport/verbs/verbs_wire.hpp"

#include <algorithm>
#include <cstring>

namespace gdx::verbs {

std::string decodeSend(const void* data, size_t bytes, SendRecord* out) {
  const char* p = static_cast<const char*>(data);
  if (bytes > kRecvSlotBytes) return "a SEND of " + std::to_string(bytes) + " bytes, more than a receive slot";
  // The kind lies where both records have it; a SEND too short to hold it is neither.
  uint32_t kind = ~0u;
  if (bytes >= kMessageHeaderBytes) std::memcpy(&kind, p + offsetof(ControlRecord, kind), sizeof kind);
  if (kind == kControlMessage) {
    MessageRecord& r = out->message;
    r = MessageRecord{};
    std::memcpy(&r, p, std::min<size_t>(bytes, sizeof r));
    if (r.bytes == 0 || r.bytes > kMaxMessageBytes || bytes != kMessageHeaderBytes + r.bytes)
      return "a message record claiming " + std::to_string(r.bytes) + " bytes";
    out->kind = SendRecord::Kind::kMessage;
    return "";
  }
  if (bytes != sizeof(ControlRecord)) return "neither a control record nor a message";
  ControlRecord& r = out->control;
  std::memcpy(&r, p, sizeof r);
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
  std::string blob(reinterpret_cast<const char*>(&header), sizeof header);
  blob.append(reinterpret_cast<const char*>(entries), count * sizeof *entries);
  return blob;
}

std::string decodeAddress(const std::string& blob, int peer, int world, int lanes, bool ethernet,
                          AddressHeader* header) {
  AddressHeader& h = *header;
  if (blob.size() < sizeof h) return "a blob of " + std::to_string(blob.size()) + " bytes";
  std::memcpy(&h, blob.data(), sizeof h);
  if (h.magic != kAddressMagic) return "not a verbs address";
  if (h.rank != static_cast<uint32_t>(peer)) return "the address of rank " + std::to_string(h.rank);
  if (h.world != static_cast<uint32_t>(world)) return "an address in a world of " + std::to_string(h.world);
  if (h.lanes < static_cast<uint32_t>(lanes)) return "an address with " + std::to_string(h.lanes) + " lanes";
  // In 64 bits: lanes and world are 32-bit, so their product times 8 cannot overflow.
  if (blob.size() - sizeof h != uint64_t{h.lanes} * uint64_t{h.world} * sizeof(AddressEntry))
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
  std::memcpy(out, key.data(), sizeof *out);
  if (out->bytes != bytes) return "a key for " + std::to_string(out->bytes) + " bytes";
  return "";
}

}  // namespace gdx::verbs
