// Fuzzes the TCP transport's receive path short of the sockets (transport/tcp/wire.hpp, rx_order.hpp): the input is a
// stream of MessageHeaders as one direction of a lane delivers them, each followed by its payload, judged as
// receiveOne() judges them — checkHeader(), then for writes and atomics checkRange() against the receiver's window,
// then RxOrder — and placed into a window of fuzzer-chosen size. The window is an exactly sized heap block, so ASan
// reports any chunk these checks let past its end; deliveries must come in sequence order, each complete.
#include <vector>

#include "fuzz_check.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/tcp/rx_order.hpp"
#include "transport/tcp/wire.hpp"

using namespace gdx::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gdx::fuzz::Input in(data, size);
  const uint32_t lane = in.take<uint8_t>() % 2;
  const uint64_t maxChunk = uint64_t{1} << (in.take<uint8_t>() % 13);
  const uint64_t maxAhead = 1 + in.take<uint8_t>() % 16;
  const uint32_t windowId = in.take<uint8_t>() % 2;
  const size_t windowBytes = 1 + in.take<uint16_t>() % 4096;
  std::vector<char> window(windowBytes);
  RxOrder order(maxAhead);

  while (!in.empty()) {
    const MessageHeader h = in.take<MessageHeader>();
    if (!checkHeader(h, lane, maxChunk).empty()) return 0;  // the peer is failed: its connection is closed
    (void)describe(h);
    GDX_FUZZ_CHECK(h.magic == kMessageMagic && h.version == kWireVersion && h.lane == lane);
    if (h.type == static_cast<uint8_t>(MessageType::kGoodbye)) return 0;
    if (h.type == static_cast<uint8_t>(MessageType::kRefusal)) {  // its reason is read, then the peer is failed
      GDX_FUZZ_CHECK(h.bytes >= 1 && h.bytes <= kMaxRefusalBytes && h.chunkBytes == h.bytes);
      (void)in.bytes(h.chunkBytes);
      return 0;
    }
    const bool control = h.type == static_cast<uint8_t>(MessageType::kControl);
    const bool atomic = h.type == static_cast<uint8_t>(MessageType::kAtomic);
    if (!control && !atomic) GDX_FUZZ_CHECK(h.chunkBytes <= maxChunk && h.chunkBytes >= 1);
    if (control || atomic) GDX_FUZZ_CHECK(h.chunkBytes <= gdx::kMaxMessageBytes && h.chunkBytes == h.bytes);
    char* dst = nullptr;
    if (!control) {
      if (h.window != windowId) return 0;
      if (!gdx::common::checkRange(h.offset, h.bytes, windowBytes).empty()) return 0;
      dst = window.data() + h.offset + h.chunkOffset;
      if (atomic && reinterpret_cast<uintptr_t>(dst) % alignof(uint64_t) != 0) return 0;
    }
    uint8_t payload[gdx::kMaxMessageBytes];
    std::string bytes = in.bytes(h.chunkBytes);
    if (bytes.size() < h.chunkBytes) return 0;  // the connection ended inside the payload
    if (control || atomic) {
      std::memcpy(payload, bytes.data(), bytes.size());
      if (!order.admit(h, reinterpret_cast<uint64_t*>(dst), payload).empty()) return 0;
    } else {
      if (!order.admit(h).empty()) return 0;
      std::memcpy(dst, bytes.data(), bytes.size());
    }
    order.placed(h, [&](const RxOrder::Message& m) {
      GDX_FUZZ_CHECK(m.placed == m.bytes && m.claimed == m.bytes);
      if (m.atomic) {
        GDX_FUZZ_CHECK(m.word != nullptr && m.bytes == kAtomicBytes);
        uint64_t operand;
        std::memcpy(&operand, m.payload, sizeof operand);
        *m.word += operand;  // inside the window, or ASan says otherwise
      }
      if (m.control) GDX_FUZZ_CHECK(m.bytes >= 1 && m.bytes <= gdx::kMaxMessageBytes);
    });
  }
  return 0;
}
