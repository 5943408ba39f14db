// The decoders of network bytes (the ones tests/fuzz/ fuzzes) on hand-made inputs: each message survives its encoder
// and decoder, and each way of being malformed is refused with the reason it names.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "bootstrap/protocol.hpp"
#include "gdx/error.hpp"
#include "p2p/handshake.hpp"
#include "p2p/key_assembly.hpp"
#include "p2p/protocol.hpp"
#include "runtime/forward_request.hpp"
#include "runtime/window_record.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/verbs/verbs_wire.hpp"

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
  // A signal alone needs no window: window 0 is not a GPU window here, and the request names it anyway.
  gdx::ForwardRequest signalOnly;
  signalOnly.hasSignal = 1;
  signalOnly.signalId = 0;
  signalOnly.value = 5;
  t = gdx::ForwardTarget{};
  EXPECT_EQ(gdx::resolveForward(signalOnly, peer.get(), &t), "");
  EXPECT_EQ(t.signal, signals);
  EXPECT_EQ(t.src, nullptr);
  EXPECT_EQ(t.dst, nullptr);
  signalOnly.signalId = 1;
  EXPECT_NE(gdx::resolveForward(signalOnly, peer.get(), &t).find("signal id out of range"), std::string::npos);
  gdx::ForwardRequest nothing;
  EXPECT_NE(gdx::resolveForward(nothing, peer.get(), &t).find("neither data nor a signal"), std::string::npos);
  m.data[offsetof(gdx::ForwardRequest, hasSignal)] = 2;
  EXPECT_NE(gdx::decodeForward(m, &got), "");
}

TEST(P2pDecoders, HandshakeMetadataAndIpcDescriptors) {
  using namespace gdx::p2p;
  Hello h;
  h.transport = "tcp";
  h.gpu = 1;
  h.secret = "s";
  h.address = "10.0.0.1:4000";
  h.sockets = 4;
  h.chunkBytes = 1 << 20;
  Hello back;
  ASSERT_EQ(decodeHello(encodeHello(h), &back), "");
  EXPECT_EQ(back.address, h.address);
  EXPECT_EQ(back.sockets, 4);
  EXPECT_NE(decodeHello(encodeHello(h) + "x", &back).find("1 bytes too many"), std::string::npos);
  EXPECT_NE(decodeHello(encodeHello(h).substr(0, 20), &back).find("truncated"), std::string::npos);
  h.sockets = 65;
  EXPECT_NE(decodeHello(encodeHello(h), &back).find("65 sockets"), std::string::npos);
  h.transport = "verbs";  // a verbs link has no TCP shape to check
  EXPECT_EQ(decodeHello(encodeHello(h), &back), "");
  h.gpu = -2;
  EXPECT_NE(decodeHello(encodeHello(h), &back).find("GPU -2"), std::string::npos);
  EXPECT_NE(decodeHello("GET / HTTP/1.1\r\n", &back).find("not a gdx endpoint"), std::string::npos);

  Answer refusal;
  refusal.reason = "another transport";
  Answer a;
  ASSERT_EQ(decodeAnswer(encodeAnswer(refusal), &a), "");
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.reason, "another transport");
  std::string verdict = encodeAnswer(refusal);
  verdict[6] = 2;  // after the magic and version
  EXPECT_NE(decodeAnswer(verdict, &a).find("verdict is 2"), std::string::npos);

  EndpointAddress m;
  ASSERT_EQ(decodeMetadata(encodeMetadata({"10.0.0.2", 5000, 0}), &m), "");
  EXPECT_EQ(m.ip, "10.0.0.2");
  EXPECT_EQ(m.port, 5000);
  EXPECT_NE(decodeMetadata(encodeMetadata({"10.0.0.2", 70000, 0}), &m).find("port 70000"), std::string::npos);
  EXPECT_NE(decodeMetadata(encodeMetadata({"", 5000, 0}), &m).find("no address"), std::string::npos);
  std::string damaged = encodeMetadata({"10.0.0.2", 5000, 0});
  damaged[10] ^= 1;  // in the address, after magic, version and its length
  EXPECT_NE(decodeMetadata(damaged, &m).find("checksum"), std::string::npos);

  IpcDescriptor d;
  d.device = 0;
  d.offset = 64;
  d.bytes = 4096;
  IpcDescriptor out;
  ASSERT_EQ(decodeIpc(encodeIpc(d), &out), "");
  EXPECT_EQ(out.bytes, 4096u);
  d.offset = ~uint64_t{0} - 100;  // a range whose end wraps around
  EXPECT_NE(decodeIpc(encodeIpc(d), &out).find("naming 4096 bytes"), std::string::npos);
  EXPECT_NE(decodeIpc(encodeIpc(out).substr(1), &out).find("not a gdx IPC descriptor"), std::string::npos);
}

TEST(P2pDecoders, AReceiveFailureCarriesItsErrorCodeOrIsRefused) {
  using namespace gdx::p2p;
  ControlMsg failed;
  failed.type = MsgType::kReceiveFailed;
  failed.id = (uint64_t{1} << 40) + 7;
  failed.code = gdx::ErrorCode::kTimeout;
  gdx::MessageOp op = encode(failed, 1);
  gdx::RemoteMessage msg;
  msg.bytes = op.bytes;
  std::memcpy(msg.data, op.data, op.bytes);
  ControlMsg back;
  ASSERT_EQ(decode(msg, &back), "");
  EXPECT_EQ(back.type, MsgType::kReceiveFailed);
  EXPECT_EQ(back.id, failed.id);
  EXPECT_EQ(back.code, gdx::ErrorCode::kTimeout);
  for (uint8_t code : {uint8_t{0}, static_cast<uint8_t>(static_cast<uint8_t>(gdx::ErrorCode::kShutdown) + 1)}) {
    msg.data[msg.bytes - 1] = code;  // the code is the last byte
    EXPECT_NE(decode(msg, &back).find("error code " + std::to_string(code)), std::string::npos);
  }
  msg.bytes -= 1;
  EXPECT_NE(decode(msg, &back).find("truncated receive failed"), std::string::npos);
}

TEST(P2pDecoders, WindowKeysComeBackWholeOrAreRefused) {
  using namespace gdx::p2p;
  const std::string key(3 * kKeyPieceBytes + 5, 'k');
  std::vector<ControlMsg> parts = splitKey(9, key, 4096);
  ASSERT_EQ(parts.size(), 4u);
  KeyAssembly whole;
  KeyAssembly::Key k;
  bool complete = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_EQ(whole.add(parts[i], &complete, &k), "");
    EXPECT_EQ(complete, i + 1 == parts.size());
  }
  EXPECT_EQ(k.key, key);
  EXPECT_EQ(k.bytes, 4096u);
  EXPECT_EQ(whole.unfinished(), 0u);

  KeyAssembly gap;  // the second piece lost: the third does not continue the key, which is dropped
  ASSERT_EQ(gap.add(parts[0], &complete, &k), "");
  EXPECT_NE(gap.add(parts[2], &complete, &k).find("does not continue"), std::string::npos);
  EXPECT_FALSE(complete);
  EXPECT_EQ(gap.unfinished(), 0u);
  EXPECT_NE(gap.add(parts[3], &complete, &k).find("no key of that window was begun"), std::string::npos);

  KeyAssembly resized;  // a piece that changes the window's size
  ASSERT_EQ(resized.add(parts[0], &complete, &k), "");
  ControlMsg other = parts[1];
  other.bytes = 8192;
  EXPECT_NE(resized.add(other, &complete, &k).find("window of 4096 bytes"), std::string::npos);

  KeyAssembly crowded;  // keys begun and never finished are bounded
  for (uint32_t w = 0; w < KeyAssembly::kMaxUnfinished; ++w) {
    ControlMsg first = parts[0];
    first.window = w;
    ASSERT_EQ(crowded.add(first, &complete, &k), "");
  }
  ControlMsg one_more = parts[0];
  one_more.window = 1000;
  EXPECT_NE(crowded.add(one_more, &complete, &k).find("unfinished already"), std::string::npos);

  std::vector<ControlMsg> empty = splitKey(3, "", 16);  // an empty key is one empty piece
  ASSERT_EQ(empty.size(), 1u);
  ASSERT_EQ(KeyAssembly().add(empty[0], &complete, &k), "");
  EXPECT_TRUE(complete);
  EXPECT_EQ(k.key, "");
}

}  // namespace
