// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/) with the real encoders: small valid
// messages of every kind, each preceded by the parameter bytes its target reads first (see each target's source).
// Run after a change of a wire format: fuzz_gen_corpus tests/fuzz/corpus
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bootstrap/protocol.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "p2p/handshake.hpp"
#include "p2p/key_assembly.hpp"
#include "p2p/protocol.hpp"
#include "runtime/forward_request.hpp"
#include "runtime/window_record.hpp"
#include "transport/common/window_table.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/verbs/verbs_wire.hpp"

namespace {

std::filesystem::path root;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

template <class T>
std::string raw(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string bytesOf(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

void bootstrapSeeds() {
  using namespace gdx::bootstrap;
  // worldSize 2, allGather #1, the joined rank's frame limit.
  const std::string params = bytesOf({2, 1, 0});
  Hello h;
  h.rank = 1;
  h.worldSize = 2;
  h.secret = "job-secret";
  h.hostname = "node-a";
  seed("fuzz_bootstrap_frame", "hello", params + encodeFrame(MsgType::kHello, encodeHello(h)));
  seed("fuzz_bootstrap_frame", "welcome", params + encodeFrame(MsgType::kWelcome, encodeWelcome({"node-a", "node-b"})));
  seed("fuzz_bootstrap_frame", "refuse", params + encodeFrame(MsgType::kRefuse, encodeRefuse("wrong job secret")));
  seed("fuzz_bootstrap_frame", "abort",
       params + encodeFrame(MsgType::kAbort, encodeAbort(gdx::ErrorCode::kTimeout, "rank 1 did not join")));
  seed("fuzz_bootstrap_frame", "gather-goodbye",
       params + encodeFrame(MsgType::kGather, encodeGather(1, "blob")) + encodeFrame(MsgType::kGoodbye, ""));
  seed("fuzz_bootstrap_frame", "gather-result",
       params + encodeFrame(MsgType::kGatherResult, encodeGatherResult(1, {"first", ""})));
}

void tcpSeeds() {
  using namespace gdx::tcp;
  // world 2, 1 lane, 1 socket, chunks up to 2^20, the secret "s3" (2 bytes), pieces of 17 bytes.
  const std::string params = bytesOf({1, 0, 0, 20, 2}) + "s3" + bytesOf({16});
  Hello hello;
  hello.rank = 1;
  hello.worldSize = 2;
  hello.lanes = 1;
  hello.socketsPerPeer = 1;
  hello.secretBytes = 2;
  hello.chunkBytes = 1 << 20;
  seed("fuzz_tcp_hello", "hello", params + raw(hello) + "s3");
  hello.rank = 5;
  seed("fuzz_tcp_hello", "hello-bad-rank", params + raw(hello) + "s3");

  // lane 0, chunks up to 4096, 8 writes ahead, window 0 of 257 bytes.
  const std::string mparams = bytesOf({0, 12, 7, 0, 0, 1});
  MessageHeader w;
  w.type = static_cast<uint8_t>(MessageType::kWrite);
  w.flags = kFlagImm;
  w.seq = 0;
  w.offset = 16;
  w.bytes = 64;
  w.chunkOffset = 32;
  w.chunkBytes = 32;
  w.imm = 7;
  MessageHeader w2 = w;
  w2.chunkOffset = 0;
  MessageHeader a;
  a.type = static_cast<uint8_t>(MessageType::kAtomic);
  a.seq = 1;
  a.offset = 248;
  a.bytes = a.chunkBytes = kAtomicBytes;
  a.imm = static_cast<uint32_t>(gdx::SignalOp::kAdd);
  MessageHeader c;
  c.type = static_cast<uint8_t>(MessageType::kControl);
  c.seq = 2;
  c.bytes = c.chunkBytes = 5;
  MessageHeader g;
  g.type = static_cast<uint8_t>(MessageType::kGoodbye);
  seed("fuzz_tcp_message", "write-atomic-control-goodbye",
       mparams + raw(w) + std::string(32, 'a') + raw(w2) + std::string(32, 'b') + raw(a) + raw(uint64_t{3}) + raw(c) +
           "hello" + raw(g));
}

void verbsSeeds() {
  using namespace gdx::verbs;
  ControlRecord atomic{3, static_cast<uint32_t>(gdx::SignalOp::kSet), 64, 9, 0, 0};
  seed("fuzz_verbs_record", "send-atomic", bytesOf({0}) + raw(atomic));
  ControlRecord staged{3, kControlStagedImm, 4096, 1000, 2, 0x40010001};
  seed("fuzz_verbs_record", "send-staged", bytesOf({0}) + raw(staged));
  MessageRecord m{};
  m.bytes = 6;
  m.kind = kControlMessage;
  std::memcpy(m.data, "relay!", 6);
  seed("fuzz_verbs_record", "send-message", bytesOf({0}) + raw(m).substr(0, kMessageHeaderBytes + 6));
  // world 2, the address of rank 1 read by rank 0, 2 lanes, Ethernet (RoCE).
  AddressHeader h{};
  h.magic = kAddressMagic;
  h.rank = 1;
  h.world = 2;
  h.lanes = 2;
  h.lid = 0;
  h.mtu = 3;
  h.ethernet = 1;
  std::vector<AddressEntry> entries = {{0x11, 1}, {0x12, 2}, {0x21, 3}, {0x22, 4}};
  seed("fuzz_verbs_record", "address", bytesOf({1, 1, 1, 0, 1, 1}) + encodeAddress(h, entries.data(), entries.size()));
  WindowKey k{0x7f0000001000, 4096, 0x1234, 0, 0, 0, 0, 0, 0};
  seed("fuzz_verbs_record", "window-key", bytesOf({2}) + raw(uint64_t{4096}) + raw(k));
}

void runtimeSeeds() {
  seed("fuzz_window_record", "tcp", gdx::encodeWindowRecord(3, 4096, gdx::common::windowKey("tcp", 3, 4096, false)));
  seed("fuzz_window_record", "loopback-cuda-direct",
       gdx::encodeWindowRecord(2, 65536, gdx::common::windowKey("loopback", 2, 65536, true), std::string(72, 'h')));
  seed("fuzz_window_record", "empty-key", gdx::encodeWindowRecord(0, 8, ""));

  uint32_t imm = 0;
  gdx::encodeSignalImm(gdx::SignalOp::kAdd, 5, 1, &imm);
  gdx::ForwardRequest f;
  f.window = 1;
  f.offset = 4;
  f.bytes = 8;
  f.value = 1;
  f.destination = 2;
  f.signalId = 3;
  f.hasSignal = 1;
  // Windows 0..3: 1 and 2 GPU windows of 17 and 9 bytes locally, 30 and 5 at the destination; 8 signals.
  seed("fuzz_forward_request", "put-with-signal",
       raw(imm) + bytesOf({0, 65, 29, 33, 4, 0, 7, static_cast<int>(sizeof f)}) + raw(f) + bytesOf({1}));
}

/// A message as fuzz_p2p_wire's sequence of control messages reads it: its length byte, then its bytes.
std::string p2pMessage(const gdx::p2p::ControlMsg& m) {
  const gdx::MessageOp op = gdx::p2p::encode(m, 1);
  return bytesOf({static_cast<int>(op.bytes)}) + std::string(reinterpret_cast<const char*>(op.data), op.bytes);
}

void p2pSeeds() {
  using namespace gdx::p2p;
  // 0: control messages. A 100-byte key in pieces, then a clear-to-send, a read request, a read done and a receive
  // that failed.
  std::string messages = bytesOf({0});
  for (const ControlMsg& part : splitKey(7, std::string(100, 'k'), 1 << 20)) messages += p2pMessage(part);
  ControlMsg cts;
  cts.type = MsgType::kClearToSend;
  cts.id = 3;
  cts.window = 7;
  cts.offset = 64;
  cts.bytes = 4096;
  cts.credits = 2;
  ControlMsg read;
  read.type = MsgType::kReadRequest;
  read.id = 9;
  read.window = 7;
  read.bytes = 256;
  read.dstWindow = 2;
  ControlMsg done;
  done.type = MsgType::kReadDone;
  done.id = 9;
  ControlMsg failed;
  failed.type = MsgType::kReceiveFailed;
  failed.id = 4;
  failed.code = gdx::ErrorCode::kTimeout;
  seed("fuzz_p2p_wire", "control",
       messages + p2pMessage(cts) + p2pMessage(read) + p2pMessage(done) + p2pMessage(failed));
  // 1: a key cut and put back together: window 7 of 4096 bytes, a 90-byte key.
  seed("fuzz_p2p_wire", "key-round-trip",
       bytesOf({1}) + raw(uint32_t{7}) + raw(uint64_t{4096}) + raw(uint16_t{90}) + std::string(90, 'q'));
  seed("fuzz_p2p_wire", "descriptor", bytesOf({2}) + encodeDescriptor(Descriptor{0x1234, 7, 4096}));
  IpcDescriptor ipc;
  ipc.host = 1;
  ipc.pid = 4242;
  ipc.device = 0;
  ipc.allocBase = 0x7f0000000000;
  ipc.offset = 512;
  ipc.bytes = 4096;
  seed("fuzz_p2p_wire", "ipc-descriptor", bytesOf({3}) + encodeIpc(ipc));
  seed("fuzz_p2p_wire", "metadata", bytesOf({4}) + encodeMetadata(EndpointAddress{"10.0.0.2", 5000, 1}));
  Hello hello;
  hello.transport = "tcp";
  hello.gpu = 0;
  hello.secret = "0123456789abcdef";
  hello.address = "10.0.0.1:41000";
  hello.sockets = 4;
  hello.chunkBytes = 1 << 20;
  seed("fuzz_p2p_wire", "hello", bytesOf({5}) + encodeHello(hello));
  Answer yes;
  yes.ok = true;
  yes.gpu = 1;
  yes.address = "10.0.0.2:41001";
  yes.token = 77;
  seed("fuzz_p2p_wire", "answer", bytesOf({6}) + encodeAnswer(yes));
  Answer no;
  no.reason = "the peer uses transport 'verbs', this endpoint 'tcp'";
  seed("fuzz_p2p_wire", "answer-refused", bytesOf({6}) + encodeAnswer(no));
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: %s CORPUS_DIR   (writes seed-* files under CORPUS_DIR/<target>/)\n";
  if (argc == 2 && std::strcmp(argv[1], "--help") == 0) {
    std::printf(usage, argv[0]);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-') {
    if (argc >= 2 && argv[1][0] == '-') std::fprintf(stderr, "unknown flag %s\n", argv[1]);
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  root = argv[1];
  bootstrapSeeds();
  tcpSeeds();
  verbsSeeds();
  runtimeSeeds();
  p2pSeeds();
  return 0;
}
