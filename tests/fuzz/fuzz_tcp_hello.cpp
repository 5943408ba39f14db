// Fuzzes the first bytes of a TCP transport connection (transport/tcp/wire.hpp) as the acceptor reads them: the input
// arrives in pieces of fuzzer-chosen sizes, never past helloBytesWanted() (what follows a Hello belongs to the data
// stream), and parseHello() and checkHello() judge it. A Hello they accept names a rank, lane and socket that exist
// and carries exactly the job's secret.
#include "fuzz_check.hpp"
#include "transport/tcp/wire.hpp"

using namespace gdx::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gdx::fuzz::Input in(data, size);
  HelloExpectations expected;
  expected.worldSize = 1 + in.take<uint8_t>() % 8;
  expected.lanes = 1 + in.take<uint8_t>() % 4;
  expected.socketsPerPeer = 1 + in.take<uint8_t>() % 4;
  expected.chunkBytes = uint64_t{1} << (in.take<uint8_t>() % 31);
  expected.secret = in.bytes(in.take<uint8_t>() % 16);
  const uint8_t piece = 1 + in.take<uint8_t>() % 64;
  const std::string stream = in.rest();

  std::string buffer;
  size_t pos = 0;
  for (;;) {
    const size_t want = helloBytesWanted(buffer);
    GDX_FUZZ_CHECK(want >= buffer.size() && want <= sizeof(Hello) + kMaxSecretBytes);
    const size_t room = std::min<size_t>({want - buffer.size(), piece, stream.size() - pos});
    if (room == 0) break;  // the peer sent no more
    buffer.append(stream, pos, room);
    pos += room;
    Hello hello;
    std::string secret;
    HelloParse p = parseHello(buffer, &hello, &secret);
    if (p == HelloParse::kIncomplete) continue;
    if (p != HelloParse::kComplete) {
      GDX_FUZZ_CHECK(p != HelloParse::kOversized || hello.secretBytes > kMaxSecretBytes);
      break;
    }
    GDX_FUZZ_CHECK(hello.magic == kHelloMagic && hello.version == kWireVersion);
    GDX_FUZZ_CHECK(secret.size() == hello.secretBytes && buffer.size() == sizeof(Hello) + secret.size());
    HelloReply reply = checkHello(hello, secret, expected);
    GDX_FUZZ_CHECK(helloReplyName(reply) != nullptr);
    if (reply == HelloReply::kAccepted) {
      GDX_FUZZ_CHECK(secret == expected.secret && hello.worldSize == expected.worldSize);
      GDX_FUZZ_CHECK(hello.rank >= 0 && hello.rank < expected.worldSize);
      GDX_FUZZ_CHECK(hello.lane < expected.lanes && hello.socketIndex < expected.socketsPerPeer);
      GDX_FUZZ_CHECK(hello.chunkBytes <= expected.chunkBytes);
    }
    break;
  }
  return 0;
}
