// Remote 64-bit atomics of the TCP transport: exact sums under concurrency, ordering behind earlier writes (a
// poller that sees the value sees the data), and argument checking. Malformed atomics on the wire are covered
// by tcp_protocol_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using test::connectAll;
using test::tcpWorld;
using test::waitFor;

constexpr uint32_t kSrcWindow = 1;
constexpr uint32_t kDstWindow = 2;
constexpr uint32_t kWordWindow = 3;
constexpr uint64_t kPoison = 0xA5A5A5A5A5A5A5A5ull;

AtomicOp atomicOp(int peer, uint64_t offset, SignalOp kind, uint64_t value, uint64_t cookie) {
  AtomicOp op;
  op.peer = peer;
  op.remoteWindow = kWordWindow;
  op.remoteOffset = offset;
  op.kind = kind;
  op.value = value;
  op.cookie = cookie;
  return op;
}

TEST(TcpAtomic, AddsFromTwoLanesOnTheirOwnThreadsSumExactly) {
  constexpr int kLanes = 2;
  constexpr int kPerLane = 3000;
  auto t = tcpWorld(2, 2, 4096);
  std::vector<uint64_t> words(4, kPoison);  // word 1 is the counter, the others must stay untouched
  words[1] = 0;
  std::atomic<int> announced{0}, failures{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  for (auto& x : t) x->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  t[0]->addRemoteWindow(1, kWordWindow, words.size() * 8,
                        t[1]->registerWindow(kWordWindow, words.data(), words.size() * 8, MemoryKind::kHost));
  connectAll(t, kLanes);

  uint64_t expected = 0;
  for (int l = 0; l < kLanes; ++l)
    for (int i = 0; i < kPerLane; ++i) expected += (static_cast<uint64_t>(l + 1) << 40) + 7 * i + 1;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int l = 0; l < kLanes; ++l)
    threads.emplace_back([&, l] {
      TransportLane& lane = t[0]->lane(l);
      for (int i = 0; i < kPerLane; ++i)
        lane.postAtomic(atomicOp(1, 8, SignalOp::kAdd, (static_cast<uint64_t>(l + 1) << 40) + 7 * i + 1, i));
      auto done = test::pollCompletions(lane, kPerLane, 20000);
      int good = 0;
      for (auto& c : done) good += c.status == Status::kOk && c.peer == 1;
      ok += good;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kLanes * kPerLane);
  ASSERT_TRUE(waitFor([&] { return atomicLoad(&words[1], kAcquire) == expected; }, 20000))
      << "sum " << atomicLoad(&words[1], kAcquire) << ", expected " << expected;
  // Nothing more arrives later, and nothing spilled over.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(atomicLoad(&words[1], kAcquire), expected);
  for (int w : {0, 2, 3}) EXPECT_EQ(words[w], kPoison) << "word " << w;
  EXPECT_EQ(announced.load(), 0) << "an atomic was announced as an immediate";
  EXPECT_EQ(failures.load(), 0);
  for (auto& x : t) x->shutdown();
}

// The receiver polls the word with acquire loads in its own thread, like a kernel waiting on a signal: once it
// sees the value set, every byte written before the atomic must be in place. The writes are spread over 4 sockets
// in small chunks, and laid out so that the atomic overtakes them unless the receiver holds it back: chunks go
// round-robin over the sockets, each write here is 3 full chunks and a tail of a few bytes (so one socket carries
// only tails), and the write just before the atomic has 3 chunks, which puts the atomic on that lightly loaded
// socket while the other three still stream megabytes.
TEST(TcpAtomic, ASetIsPerformedOnlyAfterEveryEarlierWriteIsInPlace) {
  constexpr int kRounds = 6;
  constexpr size_t kChunk = 64 << 10;
  constexpr size_t kTail = 64;  // a write-with-immediate posted after the atomic lands here
  std::mt19937_64 rng(17);
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 100; ++i) sizes.push_back(3 * kChunk + 1 + rng() % 64);
  sizes.push_back(3 * kChunk);
  uint64_t bytes = 0;
  for (uint64_t n : sizes) bytes += n;

  auto t = tcpWorld(2, 4, kChunk);
  std::vector<unsigned char> src(bytes + kTail), dst(bytes + kTail, 0);
  std::vector<uint64_t> flag(2, 0);
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<int> announced{0}, failures{0};
  t[1]->setImmHandler([&](const RemoteWrite& w) {
    // An immediate posted after the set must be announced after it was performed.
    uint64_t seen = atomicLoad(&flag[1], kAcquire);
    if (seen != w.imm + 1ull) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back("imm " + std::to_string(w.imm) + " announced while the word holds " + std::to_string(seen));
    }
    announced++;
  });
  for (auto& x : t) x->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, dst.size(),
                        t[1]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
  t[0]->addRemoteWindow(1, kWordWindow, flag.size() * 8,
                        t[1]->registerWindow(kWordWindow, flag.data(), flag.size() * 8, MemoryKind::kHost));
  connectAll(t, 1);

  std::atomic<int> checked{0};  // rounds the poller has verified
  std::vector<long long> mismatch(kRounds, -2);
  std::thread poller([&] {
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t want = static_cast<uint64_t>(r) + 1;
      const uint64_t deadline = nowNs() + 20000000000ull;
      while (atomicLoad(&flag[1], kAcquire) != want && nowNs() < deadline) {
      }
      // src does not change until this round is checked, so it is the reference. The last writes are the ones
      // most likely to be still on their way: they are checked first, before anything else can arrive.
      const uint64_t late = bytes - std::min<uint64_t>(bytes, 4 * kChunk);
      long long bad = -3;
      if (atomicLoad(&flag[1], kAcquire) == want) {
        bad = test::firstMismatch(src.data() + late, dst.data() + late, bytes - late);
        if (bad >= 0)
          bad += static_cast<long long>(late);
        else
          bad = test::firstMismatch(src.data(), dst.data(), bytes);
      }
      mismatch[r] = bad;
      checked.store(r + 1);
    }
  });

  TransportLane& lane = t[0]->lane(0);
  for (int r = 0; r < kRounds; ++r) {
    test::fillRandom(src.data(), src.size(), 100 + r);
    uint64_t posted = 0, off = 0;
    for (uint64_t n : sizes) {
      lane.post(WriteOp{1, kSrcWindow, off, kDstWindow, off, n, false, 0, posted++});
      off += n;
    }
    lane.postAtomic(atomicOp(1, 8, SignalOp::kSet, static_cast<uint64_t>(r) + 1, posted++));
    lane.post(WriteOp{1, kSrcWindow, bytes, kDstWindow, bytes, kTail, true, static_cast<uint32_t>(r), posted++});
    auto done = test::pollCompletions(lane, posted, 20000);
    ASSERT_EQ(done.size(), posted);
    for (auto& c : done) ASSERT_EQ(c.status, Status::kOk);
    ASSERT_TRUE(waitFor([&] { return checked.load() == r + 1; }, 20000)) << "round " << r;
    EXPECT_EQ(mismatch[r], -1) << "round " << r << ": the set was visible before the byte at this offset arrived";
    ASSERT_TRUE(waitFor([&] { return announced.load() == r + 1; }, 20000)) << "round " << r;
  }
  poller.join();
  EXPECT_EQ(flag[0], 0u);
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), src.size()), -1);
  std::lock_guard<std::mutex> lock(mu);
  for (auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(failures.load(), 0);
}

TEST(TcpAtomic, InvalidAtomicsThrowBeforeAnythingIsSentAndChangeNothing) {
  constexpr size_t kWords = 8;
  constexpr uint64_t kBytes = kWords * 8;
  auto t = tcpWorld(2, 2, 4096);
  std::vector<uint64_t> words(kWords, kPoison);
  std::vector<unsigned char> src(16, 1), dst(16, 0);
  std::atomic<int> announced{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  t[0]->addRemoteWindow(1, kWordWindow, kBytes,
                        t[1]->registerWindow(kWordWindow, words.data(), kBytes, MemoryKind::kHost));
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, dst.size(),
                        t[1]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
  connectAll(t, 1);
  TransportLane& lane = t[0]->lane(0);

  const AtomicOp good = atomicOp(1, 8, SignalOp::kAdd, 5, 70);
  const uint64_t kMax = UINT64_MAX;
  std::vector<test::BadArgument<AtomicOp>> cases = {
      {"negative peer", [](AtomicOp& o) { o.peer = -1; }, "peer -1"},
      {"peer past the world", [](AtomicOp& o) { o.peer = 2; }, "unknown peer"},
      {"unknown remote window", [](AtomicOp& o) { o.remoteWindow = 99; }, "remote window 99"},
      {"unaligned offset", [](AtomicOp& o) { o.remoteOffset = 4; }, "not 8-byte aligned"},
      {"unaligned offset at the end", [](AtomicOp& o) { o.remoteOffset = kBytes - 4; }, "not 8-byte aligned"},
      {"offset at the end", [](AtomicOp& o) { o.remoteOffset = kBytes; }, "exceeds the window"},
      {"offset far past the end", [](AtomicOp& o) { o.remoteOffset = 1 << 20; }, "exceeds the window"},
      {"offset overflowing", [&](AtomicOp& o) { o.remoteOffset = kMax - 7; }, "exceeds the window"},
      {"unknown kind", [](AtomicOp& o) { o.kind = static_cast<SignalOp>(2); }, "unknown atomic kind"},
  };
  test::expectInvalidArguments<AtomicOp>(good, cases, [&](const AtomicOp& op) { lane.postAtomic(op); });
  EXPECT_EQ(lane.inFlight(), 0u);
  Completion c;
  EXPECT_EQ(lane.poll(&c, 1), 0u);

  // Valid ones afterwards: the last word of the window, then a write-with-immediate that is announced only after
  // them; the rejected ones left no trace.
  lane.postAtomic(good);
  lane.postAtomic(atomicOp(1, kBytes - 8, SignalOp::kSet, 77, 71));
  lane.post(WriteOp{1, kSrcWindow, 0, kDstWindow, 0, 16, true, 9, 72});
  ASSERT_TRUE(waitFor([&] { return announced.load() == 1; }, 10000));
  auto done = test::pollCompletions(lane, 3, 10000);
  ASSERT_EQ(done.size(), 3u);
  for (auto& d : done) EXPECT_EQ(d.status, Status::kOk) << d.cookie;
  EXPECT_EQ(atomicLoad(&words[1], kAcquire), kPoison + 5);
  EXPECT_EQ(atomicLoad(&words[kWords - 1], kAcquire), 77u);
  for (size_t w = 0; w < kWords; ++w) {
    if (w != 1 && w != kWords - 1) {
      EXPECT_EQ(words[w], kPoison) << "word " << w << " changed";
    }
  }
  EXPECT_EQ(announced.load(), 1);
  EXPECT_EQ(t[0]->peerStatus(1), Status::kOk);
  EXPECT_EQ(t[1]->peerStatus(0), Status::kOk);
}

// A window whose base is not 8-byte aligned in the peer's memory: its key says so, and the sender refuses an atomic
// (whose offsets are 8-byte multiples) that the receiver could not apply to an aligned word, instead of the
// connection failing; the window takes writes, and atomics into an aligned window go on.
TEST(TcpAtomic, AtomicIntoAWindowWithAnUnalignedBaseIsRefusedBySender) {
  constexpr uint64_t kBytes = 64;
  auto t = tcpWorld(2, 1, 4096);
  alignas(8) unsigned char memory[kBytes + 8];
  std::memset(memory, 0xAB, sizeof memory);
  unsigned char* skewed = memory + 3;  // 3 bytes past an 8-byte boundary
  std::vector<uint64_t> words(2, kPoison);
  std::vector<unsigned char> src(16, 7);
  t[0]->addRemoteWindow(1, kDstWindow, kBytes, t[1]->registerWindow(kDstWindow, skewed, kBytes, MemoryKind::kHost));
  t[0]->addRemoteWindow(1, kWordWindow, 16, t[1]->registerWindow(kWordWindow, words.data(), 16, MemoryKind::kHost));
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  std::atomic<int> announced{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  connectAll(t, 1);
  TransportLane& lane = t[0]->lane(0);
  for (uint64_t offset : {uint64_t(0), uint64_t(8)}) {
    AtomicOp op = atomicOp(1, offset, SignalOp::kAdd, 5, 80);
    op.remoteWindow = kDstWindow;
    try {
      lane.postAtomic(op);
      ADD_FAILURE() << "an atomic on an unaligned word was accepted (offset " << offset << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("3 bytes past an 8-byte boundary"), std::string::npos) << e.what();
    }
  }
  // The atomic, then a write announced with an immediate: once the announcement is seen, both are in place.
  lane.postAtomic(atomicOp(1, 8, SignalOp::kAdd, 5, 82));
  lane.post(WriteOp{1, kSrcWindow, 0, kDstWindow, 1, 16, true, 9, 81});
  ASSERT_TRUE(waitFor([&] { return announced.load() == 1; }, 10000));
  auto done = test::pollCompletions(lane, 2, 10000);
  ASSERT_EQ(done.size(), 2u);
  for (auto& d : done) EXPECT_EQ(d.status, Status::kOk) << d.cookie;
  EXPECT_EQ(atomicLoad(&words[1], kAcquire), kPoison + 5);
  EXPECT_EQ(skewed[0], 0xAB);
  for (int i = 1; i <= 16; ++i) EXPECT_EQ(skewed[i], 7) << "byte " << i;
  EXPECT_EQ(skewed[17], 0xAB);
  EXPECT_EQ(t[0]->peerStatus(1), Status::kOk);
  EXPECT_EQ(t[1]->peerStatus(0), Status::kOk);
}

TEST(TcpAtomic, AtomicsToAPeerThatLeftCompleteWithoutBeingSent) {
  auto t = tcpWorld(2, 1, 4096);
  std::vector<uint64_t> words(2, 0);
  t[0]->addRemoteWindow(1, kWordWindow, 16, t[1]->registerWindow(kWordWindow, words.data(), 16, MemoryKind::kHost));
  connectAll(t, 1);
  t[1]->shutdown();
  ASSERT_TRUE(waitFor([&] { return t[0]->peerStatus(1) == Status::kShutdown; }, 5000));
  TransportLane& lane = t[0]->lane(0);
  lane.postAtomic(atomicOp(1, 0, SignalOp::kAdd, 1, 5));
  auto done = test::pollCompletions(lane, 1, 5000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cookie, 5u);
  EXPECT_NE(done[0].status, Status::kOk);
  EXPECT_EQ(words[0], 0u);
}

}  // namespace
}  // namespace gdx
