// The TCP transport facing a peer that breaks the wire protocol. The test plays rank 1 of a world of two over
// raw sockets: it answers rank 0's connection, connects to rank 0 with a correct Hello, sends one valid write
// and then a malformed header followed by bytes that would land outside the window if they were placed (or, for a
// control message, be delivered).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "gdx/error.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using tcp::MessageHeader;

constexpr uint32_t kWindow = 7;
constexpr size_t kWindowBytes = 64 << 10;
constexpr size_t kGuard = 64 << 10;
constexpr size_t kChunk = 16 << 10;
const std::string kSecret = "protocol-secret";

/// Rank 1, played by hand.
class FakePeer {
 public:
  FakePeer() {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listen_, 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~FakePeer() {
    for (int fd : {listen_, in_, out_})
      if (fd >= 0) ::close(fd);
  }
  const std::string& address() const { return address_; }

  /// Accepts rank 0's connection (answering its Hello) and opens ours to rank 0.
  void handshake(const std::string& rank0) {
    in_ = ::accept(listen_, nullptr, nullptr);
    ASSERT_GE(in_, 0);
    tcp::Hello theirs;
    ASSERT_EQ(test::rawRecv(in_, &theirs, sizeof theirs, 5000), sizeof theirs);
    EXPECT_EQ(theirs.rank, 0);
    std::string secret(theirs.secretBytes, '\0');
    ASSERT_EQ(test::rawRecv(in_, secret.data(), secret.size(), 5000), secret.size());
    EXPECT_EQ(secret, kSecret);
    tcp::HelloAck ack;
    ASSERT_TRUE(test::rawSend(in_, &ack, sizeof ack));

    out_ = test::rawConnect(rank0);
    ASSERT_GE(out_, 0);
    tcp::Hello mine;
    mine.rank = 1;
    mine.worldSize = 2;
    mine.lane = 0;
    mine.lanes = 1;
    mine.socketIndex = 0;
    mine.socketsPerPeer = 1;
    mine.secretBytes = static_cast<uint32_t>(kSecret.size());
    mine.chunkBytes = kChunk;
    ASSERT_TRUE(test::rawSend(out_, &mine, sizeof mine));
    ASSERT_TRUE(test::rawSend(out_, kSecret.data(), kSecret.size()));
    tcp::HelloAck reply;
    ASSERT_EQ(test::rawRecv(out_, &reply, sizeof reply, 5000), sizeof reply);
    EXPECT_EQ(reply.reply, 0u);
  }

  /// Sends a header and `payload` bytes of 0x77 on our connection to rank 0.
  bool send(const MessageHeader& h, size_t payload) {
    std::vector<char> bytes(sizeof h + payload, 0x77);
    std::memcpy(bytes.data(), &h, sizeof h);
    return test::rawSend(out_, bytes.data(), bytes.size());
  }
  int out() const { return out_; }
  int in() const { return in_; }

 private:
  int listen_ = -1, in_ = -1, out_ = -1;
  std::string address_;
};

MessageHeader write(uint64_t offset, uint64_t bytes, uint64_t seq, bool imm) {
  MessageHeader h;
  h.type = static_cast<uint8_t>(tcp::MessageType::kWrite);
  h.flags = imm ? tcp::kFlagImm : 0;
  h.lane = 0;
  h.window = kWindow;
  h.seq = seq;
  h.offset = offset;
  h.bytes = bytes;
  h.chunkOffset = 0;
  h.chunkBytes = static_cast<uint32_t>(bytes);
  h.imm = 42;
  return h;
}

/// A well-formed control message of `bytes` bytes; its payload is the 0x77 filler FakePeer::send() adds.
MessageHeader control(uint32_t bytes, uint64_t seq) {
  MessageHeader h;
  h.type = static_cast<uint8_t>(tcp::MessageType::kControl);
  h.lane = 0;
  h.seq = seq;
  h.bytes = bytes;
  h.chunkBytes = bytes;
  return h;
}

/// A well-formed atomic on the word at `offset`; its 8-byte operand is the 0x77 filler FakePeer::send() adds.
MessageHeader atomic(uint64_t offset, uint64_t seq, SignalOp kind) {
  MessageHeader h;
  h.type = static_cast<uint8_t>(tcp::MessageType::kAtomic);
  h.lane = 0;
  h.window = kWindow;
  h.seq = seq;
  h.offset = offset;
  h.bytes = tcp::kAtomicBytes;
  h.chunkBytes = tcp::kAtomicBytes;
  h.imm = static_cast<uint32_t>(kind);
  return h;
}

struct BadHeader {
  const char* name;
  std::function<MessageHeader()> make;
  size_t payload;      ///< bytes sent after the header
  const char* reason;  ///< must appear in the failure message
};

class TcpProtocol : public ::testing::TestWithParam<BadHeader> {};

TEST_P(TcpProtocol, MalformedHeaderFailsThePeerAndWritesNothing) {
  const BadHeader& bad = GetParam();
  // Guard | window | guard, all poisoned; only the valid write may change anything.
  std::vector<unsigned char> memory(kGuard + kWindowBytes + kGuard, 0xAB);
  unsigned char* window = memory.data() + kGuard;

  auto t = makeTcpTransport(test::tcpOptions(0, 2, 1, kChunk, 5000, kSecret));
  std::mutex mu;
  std::vector<std::pair<int, std::string>> failures;
  std::vector<RemoteWrite> announced;
  std::vector<RemoteMessage> messages;
  t->setMessageHandler([&](const RemoteMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    messages.push_back(m);
  });
  t->setPeerFailureHandler([&](int peer, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    failures.emplace_back(peer, why);
  });
  t->setImmHandler([&](const RemoteWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    announced.push_back(w);
  });
  t->registerWindow(kWindow, window, kWindowBytes, MemoryKind::kHost);
  t->addRemoteWindow(1, kWindow, kWindowBytes, "");

  FakePeer fake;
  std::exception_ptr error;
  std::thread connector([&] {
    try {
      t->connect({t->localAddress(), fake.address()}, 1);
    } catch (...) {
      error = std::current_exception();
    }
  });
  fake.handshake(t->localAddress());
  connector.join();
  if (error) std::rethrow_exception(error);

  // One good write first, so the bad one is not simply the first thing on the connection.
  ASSERT_TRUE(fake.send(write(100, 50, 0, true), 50));
  ASSERT_TRUE(test::waitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return announced.size() == 1;
      },
      5000));
  EXPECT_EQ(announced[0].peer, 1);
  EXPECT_EQ(announced[0].offset, 100u);
  EXPECT_EQ(announced[0].imm, 42u);
  for (size_t i = 100; i < 150; ++i) ASSERT_EQ(window[i], 0x77);

  fake.send(bad.make(), bad.payload);
  ASSERT_TRUE(test::waitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return !failures.empty();
      },
      5000))
      << "no failure reported for " << bad.name;
  EXPECT_TRUE(test::rawClosed(fake.out(), 5000)) << "the offending connection stayed open";
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_EQ(failures[0].first, 1);
    EXPECT_NE(failures[0].second.find("peer 1"), std::string::npos) << failures[0].second;
    EXPECT_NE(failures[0].second.find(bad.reason), std::string::npos) << failures[0].second;
    EXPECT_EQ(announced.size(), 1u);
    EXPECT_TRUE(messages.empty()) << "a message was delivered";
  }
  EXPECT_EQ(t->peerStatus(1), Status::kPeerFailed);
  EXPECT_EQ(t->peerStatus(0), Status::kOk);
  for (size_t i = 0; i < memory.size(); ++i) {
    bool valid = i >= kGuard + 100 && i < kGuard + 150;
    if (!valid) {
      ASSERT_EQ(memory[i], 0xAB) << "byte " << static_cast<long long>(i) - static_cast<long long>(kGuard)
                                 << " relative to the window changed";
    }
  }

  // Writes and atomics to the failed peer complete with kPeerFailed instead of throwing.
  std::vector<unsigned char> src(64);
  t->registerWindow(1, src.data(), src.size(), MemoryKind::kHost);
  t->lane(0).post(WriteOp{1, 1, 0, kWindow, 0, 64, false, 0, 9});
  AtomicOp add;
  add.peer = 1;
  add.remoteWindow = kWindow;
  add.value = 1;
  add.cookie = 10;
  t->lane(0).postAtomic(add);
  auto done = test::pollCompletions(t->lane(0), 2, 5000);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].status, Status::kPeerFailed);
  EXPECT_EQ(done[0].cookie, 9u);
  EXPECT_EQ(done[1].status, Status::kPeerFailed);
  EXPECT_EQ(done[1].cookie, 10u);
  t->shutdown();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(failures.size(), 1u) << "the failure handler ran more than once";
}

const uint64_t kMax = UINT64_MAX;
INSTANTIATE_TEST_SUITE_P(
    Tcp, TcpProtocol,
    ::testing::Values(
        BadHeader{"OffsetPastTheWindow", [] { return write(kWindowBytes - 10, 100, 1, true); }, 100,
                  "exceeds the window"},
        BadHeader{"OffsetOverflowing", [] { return write(kMax - 50, 100, 1, false); }, 100, "exceeds the window"},
        BadHeader{"ChunkOutsideItsMessage",
                  [] {
                    MessageHeader h = write(0, 100, 1, false);
                    h.chunkOffset = kMax - 20;
                    return h;
                  },
                  100, "outside its message"},
        BadHeader{"OversizedChunk",
                  [] {
                    MessageHeader h = write(0, kChunk + 1, 1, false);
                    return h;
                  },
                  kChunk + 1, "exceeds the chunk limit"},
        BadHeader{"UnregisteredWindow",
                  [] {
                    MessageHeader h = write(0, 10, 1, false);
                    h.window = 8;
                    return h;
                  },
                  10, "not registered"},
        BadHeader{"WrongLane",
                  [] {
                    MessageHeader h = write(0, 10, 1, false);
                    h.lane = 3;
                    return h;
                  },
                  10, "lane 3"},
        BadHeader{"AlreadyCompleteWrite", [] { return write(0, 10, 0, false); }, 10, "already complete"},
        BadHeader{"AtomicUnaligned", [] { return atomic(100, 1, SignalOp::kAdd); }, 8, "not 8-byte aligned"},
        BadHeader{"AtomicPastTheWindow", [] { return atomic(kWindowBytes, 1, SignalOp::kSet); }, 8,
                  "exceeds the window"},
        BadHeader{"AtomicOverflowing", [] { return atomic(kMax - 7, 1, SignalOp::kAdd); }, 8, "exceeds the window"},
        BadHeader{"AtomicUnregisteredWindow",
                  [] {
                    MessageHeader h = atomic(0, 1, SignalOp::kAdd);
                    h.window = 8;
                    return h;
                  },
                  8, "not registered"},
        BadHeader{"AtomicUnknownKind", [] { return atomic(0, 1, static_cast<SignalOp>(2)); }, 8, "unknown atomic kind"},
        BadHeader{"AtomicOfTwoWords",
                  [] {
                    MessageHeader h = atomic(0, 1, SignalOp::kAdd);
                    h.bytes = h.chunkBytes = 16;
                    return h;
                  },
                  16, "one 8-byte word"},
        BadHeader{"AtomicWithImmediate",
                  [] {
                    MessageHeader h = atomic(0, 1, SignalOp::kAdd);
                    h.flags = tcp::kFlagImm;
                    return h;
                  },
                  8, "flags"},
        BadHeader{"AtomicAlreadyComplete", [] { return atomic(0, 0, SignalOp::kSet); }, 8, "already complete"},
        BadHeader{"MessageEmpty", [] { return control(0, 1); }, 0, "control message of 0 bytes"},
        BadHeader{"MessageTooLong", [] { return control(kMaxMessageBytes + 1, 1); }, kMaxMessageBytes + 1,
                  "control message of 65 bytes"},
        BadHeader{"MessageChunkShorterThanItsLength",
                  [] {
                    MessageHeader h = control(40, 1);
                    h.chunkBytes = 20;
                    return h;
                  },
                  20, "in one chunk"},
        BadHeader{"MessageNamingAWindow",
                  [] {
                    MessageHeader h = control(16, 1);
                    h.window = kWindow;
                    return h;
                  },
                  16, "control message with window"},
        BadHeader{"MessageWithImmediateFlag",
                  [] {
                    MessageHeader h = control(16, 1);
                    h.flags = tcp::kFlagImm;
                    return h;
                  },
                  16, "control message with window, offset, flags"},
        BadHeader{"MessageAlreadyComplete", [] { return control(16, 0); }, 16, "already complete"},
        BadHeader{"Garbage",
                  [] {
                    MessageHeader h;
                    test::fillRandom(&h, sizeof h, 99);
                    return h;
                  },
                  1000, "bad magic"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gdx
