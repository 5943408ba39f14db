// Fuzzes the bootstrap's frames (bootstrap/protocol.hpp) as the rendezvous server and the clients read them: the
// input is a byte stream cut into frames by their headers, as the server's parseFrames() and the clients' recvFrame()
// do, and every payload goes through the decoder of every message type (a peer may send any type with any payload).
// A decoder either throws gdx::Error(kProtocol) or returns a value that re-encodes to the very payload it came from.
#include <vector>

#include "bootstrap/protocol.hpp"
#include "fuzz_check.hpp"
#include "gdx/error.hpp"

using namespace gdx::bootstrap;

namespace {

template <class F>
void expectCleanRejection(F&& decode) {
  try {
    decode();
  } catch (const gdx::Error& e) {
    GDX_FUZZ_CHECK(e.code() == gdx::ErrorCode::kProtocol);
  }
}

void decodePayload(const std::string& payload, uint32_t worldSize, uint64_t seq) {
  expectCleanRejection([&] {
    Hello h = decodeHello(payload);
    // The hello decoder allows trailing bytes; what it read must encode back to the payload's start.
    std::string again = encodeHello(h);
    GDX_FUZZ_CHECK(payload.compare(0, again.size(), again) == 0);
  });
  expectCleanRejection([&] {
    std::vector<std::string> names = decodeWelcome(payload, worldSize);
    GDX_FUZZ_CHECK(names.size() == worldSize && encodeWelcome(names) == payload);
  });
  expectCleanRejection([&] {
    std::string reason = decodeRefuse(payload);
    GDX_FUZZ_CHECK(reason.size() + 4 <= payload.size());
  });
  expectCleanRejection([&] {
    Abort a = decodeAbort(payload);
    GDX_FUZZ_CHECK(a.code >= gdx::ErrorCode::kInvalidArgument && a.code <= gdx::ErrorCode::kShutdown);
    GDX_FUZZ_CHECK(a.message.size() + 8 <= payload.size());
  });
  expectCleanRejection([&] {
    auto [n, blob] = decodeGather(payload);
    GDX_FUZZ_CHECK(encodeGather(n, blob) == payload);
  });
  expectCleanRejection([&] {
    std::vector<std::string> all = decodeGatherResult(payload, seq, worldSize);
    GDX_FUZZ_CHECK(all.size() == worldSize && encodeGatherResult(seq, all) == payload);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gdx::fuzz::Input in(data, size);
  // What the receiving side expects: a small world (every rank's name costs at least 4 bytes of payload, so a large
  // one only makes the decoders refuse sooner) and the sequence number of its current allGather.
  const uint32_t worldSize = in.take<uint8_t>() % 9;
  const uint64_t seq = in.take<uint8_t>();
  const uint64_t limit = in.take<uint8_t>() % 2 ? kMaxHelloBytes : kMaxClientFrameBytes;
  std::string stream = in.rest();
  size_t pos = 0;
  while (stream.size() - pos >= kHeaderBytes) {
    FrameHeader h = decodeHeader(reinterpret_cast<const unsigned char*>(stream.data() + pos));
    std::string bad = checkFrameHeader(h, limit);
    if (!bad.empty()) break;  // the connection is refused or the job aborted: nothing after it is read
    GDX_FUZZ_CHECK(h.magic == kMagic && h.version == kProtocolVersion && h.length <= limit);
    unsigned char again[kHeaderBytes];
    encodeHeader(h, again);
    GDX_FUZZ_CHECK(std::memcmp(again, stream.data() + pos, kHeaderBytes) == 0);
    if (h.length > stream.size() - pos - kHeaderBytes) break;  // the rest of the frame has not arrived
    decodePayload(stream.substr(pos + kHeaderBytes, h.length), worldSize, seq);
    (void)msgTypeName(h.type);
    pos += kHeaderBytes + h.length;
  }
  return 0;
}
