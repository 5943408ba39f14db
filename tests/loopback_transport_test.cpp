// Loopback transport (a world of one, host memory): every byte of writes from 1 B to 16 MiB, immediates
// announced after their data and from the posting thread, atomics, control messages delivered after the writes
// before them, argument checking that changes nothing, and exactly one completion per op.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gdx/device/impl/atomic.hpp"
#include "gdx/error.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using test::BadArgument;
using test::expectInvalidArguments;

constexpr uint32_t kSrcWindow = 1;
constexpr uint32_t kDstWindow = 2;
constexpr uint32_t kWordWindow = 3;
constexpr size_t kGuard = 4096;
constexpr uint64_t kPoison = 0xA5A5A5A5A5A5A5A5ull;

/// A connected loopback transport with `lanes` lanes.
std::unique_ptr<Transport> connected(int lanes) {
  auto t = makeLoopbackTransport();
  t->connect({t->localAddress()}, lanes);
  return t;
}

/// Registers `bytes` at `base` as window `id` and tells the transport about it as its own peer's window.
void addWindow(Transport& t, uint32_t id, void* base, size_t bytes) {
  t.addRemoteWindow(0, id, bytes, t.registerWindow(id, base, bytes, MemoryKind::kHost));
}

/// Everything in `lane` right now (no waiting: the loopback completes inside post()).
std::vector<Completion> drain(TransportLane& lane) {
  std::vector<Completion> out;
  Completion buf[16];
  for (size_t n; (n = lane.poll(buf, 16)) > 0;) out.insert(out.end(), buf, buf + n);
  return out;
}

WriteOp writeOp(uint64_t srcOffset, uint64_t dstOffset, uint64_t bytes, bool withImm, uint32_t imm, uint64_t cookie) {
  WriteOp op;
  op.peer = 0;
  op.localWindow = kSrcWindow;
  op.localOffset = srcOffset;
  op.remoteWindow = kDstWindow;
  op.remoteOffset = dstOffset;
  op.bytes = bytes;
  op.withImm = withImm;
  op.imm = imm;
  op.cookie = cookie;
  return op;
}

AtomicOp atomicOp(uint64_t offset, SignalOp kind, uint64_t value, uint64_t cookie) {
  AtomicOp op;
  op.peer = 0;
  op.remoteWindow = kWordWindow;
  op.remoteOffset = offset;
  op.kind = kind;
  op.value = value;
  op.cookie = cookie;
  return op;
}

TEST(LoopbackTransport, EveryByteArrivesAndEachImmediateFollowsItsDataInThePostingThread) {
  // Sizes that matter, packed back to back, written from one window into another on two lanes alternately.
  const std::vector<uint64_t> sizes = {1, 2, 7, 8, 4095, 4096, 4097, 65537, (1 << 20) + 3, 16ull << 20};
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (uint64_t s : sizes) offsets.push_back(total), total += s;
  std::vector<unsigned char> src(total), dst(total + kGuard);
  test::fillRandom(src.data(), total, 11);
  for (uint64_t i = 0; i < total; ++i) dst[i] = src[i] ^ 0x5A;  // every byte starts wrong
  std::memset(dst.data() + total, 0xEE, kGuard);

  auto t = connected(2);
  EXPECT_EQ(t->name(), "loopback");
  EXPECT_EQ(t->numLanes(), 2);
  std::vector<std::string> errors;
  long announced = -1;
  std::thread::id poster = std::this_thread::get_id();
  t->setImmHandler([&](const RemoteWrite& w) {
    long k = static_cast<long>(w.imm);
    if (std::this_thread::get_id() != poster) errors.push_back("announced from another thread");
    if (w.peer != 0 || w.window != kDstWindow || k != announced + 1 || w.offset != offsets[k] || w.bytes != sizes[k]) {
      errors.push_back("unexpected announcement of imm " + std::to_string(k));
      return;
    }
    long long bad = test::firstMismatch(src.data() + offsets[k], dst.data() + offsets[k], sizes[k]);
    if (bad >= 0) errors.push_back("imm " + std::to_string(k) + " announced before byte " + std::to_string(bad));
    announced = k;
  });
  addWindow(*t, kSrcWindow, src.data(), total);
  addWindow(*t, kDstWindow, dst.data(), total);

  for (size_t i = 0; i < sizes.size(); ++i) {
    TransportLane& lane = t->lane(static_cast<int>(i % 2));
    lane.post(writeOp(offsets[i], offsets[i], sizes[i], true, static_cast<uint32_t>(i), 500 + i));
    // Performed and announced before post() returned.
    EXPECT_EQ(announced, static_cast<long>(i));
    EXPECT_EQ(test::firstMismatch(src.data() + offsets[i], dst.data() + offsets[i], sizes[i]), -1) << "write " << i;
  }
  for (auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), total), -1);
  for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dst[total + i], 0xEE) << "guard byte " << i;

  std::set<uint64_t> cookies;
  for (int l = 0; l < 2; ++l) {
    TransportLane& lane = t->lane(l);
    EXPECT_EQ(lane.inFlight(), sizes.size() / 2);
    auto done = drain(lane);
    EXPECT_EQ(done.size(), sizes.size() / 2);
    for (auto& c : done) {
      EXPECT_EQ(c.status, Status::kOk);
      EXPECT_EQ(c.peer, 0);
      EXPECT_EQ(c.cookie % 2, static_cast<uint64_t>(l)) << "completion on the wrong lane";
      EXPECT_TRUE(cookies.insert(c.cookie).second) << "cookie " << c.cookie << " twice";
    }
    EXPECT_EQ(lane.inFlight(), 0u);
  }
  EXPECT_EQ(cookies.size(), sizes.size());
  EXPECT_EQ(*cookies.begin(), 500u);
  EXPECT_EQ(*cookies.rbegin(), 500u + sizes.size() - 1);
}

TEST(LoopbackTransport, CompletionsComeBackInPostOrderOnePerOp) {
  std::vector<unsigned char> src(4096), dst(4096, 0);
  std::vector<uint64_t> words(2, 0);
  test::fillRandom(src.data(), src.size(), 3);
  auto t = connected(1);
  addWindow(*t, kSrcWindow, src.data(), src.size());
  addWindow(*t, kDstWindow, dst.data(), dst.size());
  addWindow(*t, kWordWindow, words.data(), words.size() * 8);
  TransportLane& lane = t->lane(0);
  constexpr int kOps = 100;
  for (int i = 0; i < kOps; ++i) {
    if (i % 3 == 2)
      lane.postAtomic(atomicOp(8, SignalOp::kAdd, 1, 7000 + i));
    else
      lane.post(writeOp(i, 4096 - 1 - i, 1, i % 2 == 0, i, 7000 + i));
    EXPECT_EQ(lane.inFlight(), static_cast<size_t>(i + 1));
  }
  // A short poll returns the oldest ones; the rest stay.
  Completion some[7];
  ASSERT_EQ(lane.poll(some, 7), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(some[i].cookie, 7000u + i);
  EXPECT_EQ(lane.inFlight(), static_cast<size_t>(kOps - 7));
  auto rest = drain(lane);
  ASSERT_EQ(rest.size(), static_cast<size_t>(kOps - 7));
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].cookie, 7007u + i);
    EXPECT_EQ(rest[i].status, Status::kOk);
  }
  EXPECT_EQ(lane.inFlight(), 0u);
  EXPECT_EQ(lane.poll(some, 7), 0u);
  EXPECT_EQ(words[1], static_cast<uint64_t>(kOps / 3));
  for (int i = 0; i < kOps; ++i) {
    if (i % 3 != 2) {
      EXPECT_EQ(dst[4096 - 1 - i], src[i]) << "write " << i;
    }
  }
}

TEST(LoopbackTransport, AtomicsAddAndSetTheirWordOnlyAndFollowEarlierWrites) {
  std::vector<uint64_t> words(4, kPoison);
  std::vector<unsigned char> src(1 << 16), dst(1 << 16, 0);
  test::fillRandom(src.data(), src.size(), 5);
  auto t = connected(2);
  addWindow(*t, kSrcWindow, src.data(), src.size());
  addWindow(*t, kDstWindow, dst.data(), dst.size());
  addWindow(*t, kWordWindow, words.data(), words.size() * 8);
  std::vector<std::string> errors;
  t->setImmHandler([&](const RemoteWrite& w) {
    // An immediate posted after the set sees it performed.
    if (atomicLoad(&words[2], kAcquire) != w.imm) errors.push_back("imm " + std::to_string(w.imm) + " before its set");
  });

  TransportLane& lane = t->lane(0);
  lane.postAtomic(atomicOp(8, SignalOp::kSet, 0, 1));
  EXPECT_EQ(words[1], 0u);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t v = (i << 33) + 3 * i + 1;
    sum += v;
    lane.postAtomic(atomicOp(8, SignalOp::kAdd, v, 2 + i));
  }
  EXPECT_EQ(atomicLoad(&words[1], kAcquire), sum);
  lane.postAtomic(atomicOp(8, SignalOp::kAdd, ~0ull, 2000));  // wraps around like any 64-bit add
  EXPECT_EQ(atomicLoad(&words[1], kAcquire), sum - 1);

  // write, then set: whoever sees the set sees the write; then a write-with-imm that checks the set.
  for (uint32_t round = 1; round <= 5; ++round) {
    lane.post(writeOp(round * 100, round * 100, 10000, false, 0, 3000 + round));
    lane.postAtomic(atomicOp(16, SignalOp::kSet, round, 4000 + round));
    EXPECT_EQ(atomicLoad(&words[2], kAcquire), round);
    EXPECT_EQ(std::memcmp(src.data() + round * 100, dst.data() + round * 100, 10000), 0);
    lane.post(writeOp(0, 0, 64, true, round, 5000 + round));
  }
  for (auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(words[0], kPoison);
  EXPECT_EQ(words[3], kPoison);
  auto done = drain(lane);
  EXPECT_EQ(done.size(), 1u + 1000 + 1 + 3 * 5);
  for (auto& c : done) EXPECT_EQ(c.status, Status::kOk);

  // Two lanes on their own threads sum exactly.
  words[3] = 0;
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l)
    threads.emplace_back([&, l] {
      TransportLane& mine = t->lane(l);
      for (int i = 0; i < 20000; ++i) mine.postAtomic(atomicOp(24, SignalOp::kAdd, 1 + l, i));
      drain(mine);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(atomicLoad(&words[3], kAcquire), 60000u);
}

MessageOp messageOp(uint32_t bytes, uint64_t seed, uint64_t cookie) {
  MessageOp op;
  op.peer = 0;
  op.bytes = bytes;
  test::fillRandom(op.data, bytes, seed);
  op.cookie = cookie;
  return op;
}

// Each message is delivered from the posting thread, with its payload, once the writes posted before it (on this
// lane and the other) are in place; it gets one completion in post order like every op.
TEST(LoopbackTransport, MessagesFollowTheirWritesWithTheirPayloadAndOneCompletionEach) {
  constexpr size_t kWrites = 64, kSize = 1000;
  std::vector<unsigned char> src(kWrites * kSize), dst(kWrites * kSize, 0);
  test::fillRandom(src.data(), src.size(), 21);
  auto t = connected(2);
  std::vector<RemoteMessage> got;
  size_t inPlace = 0;  // bytes the latest message found in place
  t->setMessageHandler([&](const RemoteMessage& m) {
    got.push_back(m);
    inPlace = 0;
    while (inPlace < dst.size() && dst[inPlace] == src[inPlace]) ++inPlace;
  });
  addWindow(*t, kSrcWindow, src.data(), src.size());
  addWindow(*t, kDstWindow, dst.data(), dst.size());
  uint64_t cookie = 0;
  for (size_t i = 0; i < kWrites; ++i) {
    TransportLane& lane = t->lane(static_cast<int>(i % 2));
    lane.post(writeOp(i * kSize, i * kSize, kSize, false, 0, cookie++));
    const uint32_t bytes = static_cast<uint32_t>(1 + i % kMaxMessageBytes);  // 1..64
    const MessageOp m = messageOp(bytes, i, cookie++);
    lane.postMessage(m);
    ASSERT_EQ(got.size(), i + 1) << "message " << i << " was not delivered from post's thread";
    EXPECT_EQ(got[i].peer, 0);
    ASSERT_EQ(got[i].bytes, bytes);
    EXPECT_EQ(std::memcmp(got[i].data, m.data, bytes), 0) << "message " << i;
    EXPECT_GE(inPlace, (i + 1) * kSize) << "message " << i << " was delivered before its writes were in place";
  }
  for (int l = 0; l < 2; ++l) {
    TransportLane& lane = t->lane(l);
    EXPECT_EQ(lane.inFlight(), kWrites);
    auto done = drain(lane);
    ASSERT_EQ(done.size(), kWrites);
    for (size_t k = 0; k < done.size(); ++k) {
      // Lane l posted ops 4j + 2l (write) and 4j + 2l + 1 (message).
      EXPECT_EQ(done[k].cookie, 4 * (k / 2) + 2 * l + k % 2);
      EXPECT_EQ(done[k].status, Status::kOk);
    }
    EXPECT_EQ(lane.inFlight(), 0u);
  }
  EXPECT_EQ(got.size(), kWrites);
  EXPECT_EQ(test::firstMismatch(src.data(), dst.data(), src.size()), -1);

  // No handler: the message is dropped (with a warning), not failed.
  t->setMessageHandler(nullptr);
  t->lane(0).postMessage(messageOp(3, 1, 99));
  auto done = drain(t->lane(0));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);
  EXPECT_EQ(t->peerStatus(0), Status::kOk);
}

TEST(LoopbackTransport, EveryInvalidOpThrowsAndChangesNothing) {
  constexpr size_t kBytes = 4096;
  std::vector<unsigned char> src(kBytes), dst(kBytes, 0xCD);
  std::vector<uint64_t> words(4, kPoison);
  test::fillRandom(src.data(), kBytes, 9);
  auto t = makeLoopbackTransport();
  int announced = 0, delivered = 0;
  t->setImmHandler([&](const RemoteWrite&) { announced++; });
  t->setMessageHandler([&](const RemoteMessage&) { delivered++; });
  addWindow(*t, kSrcWindow, src.data(), kBytes);
  addWindow(*t, kDstWindow, dst.data(), kBytes);
  addWindow(*t, kWordWindow, words.data(), words.size() * 8);
  constexpr uint32_t kUnregistered = 9;  // known as a remote window, never registered locally
  t->addRemoteWindow(0, kUnregistered, kBytes, "");
  constexpr uint32_t kGpu = 10;  // a remote window that the key says is GPU memory
  t->addRemoteWindow(0, kGpu, kBytes, "loopback:10:4096:cuda");

  const WriteOp good = writeOp(0, 100, 200, true, 1, 77);
  const AtomicOp goodAtomic = atomicOp(8, SignalOp::kAdd, 1, 78);
  // Before connect() nothing is accepted.
  EXPECT_THROW(t->lane(0), Error);
  t->connect({t->localAddress()}, 1);
  TransportLane& lane = t->lane(0);

  std::vector<BadArgument<WriteOp>> writes = {
      {"unknown peer", [](WriteOp& o) { o.peer = 1; }, "unknown peer"},
      {"negative peer", [](WriteOp& o) { o.peer = -1; }, "unknown peer"},
      {"zero bytes", [](WriteOp& o) { o.bytes = 0; }, "zero-byte"},
      {"unknown local window", [](WriteOp& o) { o.localWindow = 42; }, "local window 42 is not registered"},
      {"local range past the end", [](WriteOp& o) { o.localOffset = kBytes - 199; }, "exceeds the window"},
      {"local offset overflowing", [](WriteOp& o) { o.localOffset = ~0ull - 10; }, "exceeds the window"},
      {"unknown remote window", [](WriteOp& o) { o.remoteWindow = 42; }, "remote window 42 of peer 0 is not known"},
      {"remote range past the end", [](WriteOp& o) { o.remoteOffset = kBytes - 199; }, "exceeds the window"},
      {"remote size past the end", [](WriteOp& o) { o.bytes = kBytes + 1; }, "exceeds the window"},
      {"remote offset overflowing", [](WriteOp& o) { o.remoteOffset = ~0ull; }, "exceeds the window"},
      {"remote window not registered", [](WriteOp& o) { o.remoteWindow = kUnregistered; }, "is not registered here"},
  };
  expectInvalidArguments<WriteOp>(good, writes, [&](const WriteOp& op) { lane.post(op); });

  std::vector<BadArgument<AtomicOp>> atomics = {
      {"unknown peer", [](AtomicOp& o) { o.peer = 1; }, "unknown peer"},
      {"unknown kind", [](AtomicOp& o) { o.kind = static_cast<SignalOp>(7); }, "unknown atomic kind"},
      {"unaligned offset", [](AtomicOp& o) { o.remoteOffset = 4; }, "not 8-byte aligned"},
      {"unknown window", [](AtomicOp& o) { o.remoteWindow = 42; }, "is not known"},
      {"past the end", [](AtomicOp& o) { o.remoteOffset = 32; }, "exceeds the window"},
      {"overflowing offset", [](AtomicOp& o) { o.remoteOffset = ~0ull - 7; }, "exceeds the window"},
      {"not registered", [](AtomicOp& o) { o.remoteWindow = kUnregistered; }, "is not registered here"},
      {"GPU window", [](AtomicOp& o) { o.remoteWindow = kGpu; }, "atomics on GPU windows are not supported"},
  };
  expectInvalidArguments<AtomicOp>(goodAtomic, atomics, [&](const AtomicOp& op) { lane.postAtomic(op); });

  std::vector<BadArgument<MessageOp>> messages = {
      {"unknown peer", [](MessageOp& o) { o.peer = 1; }, "unknown peer"},
      {"negative peer", [](MessageOp& o) { o.peer = -1; }, "unknown peer"},
      {"empty", [](MessageOp& o) { o.bytes = 0; }, "0 bytes"},
      {"too long", [](MessageOp& o) { o.bytes = 65; }, "65 bytes"},
  };
  expectInvalidArguments<MessageOp>(messageOp(8, 1, 79), messages, [&](const MessageOp& op) { lane.postMessage(op); });

  // Nothing happened: no data, no word, no announcement, no message, no completion.
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(dst[i], 0xCD) << "byte " << i;
  for (uint64_t w : words) EXPECT_EQ(w, kPoison);
  EXPECT_EQ(announced, 0);
  EXPECT_EQ(delivered, 0);
  EXPECT_EQ(lane.inFlight(), 0u);
  EXPECT_TRUE(drain(lane).empty());

  // The good ones still work afterwards.
  lane.post(good);
  lane.postAtomic(goodAtomic);
  EXPECT_EQ(std::memcmp(dst.data() + 100, src.data(), 200), 0);
  EXPECT_EQ(words[1], kPoison + 1);
  EXPECT_EQ(announced, 1);
  auto done = drain(lane);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].cookie, 77u);
  EXPECT_EQ(done[1].cookie, 78u);

  // A deregistered window is gone for local and remote use alike.
  t->deregisterWindow(kDstWindow);
  EXPECT_THROW(lane.post(good), Error);
  EXPECT_THROW(t->deregisterWindow(kDstWindow), Error);
  EXPECT_TRUE(drain(lane).empty());
}

TEST(LoopbackTransport, RejectsBadSetupAndWindows) {
  char buf[64];
  auto t = makeLoopbackTransport();
  const std::string self = t->localAddress();
  EXPECT_NE(self, makeLoopbackTransport()->localAddress()) << "two transports share an address";
  try {
    t->registerWindow(3, buf, sizeof buf, MemoryKind::kCuda);  // host memory is never a GPU window
    ADD_FAILURE() << "host memory accepted as a CUDA window";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  EXPECT_THROW(t->registerWindow(4, nullptr, 8, MemoryKind::kHost), Error);
  EXPECT_THROW(t->registerWindow(4, buf, 8, static_cast<MemoryKind>(9)), Error);
  t->registerWindow(3, buf, sizeof buf, MemoryKind::kHost);
  EXPECT_THROW(t->registerWindow(3, buf, sizeof buf, MemoryKind::kHost), Error);
  EXPECT_THROW(t->addRemoteWindow(1, 3, sizeof buf, ""), Error);
  EXPECT_THROW(t->addRemoteWindow(0, 3, sizeof buf, "loopback:3:65"), Error);
  EXPECT_THROW(t->addRemoteWindow(0, 3, sizeof buf, "tcp:3:64"), Error);
  t->addRemoteWindow(0, 3, sizeof buf, "loopback:3:64");

  EXPECT_THROW(t->connect({}, 1), Error);
  EXPECT_THROW(t->connect({self, self}, 1), Error);
  EXPECT_THROW(t->connect({"127.0.0.1:1234"}, 1), Error);
  EXPECT_THROW(t->connect({self}, 0), Error);
  EXPECT_THROW(t->connect({self}, 1025), Error);
  EXPECT_EQ(t->numLanes(), 0);
  t->connect({self}, 3);
  EXPECT_EQ(t->numLanes(), 3);
  EXPECT_THROW(t->connect({self}, 3), Error);
  EXPECT_THROW(t->lane(3), Error);
  EXPECT_THROW(t->lane(-1), Error);
  EXPECT_NO_THROW(t->lane(2));

  LoopbackTransportOptions zero;
  zero.timeoutNs = 0;
  EXPECT_THROW(makeLoopbackTransport(zero), Error);
  setenv("GDX_TIMEOUT_MS", "1234", 1);
  EXPECT_EQ(LoopbackTransportOptions::fromEnv().timeoutNs, 1234ull * 1000000);
  unsetenv("GDX_TIMEOUT_MS");
}

TEST(LoopbackTransport, PeerIsHealthyUntilShutdownThenOpsCompleteWithShutdown) {
  std::vector<unsigned char> src(256), dst(256, 0);
  std::vector<uint64_t> words(1, 5);
  test::fillRandom(src.data(), src.size(), 1);
  auto t = connected(1);
  int announced = 0, failures = 0;
  t->setImmHandler([&](const RemoteWrite& w) {
    announced++;
    if (w.imm == 13) throw std::runtime_error("handler trouble");
  });
  t->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  addWindow(*t, kSrcWindow, src.data(), src.size());
  addWindow(*t, kDstWindow, dst.data(), dst.size());
  addWindow(*t, kWordWindow, words.data(), 8);
  EXPECT_EQ(t->peerStatus(0), Status::kOk);
  EXPECT_EQ(t->peerStatus(1), Status::kInvalidArgument);
  EXPECT_EQ(t->peerStatus(-1), Status::kInvalidArgument);

  TransportLane& lane = t->lane(0);
  lane.post(writeOp(0, 0, 16, true, 13, 1));  // a throwing handler is logged; the write still succeeds
  EXPECT_EQ(announced, 1);
  auto done = drain(lane);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);

  t->shutdown();
  t->shutdown();  // idempotent
  EXPECT_EQ(t->peerStatus(0), Status::kShutdown);
  lane.post(writeOp(16, 16, 16, true, 1, 2));
  lane.postAtomic(atomicOp(0, SignalOp::kAdd, 1, 3));
  EXPECT_THROW(lane.post(writeOp(0, 0, 0, false, 0, 4)), Error);  // still validated first
  EXPECT_THROW(lane.postMessage(messageOp(0, 0, 5)), Error);
  done = drain(lane);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].cookie, 2u);
  EXPECT_EQ(done[0].status, Status::kShutdown);
  EXPECT_EQ(done[1].cookie, 3u);
  EXPECT_EQ(done[1].status, Status::kShutdown);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(dst[i], 0) << "byte " << i << " written after shutdown";
  EXPECT_EQ(words[0], 5u);
  EXPECT_EQ(announced, 1);
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace gdx
