// Fuzzes what a relay acts on (runtime/forward_request.hpp) and the signal updates carried in immediates
// (gdx/device/impl/signal_imm.hpp): a control message of fuzzer-chosen bytes is decoded and resolved against a
// direct-path table whose windows are exactly sized heap blocks, and the relay's copy is performed, so ASan reports any
// range the checks let past a window or a signal array. An immediate decodes to an update that encodes back to it, or
// is invalid.
#include <memory>
#include <vector>

#include "fuzz_check.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "runtime/forward_request.hpp"

using namespace gdx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint32_t imm = in.take<uint32_t>();
  SignalUpdate u = decodeSignalImm(imm);
  if (u.valid) {
    uint32_t again = 0;
    GDX_FUZZ_CHECK(encodeSignalImm(u.op, u.id, u.value, &again) && again == imm);
  } else {
    GDX_FUZZ_CHECK((imm >> kImmOpShift) == 0 || (imm >> kImmOpShift) == 3);
  }

  // This GPU's view of the destination: windows 0..3 may be GPU windows on both ranks, of fuzzer-chosen sizes.
  auto peer = std::make_unique<DirectPeer>();
  std::memset(peer.get(), 0, sizeof *peer);
  std::vector<std::vector<char>> local(4), remote(4);
  for (uint32_t w = 0; w < 4; ++w) {
    const uint8_t shape = in.take<uint8_t>();
    if (shape % 4 == 0) continue;  // not a GPU window on both ranks
    local[w].resize(1 + shape / 4 % 32);
    remote[w].resize(1 + in.take<uint8_t>() % 32);
    peer->localBase[w] = local[w].data();
    peer->localBytes[w] = local[w].size();
    peer->peerBase[w] = remote[w].data();
    peer->peerBytes[w] = remote[w].size();
  }
  peer->peerNumSignals = 1 + in.take<uint8_t>() % 8;
  std::vector<uint64_t> signals(peer->peerNumSignals);
  peer->peerSignals = signals.data();

  RemoteMessage m;
  m.peer = 0;
  m.bytes = in.take<uint8_t>() % (kMaxMessageBytes + 1);
  const std::string body = in.bytes(m.bytes);
  std::memcpy(m.data, body.data(), body.size());
  ForwardRequest f;
  if (!decodeForward(m, &f).empty()) return 0;
  GDX_FUZZ_CHECK(m.bytes == sizeof f && f.magic == ForwardRequest::kMagic);
  GDX_FUZZ_CHECK(f.hasSignal <= 1 && f.signalOp <= static_cast<uint8_t>(SignalOp::kSet));
  ForwardTarget t;
  const bool reachable = in.take<uint8_t>() % 4 != 0;
  if (!resolveForward(f, reachable ? peer.get() : nullptr, &t).empty()) return 0;
  GDX_FUZZ_CHECK(reachable);
  // What the copy queue then does: copy the range (none for a signal alone), raise the signal.
  GDX_FUZZ_CHECK(f.bytes > 0 || f.hasSignal);
  if (f.bytes > 0) std::memmove(t.dst, t.src, f.bytes);
  if (f.hasSignal) *t.signal += f.value;
  return 0;
}
