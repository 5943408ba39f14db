// Fuzzes what a verbs peer sends as bytes (transport/verbs/verbs_wire.hpp), without a device: the first input byte
// picks the decoder — a SEND's record (decodeSend), the address blob of connect() (decodeAddress, addressEntry) or a
// window key (decodeWindowKey) — and the rest is what arrived. Accepted records must satisfy what the receiver then
// relies on; the input is copied into an exactly sized buffer, so ASan reports any read past what arrived.
#include <vector>

#include "fuzz_check.hpp"
#include "transport/verbs/verbs_wire.hpp"

using namespace gdx::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gdx::fuzz::Input in(data, size);
  const uint8_t which = in.take<uint8_t>() % 3;
  if (which == 0) {
    const std::string bytes = in.rest();
    std::vector<char> received(bytes.begin(), bytes.end());
    SendRecord r;
    if (!decodeSend(received.data(), received.size(), &r).empty()) return 0;
    GDX_FUZZ_CHECK(received.size() <= kRecvSlotBytes);
    if (r.kind == SendRecord::Kind::kMessage) {
      GDX_FUZZ_CHECK(r.message.kind == kControlMessage && r.message.bytes >= 1);
      GDX_FUZZ_CHECK(r.message.bytes <= gdx::kMaxMessageBytes);
      GDX_FUZZ_CHECK(received.size() == kMessageHeaderBytes + r.message.bytes);
    } else if (r.kind == SendRecord::Kind::kStaged) {
      GDX_FUZZ_CHECK(received.size() == sizeof(ControlRecord));
      GDX_FUZZ_CHECK(r.control.kind == kControlStaged || r.control.kind == kControlStagedImm);
      GDX_FUZZ_CHECK(r.control.slot < kStageSlots && r.control.value >= 1 && r.control.value <= kStageSlotBytes);
    } else {
      GDX_FUZZ_CHECK(received.size() == sizeof(ControlRecord));
      GDX_FUZZ_CHECK(r.control.kind <= static_cast<uint32_t>(gdx::SignalOp::kSet));
    }
  } else if (which == 1) {
    const int world = 1 + in.take<uint8_t>() % 8;
    const int peer = in.take<uint8_t>() % world;
    const int rank = in.take<uint8_t>() % world;
    const int lanes = 1 + in.take<uint8_t>() % 4;
    const bool ethernet = in.take<uint8_t>() % 2;
    const std::string blob = in.rest();
    AddressHeader h;
    if (!decodeAddress(blob, peer, world, lanes, ethernet, &h).empty()) return 0;
    GDX_FUZZ_CHECK(h.magic == kAddressMagic && h.rank == static_cast<uint32_t>(peer));
    GDX_FUZZ_CHECK(h.lanes >= static_cast<uint32_t>(lanes) && h.world == static_cast<uint32_t>(world));
    // connect() reads the entry of every lane it uses towards this rank; the blob is exactly sized on the heap.
    std::string exact(blob);
    exact.shrink_to_fit();
    for (int l = 0; l < lanes; ++l) (void)addressEntry(exact, l, world, rank);
  } else {
    const uint64_t bytes = in.take<uint64_t>();
    WindowKey k;
    if (!decodeWindowKey(in.rest(), bytes, &k).empty()) return 0;
    GDX_FUZZ_CHECK(k.bytes == bytes);
  }
  return 0;
}
