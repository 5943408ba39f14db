// The decoders of network bytes (the ones tests/fuzz/ fuzzes) on hand-made inputs: each message survives its encoder
// and decoder, and each way of being malformed is refused with the reason it names.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "gdx/error.hpp"
#include "rdma/bootstrap/protocol.hpp"
#include "rdma/tcp/wire.hpp"
#include "rdma/verbs/verbs_wire.hpp"
#include "runtime/forward_request.hpp"
#include "runtime/window_record.hpp"

namespace {

template <class F>
gdx::ErrorCode codeOf(F&& f) {
  try {
    f();
  } catch (const gdx::Error& e) {
    return e.code();
  }
  return gdx::ErrorCode::kOk;
}

TEST(BootstrapDecoders, RoundTripAndRefusals) {
  using namespace gdx::bootstrap;
  EXPECT_EQ(decodeWelcome(encodeWelcome({"a", "bc"}), 2), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(codeOf([] { decodeWelcome(encodeWelcome({"a", "bc"}), 3); }), gdx::ErrorCode::kProtocol);
  EXPECT_EQ(codeOf([] { decodeWelcome(encodeWelcome({"a"}) + "x", 1); }), gdx::ErrorCode::kProtocol);
  EXPECT_EQ(decodeGatherResult(encodeGatherResult(4, {"x", ""}), 4, 2), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(codeOf([] { decodeGatherResult(encodeGatherResult(4, {"x"}), 5, 1); }), gdx::ErrorCode::kProtocol);
  std::string truncated = encodeGatherResult(4, {"xyz"});
  truncated.pop_back();
  EXPECT_EQ(codeOf([&] { decodeGatherResult(truncated, 4, 1); }), gdx::ErrorCode::kProtocol);
  auto [seq, blob] = decodeGather(encodeGather(9, "blob"));
  EXPECT_EQ(seq, 9u);
  EXPECT_EQ(blob, "blob");
  EXPECT_EQ(decodeRefuse(encodeRefuse("why")), "why");
  Abort a = decodeAbort(encodeAbort(gdx::ErrorCode::kTimeout, "late"));
  EXPECT_EQ(a.code, gdx::ErrorCode::kTimeout);
  EXPECT_EQ(a.message, "late");
  // A code no ErrorCode has is a peer failure, not a value outside the enum.
  EXPECT_EQ(decodeAbort(std::string("\x63\0\0\0\0\0\0\0", 8)).code, gdx::ErrorCode::kPeerFailed);

  FrameHeader h;
  h.length = 10;
  EXPECT_EQ(checkFrameHeader(h, 10), "");
  EXPECT_NE(checkFrameHeader(h, 9).find("exceeds the limit of 9"), std::string::npos);
  h.version = 7;
  EXPECT_NE(checkFrameHeader(h, 10).find("version 7"), std::string::npos);
  h.magic = 1;
  EXPECT_NE(checkFrameHeader(h, 10).find("bad magic"), std::string::npos);
}

TEST(TcpDecoders, HelloParseAndCheck) {
  using namespace gdx::tcp;
  Hello h;
  h.rank = 1;
  h.worldSize = 2;
  h.lanes = 1;
  h.socketsPerPeer = 2;
  h.socketIndex = 1;
  h.secretBytes = 3;
  h.chunkBytes = 64;
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
  Hello out;
  std::string secret;
  EXPECT_EQ(helloBytesWanted(""), sizeof(Hello));
  EXPECT_EQ(helloBytesWanted(bytes), sizeof(Hello) + 3);
  EXPECT_EQ(parseHello(bytes + "ab", &out, &secret), HelloParse::kIncomplete);
  ASSERT_EQ(parseHello(bytes + "abc", &out, &secret), HelloParse::kComplete);
  EXPECT_EQ(secret, "abc");
  HelloExpectations e{"abc", 2, 1, 2, 64};
  EXPECT_EQ(checkHello(out, secret, e), HelloReply::kAccepted);
  EXPECT_EQ(checkHello(out, "abd", e), HelloReply::kBadSecret);
  out.rank = 2;
  EXPECT_EQ(checkHello(out, secret, e), HelloReply::kBadRank);
  out.rank = 1;
  out.socketIndex = 2;
  EXPECT_EQ(checkHello(out, secret, e), HelloReply::kBadSocket);
  out.socketIndex = 0;
  out.chunkBytes = 65;
  EXPECT_EQ(checkHello(out, secret, e), HelloReply::kChunkTooLarge);

  h.secretBytes = kMaxSecretBytes + 1;
  bytes.assign(reinterpret_cast<const char*>(&h), sizeof h);
  EXPECT_EQ(helloBytesWanted(bytes), sizeof(Hello) + kMaxSecretBytes);
  EXPECT_EQ(parseHello(bytes, &out, &secret), HelloParse::kOversized);
  h.magic = 0;
  bytes.assign(reinterpret_cast<const char*>(&h), sizeof h);
  EXPECT_EQ(parseHello(bytes, &out, &secret), HelloParse::kNotGdx);
}

TEST(VerbsDecoders, SendRecords) {
  using namespace gdx::verbs;
  SendRecord r;
  ControlRecord atomic{1, static_cast<uint32_t>(gdx::SignalOp::kAdd), 8, 5, 0, 0};
  EXPECT_EQ(decodeSend(&atomic, sizeof atomic, &r), "");
  EXPECT_EQ(r.kind, SendRecord::Kind::kAtomic);
  atomic.kind = 9;
  EXPECT_NE(decodeSend(&atomic, sizeof atomic, &r).find("unknown atomic kind 9"), std::string::npos);
  ControlRecord staged{1, kControlStaged, 0, kStageSlotBytes, kStageSlots - 1, 0};
  EXPECT_EQ(decodeSend(&staged, sizeof staged, &r), "");
  EXPECT_EQ(r.kind, SendRecord::Kind::kStaged);
  staged.slot = kStageSlots;
  EXPECT_NE(decodeSend(&staged, sizeof staged, &r).find("not a staging slot"), std::string::npos);
  MessageRecord m{};
  m.bytes = 3;
  m.kind = kControlMessage;
  EXPECT_EQ(decodeSend(&m, kMessageHeaderBytes + 3, &r), "");
  EXPECT_EQ(r.kind, SendRecord::Kind::kMessage);
  EXPECT_NE(decodeSend(&m, kMessageHeaderBytes + 4, &r), "");
  EXPECT_NE(decodeSend(&m, 2, &r), "");
}

TEST(VerbsDecoders, AddressAndKey) {
  using namespace gdx::verbs;
  AddressHeader h{};
  h.magic = kAddressMagic;
  h.rank = 1;
  h.world = 2;
  h.lanes = 1;
  AddressEntry entries[2] = {{10, 1}, {20, 2}};
  const std::string blob = encodeAddress(h, entries, 2);
  AddressHeader out;
  ASSERT_EQ(decodeAddress(blob, 1, 2, 1, false, &out), "");
  EXPECT_EQ(addressEntry(blob, 0, 2, 1).qpn, 20u);
  EXPECT_NE(decodeAddress(blob, 1, 2, 2, false, &out), "");  // fewer lanes than asked for
  EXPECT_NE(decodeAddress(blob.substr(0, blob.size() - 1), 1, 2, 1, false, &out), "");
  EXPECT_NE(decodeAddress(blob, 0, 2, 1, false, &out), "");
  EXPECT_NE(decodeAddress(blob, 1, 2, 1, true, &out), "");
  WindowKey k{};
  k.bytes = 64;
  WindowKey got;
  EXPECT_EQ(decodeWindowKey(std::string(reinterpret_cast<const char*>(&k), sizeof k), 64, &got), "");
  EXPECT_NE(decodeWindowKey(std::string(reinterpret_cast<const char*>(&k), sizeof k), 65, &got), "");
  EXPECT_NE(decodeWindowKey("short", 64, &got), "");
}

TEST(RuntimeDecoders, WindowRecordAndForwardRequest) {
  gdx::WindowRecord r = gdx::decodeWindowRecord(gdx::encodeWindowRecord(3, 100, "key", "ipc"), 1);
  EXPECT_EQ(r.id, 3u);
  EXPECT_EQ(r.bytes, 100u);
  EXPECT_EQ(r.key, "key");
  EXPECT_EQ(r.direct, "ipc");
  std::string cut = gdx::encodeWindowRecord(3, 100, "key");
  cut.pop_back();
  EXPECT_EQ(codeOf([&] { gdx::decodeWindowRecord(cut, 1); }), gdx::ErrorCode::kProtocol);

  gdx::ForwardRequest f;
  f.window = 1;
  f.offset = 8;
  f.bytes = 8;
  gdx::RemoteMessage m;
  m.bytes = sizeof f;
  std::memcpy(m.data, &f, sizeof f);
  gdx::ForwardRequest got;
  ASSERT_EQ(gdx::decodeForward(m, &got), "");
  auto peer = std::make_unique<gdx::DirectPeer>();
  std::memset(peer.get(), 0, sizeof *peer);
  char local[16], remote[16];
  uint64_t signals[1];
  peer->localBase[1] = local;
  peer->localBytes[1] = sizeof local;
  peer->peerBase[1] = remote;
  peer->peerBytes[1] = sizeof remote;
  peer->peerSignals = signals;
  peer->peerNumSignals = 1;
  gdx::ForwardTarget t;
  EXPECT_EQ(gdx::resolveForward(got, peer.get(), &t), "");
  EXPECT_EQ(t.dst, remote + 8);
  got.offset = 9;
  EXPECT_NE(gdx::resolveForward(got, peer.get(), &t).find("past the end"), std::string::npos);
  EXPECT_NE(gdx::resolveForward(got, nullptr, &t), "");
  m.data[offsetof(gdx::ForwardRequest, hasSignal)] = 2;
  EXPECT_NE(gdx::decodeForward(m, &got), "");
}

}  // namespace
