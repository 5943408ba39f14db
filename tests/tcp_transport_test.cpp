// TCP transport in one process: data integrity, ordering of immediates, argument checking, refused strangers.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using test::connectAll;
using test::tcpOptions;
using test::tcpWorld;
using test::waitFor;

constexpr uint32_t kSrcWindow = 1;
constexpr uint32_t kDstWindow = 2;
constexpr size_t kGuard = 4096;

// ---- data integrity and ordering ------------------------------------------------------------------------

struct DataCase {
  int world;
  int sockets;
};

class TcpData : public ::testing::TestWithParam<DataCase> {};

TEST_P(TcpData, EveryByteArrivesAndImmediatesFollowTheirDataInPostOrder) {
  const auto [world, sockets] = GetParam();
  const size_t chunk = 64 << 10;
  const int sender = 0, receiver = world - 1;

  // Writes: the sizes that matter, then many small ones, all outstanding at once, packed back to back.
  std::vector<uint64_t> sizes = {1, 4095, (1 << 20) + 3, 64ull << 20};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) sizes.push_back(1 + rng() % 20000);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (uint64_t s : sizes) offsets.push_back(total), total += s;
  auto withImm = [&](size_t i) { return i % 3 != 1 || i + 1 == sizes.size(); };

  std::vector<unsigned char> src(total), dst(total + kGuard);
  test::fillRandom(src.data(), total, 42);
  // Every destination byte starts different from the byte that should land there.
  for (uint64_t i = 0; i < total; ++i) dst[i] = src[i] ^ 0x5A;
  std::memset(dst.data() + total, 0xEE, kGuard);

  auto t = tcpWorld(world, sockets, chunk);
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<long> lastAnnounced{-1};
  t[receiver]->setImmHandler([&](const RemoteWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    long k = static_cast<long>(w.imm);
    if (w.peer != sender || w.window != kDstWindow || k <= lastAnnounced.load() || k >= (long)sizes.size() ||
        w.offset != offsets[k] || w.bytes != sizes[k]) {
      errors.push_back("unexpected announcement imm " + std::to_string(k) + " after " +
                       std::to_string(lastAnnounced.load()));
      return;
    }
    // This write and every earlier one (plain writes included) must already be in place.
    for (long j = lastAnnounced.load() + 1; j <= k; ++j) {
      long long bad = test::firstMismatch(src.data() + offsets[j], dst.data() + offsets[j], sizes[j]);
      if (bad >= 0)
        errors.push_back("imm " + std::to_string(k) + " announced before write " + std::to_string(j) +
                         " was in place (byte " + std::to_string(bad) + ")");
    }
    lastAnnounced.store(k);
  });
  t[sender]->registerWindow(kSrcWindow, src.data(), total, MemoryKind::kHost);
  std::string key = t[receiver]->registerWindow(kDstWindow, dst.data(), total, MemoryKind::kHost);
  t[sender]->addRemoteWindow(receiver, kDstWindow, total, key);
  connectAll(t, 1);

  TransportLane& lane = t[sender]->lane(0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    WriteOp op;
    op.peer = receiver;
    op.localWindow = kSrcWindow;
    op.localOffset = offsets[i];
    op.remoteWindow = kDstWindow;
    op.remoteOffset = offsets[i];
    op.bytes = sizes[i];
    op.withImm = withImm(i);
    op.imm = static_cast<uint32_t>(i);
    op.cookie = 1000 + i;
    lane.post(op);
  }
  EXPECT_EQ(lane.inFlight(), sizes.size());
  auto done = test::pollCompletions(lane, sizes.size(), 20000);
  ASSERT_EQ(done.size(), sizes.size());
  std::set<uint64_t> cookies;
  for (auto& c : done) {
    EXPECT_EQ(c.status, Status::kOk);
    EXPECT_EQ(c.peer, receiver);
    cookies.insert(c.cookie);
  }
  EXPECT_EQ(cookies.size(), sizes.size());
  EXPECT_EQ(*cookies.begin(), 1000u);
  EXPECT_EQ(lane.inFlight(), 0u);

  ASSERT_TRUE(waitFor([&] { return lastAnnounced.load() == (long)sizes.size() - 1; }, 20000))
      << "last announcement " << lastAnnounced.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : errors) ADD_FAILURE() << e;
  }
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), total), -1);
  for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dst[total + i], 0xEE) << "guard byte " << i;
  for (int r = 0; r < world; ++r)
    for (int p = 0; p < world; ++p) EXPECT_EQ(t[r]->peerStatus(p), Status::kOk);
  for (auto& x : t) x->shutdown();
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpData,
                         ::testing::Values(DataCase{2, 1}, DataCase{2, 4}, DataCase{1, 1}, DataCase{1, 4}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_sockets" +
                                  std::to_string(info.param.sockets);
                         });

TEST(TcpTransport, LanesAreIndependentAndUsableFromTheirOwnThreads) {
  constexpr int kLanes = 3;
  constexpr size_t kBytes = 3 << 20;
  auto t = tcpWorld(2, 2, 256 << 10);
  std::vector<unsigned char> src(kBytes * kLanes), dst(kBytes * kLanes, 0);
  test::fillRandom(src.data(), src.size(), 3);
  std::atomic<int> announced{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, dst.size(),
                        t[1]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
  connectAll(t, kLanes);
  ASSERT_EQ(t[0]->numLanes(), kLanes);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int l = 0; l < kLanes; ++l)
    threads.emplace_back([&, l] {
      TransportLane& lane = t[0]->lane(l);
      const size_t piece = kBytes / 16;
      for (int i = 0; i < 16; ++i) {
        uint64_t off = l * kBytes + i * piece;
        lane.post(WriteOp{1, kSrcWindow, off, kDstWindow, off, piece, true, static_cast<uint32_t>(i), 0});
      }
      auto done = test::pollCompletions(lane, 16, 20000);
      int good = 0;
      for (auto& c : done) good += c.status == Status::kOk;
      ok += good;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 16 * kLanes);
  ASSERT_TRUE(waitFor([&] { return announced.load() == 16 * kLanes; }, 20000));
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), src.size()), -1);
}

// ---- argument checking -----------------------------------------------------------------------------------

TEST(TcpTransport, InvalidWritesThrowBeforeAnythingIsSent) {
  constexpr size_t kBytes = 8192;
  auto t = tcpWorld(2, 2, 4096);
  std::vector<unsigned char> src(kBytes), dst(kBytes, 0xCD);
  test::fillRandom(src.data(), kBytes, 9);
  std::atomic<int> announced{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  t[0]->registerWindow(kSrcWindow, src.data(), kBytes, MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, kBytes, t[1]->registerWindow(kDstWindow, dst.data(), kBytes, MemoryKind::kHost));
  connectAll(t, 1);
  TransportLane& lane = t[0]->lane(0);

  const WriteOp good{1, kSrcWindow, 0, kDstWindow, 0, 100, true, 1, 7};
  const uint64_t kMax = UINT64_MAX;
  std::vector<test::BadArgument<WriteOp>> cases = {
      {"negative peer", [](WriteOp& o) { o.peer = -1; }, "peer -1"},
      {"peer past the world", [](WriteOp& o) { o.peer = 2; }, "unknown peer"},
      {"unregistered local window", [](WriteOp& o) { o.localWindow = 99; }, "local window 99"},
      {"unknown remote window", [](WriteOp& o) { o.remoteWindow = 99; }, "remote window 99"},
      {"local range past the end", [](WriteOp& o) { o.localOffset = kBytes - 99; }, "8192 bytes"},
      {"remote range past the end", [](WriteOp& o) { o.remoteOffset = kBytes - 50; }, "8192 bytes"},
      {"remote offset overflowing", [&](WriteOp& o) { o.remoteOffset = kMax - 10; }, "exceeds the window"},
      {"local offset overflowing", [&](WriteOp& o) { o.localOffset = kMax - 10; }, "exceeds the window"},
      {"huge size", [&](WriteOp& o) { o.bytes = kMax; }, "exceeds the window"},
      {"remote offset at the end", [](WriteOp& o) { o.remoteOffset = kBytes; }, "exceeds the window"},
      {"zero size", [](WriteOp& o) { o.bytes = 0; }, "zero-byte"},
  };
  test::expectInvalidArguments<WriteOp>(good, cases, [&](const WriteOp& op) { lane.post(op); });
  EXPECT_EQ(lane.inFlight(), 0u);
  Completion c;
  EXPECT_EQ(lane.poll(&c, 1), 0u);

  // A valid write afterwards is announced after everything posted before it; the rejected ones left no trace.
  WriteOp last = good;
  last.remoteOffset = 1000;
  lane.post(last);
  ASSERT_TRUE(waitFor([&] { return announced.load() == 1; }, 10000));
  auto done = test::pollCompletions(lane, 1, 10000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);
  EXPECT_EQ(done[0].cookie, 7u);
  EXPECT_EQ(std::memcmp(dst.data() + 1000, src.data(), 100), 0);
  for (size_t i = 0; i < kBytes; ++i) {
    if (i < 1000 || i >= 1100) {
      ASSERT_EQ(dst[i], 0xCD) << "byte " << i << " of the receiver's window changed";
    }
  }
  EXPECT_EQ(announced.load(), 1);
}

TEST(TcpTransport, RejectsCudaWindowsBadOptionsAndUnknownLanes) {
  auto t = makeTcpTransport(tcpOptions(0, 1, 1, 4096, 5000));
  char buf[64];
  try {
    t->registerWindow(3, buf, sizeof buf, MemoryKind::kCuda);
    ADD_FAILURE() << "CUDA window accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    // Host memory registered as a GPU window is refused, with or without CUDA in the build.
    EXPECT_NE(std::string(e.what()).find("window 3"), std::string::npos) << e.what();
  }
  t->registerWindow(3, buf, sizeof buf, MemoryKind::kHost);
  EXPECT_THROW(t->registerWindow(3, buf, sizeof buf, MemoryKind::kHost), Error);
  EXPECT_THROW(t->lane(0), Error);
  EXPECT_THROW(makeTcpTransport(tcpOptions(2, 2, 1, 4096, 5000)), Error);
  EXPECT_THROW(makeTcpTransport(tcpOptions(0, 1, 0, 4096, 5000)), Error);
  EXPECT_THROW(makeTcpTransport(tcpOptions(0, 1, 1, 0, 5000)), Error);
}

TEST(TcpTransport, OptionsComeFromTheEnvironment) {
  setenv("GDX_TCP_SOCKETS", "3", 1);
  setenv("GDX_TCP_CHUNK", "65536", 1);
  setenv("GDX_TCP_BIND_ADDR", "127.0.0.1", 1);
  setenv("GDX_TIMEOUT_MS", "1234", 1);
  auto o = TcpTransportOptions::fromEnv(1, 4, "s");
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.worldSize, 4);
  EXPECT_EQ(o.socketsPerPeer, 3);
  EXPECT_EQ(o.chunkBytes, 65536u);
  EXPECT_EQ(o.bindAddress, "127.0.0.1");
  EXPECT_EQ(o.timeoutNs, 1234000000ull);
  EXPECT_EQ(o.secret, "s");
  setenv("GDX_TCP_SOCKETS", "0", 1);
  EXPECT_THROW(TcpTransportOptions::fromEnv(0, 1, "s"), Error);
  for (const char* v : {"GDX_TCP_SOCKETS", "GDX_TCP_CHUNK", "GDX_TCP_BIND_ADDR", "GDX_TIMEOUT_MS"}) unsetenv(v);
  o = TcpTransportOptions::fromEnv(0, 1, "s");
  EXPECT_EQ(o.socketsPerPeer, 4);
  EXPECT_EQ(o.chunkBytes, 1u << 20);
  EXPECT_EQ(o.bindAddress, "");
  EXPECT_EQ(o.timeoutNs, 30000000000ull);
}

// ---- connection authentication -----------------------------------------------------------------------------

/// Connects to `address` and presents a Hello; returns the fd and the acceptor's reply (-1: closed without one).
std::pair<int, int> stranger(const std::string& address, const tcp::Hello& hello, const std::string& secret) {
  int fd = test::rawConnect(address);
  if (fd < 0) return {-1, -1};
  std::string bytes(reinterpret_cast<const char*>(&hello), sizeof hello);
  bytes += secret;
  test::rawSend(fd, bytes.data(), bytes.size());
  return {fd, -2};
}

int replyOf(int fd, int timeoutMs) {
  tcp::HelloAck ack;
  if (test::rawRecv(fd, &ack, sizeof ack, timeoutMs) != sizeof ack) return -1;
  return static_cast<int>(ack.reply);
}

tcp::Hello helloAs(int rank, int world, uint32_t lane, uint32_t socket, const std::string& secret) {
  tcp::Hello h;
  h.rank = rank;
  h.worldSize = world;
  h.lane = lane;
  h.lanes = 1;
  h.socketIndex = socket;
  h.socketsPerPeer = 1;
  h.secretBytes = static_cast<uint32_t>(secret.size());
  h.chunkBytes = 4096;
  return h;
}

TEST(TcpTransport, StrangersAreRefusedAndTheRealPeerStillConnects) {
  auto t = tcpWorld(2, 1, 4096, 10000);
  std::vector<unsigned char> src(4096), dst(4096, 0);
  test::fillRandom(src.data(), src.size(), 5);
  std::atomic<int> failures{0}, announced{0};
  for (auto& x : t) x->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, dst.size(),
                        t[1]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
  const std::string addr1 = t[1]->localAddress();
  // Before the real ranks connect: a wrong secret claiming rank 0's only slot, an unknown rank with the right
  // secret, and plain garbage. They wait in the listen queue until rank 1's connect() starts the acceptor.
  auto [wrongSecret, r1] = stranger(addr1, helloAs(0, 2, 0, 0, "not-the-secret"), "not-the-secret");
  auto [unknownRank, r2] = stranger(addr1, helloAs(5, 2, 0, 0, "tcp-test-secret"), "tcp-test-secret");
  int garbage = test::rawConnect(addr1);
  std::vector<unsigned char> junk(200);
  test::fillRandom(junk.data(), junk.size(), 11);
  test::rawSend(garbage, junk.data(), junk.size());

  connectAll(t, 1);
  EXPECT_EQ(replyOf(wrongSecret, 5000), static_cast<int>(tcp::HelloReply::kBadSecret));
  EXPECT_EQ(replyOf(unknownRank, 5000), static_cast<int>(tcp::HelloReply::kBadRank));
  EXPECT_TRUE(test::rawClosed(wrongSecret, 5000));
  EXPECT_TRUE(test::rawClosed(garbage, 5000));

  // After connect: a duplicate of a real connection, with the right secret, is refused too.
  auto [duplicate, r3] = stranger(addr1, helloAs(0, 2, 0, 0, "tcp-test-secret"), "tcp-test-secret");
  EXPECT_EQ(replyOf(duplicate, 5000), static_cast<int>(tcp::HelloReply::kDuplicate));
  for (int fd : {wrongSecret, unknownRank, garbage, duplicate}) ::close(fd);
  (void)r1, (void)r2, (void)r3;

  TransportLane& lane = t[0]->lane(0);
  lane.post(WriteOp{1, kSrcWindow, 0, kDstWindow, 0, 4096, true, 5, 1});
  auto done = test::pollCompletions(lane, 1, 10000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);
  ASSERT_TRUE(waitFor([&] { return announced.load() == 1; }, 10000));
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), 4096), -1);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t[1]->peerStatus(0), Status::kOk);
  EXPECT_EQ(t[0]->peerStatus(1), Status::kOk);
}

TEST(TcpTransport, ConnectTimesOutNamingTheMissingRank) {
  auto t0 = makeTcpTransport(tcpOptions(0, 2, 1, 4096, 1000));
  auto t1 = makeTcpTransport(tcpOptions(1, 2, 1, 4096, 1000));
  // Rank 1 exists (its listener accepts) but never calls connect(): nobody answers rank 0's hellos.
  try {
    t0->connect({t0->localAddress(), t1->localAddress()}, 1);
    ADD_FAILURE() << "connect succeeded without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("[1]"), std::string::npos) << e.what();
  }
}

TEST(TcpTransport, GoodbyeIsNotAFailure) {
  auto t = tcpWorld(2, 2, 4096, 10000);
  std::vector<unsigned char> buf(4096);
  std::atomic<int> failures{0};
  for (auto& x : t) x->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  t[0]->addRemoteWindow(1, kDstWindow, buf.size(),
                        t[1]->registerWindow(kDstWindow, buf.data(), buf.size(), MemoryKind::kHost));
  t[0]->registerWindow(kSrcWindow, buf.data(), buf.size(), MemoryKind::kHost);
  connectAll(t, 1);
  t[1]->shutdown();
  t[1]->shutdown();  // idempotent
  ASSERT_TRUE(waitFor([&] { return t[0]->peerStatus(1) == Status::kShutdown; }, 5000));
  TransportLane& lane = t[0]->lane(0);
  lane.post(WriteOp{1, kSrcWindow, 0, kDstWindow, 0, 100, false, 0, 3});
  auto done = test::pollCompletions(lane, 1, 5000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NE(done[0].status, Status::kOk);
  t[0]->shutdown();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace gdx
