// Control messages of the TCP transport: between two processes, thousands of writes spread over several sockets
// interleaved with messages that must arrive in order, intact, and only after every byte written before them is in
// place; messages to oneself; argument checking that sends nothing; a message with no handler set. Malformed
// message frames on the wire are covered by tcp_protocol_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "gdx/error.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using test::waitFor;

constexpr uint32_t kSrcWindow = 1;
constexpr uint32_t kDstWindow = 2;
constexpr uint64_t kDataSeed = 2024;

/// FNV-1a over `n` bytes: the sender's checksum of the data written before a message.
uint64_t checksum(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/// What the first bytes of every message say: its number, the range written since the previous message, and that
/// range's checksum. The rest of the message (up to its length) is filler derived from the number.
struct Stamp {
  uint64_t seq;
  uint64_t begin;
  uint64_t end;
  uint64_t sum;
};
static_assert(sizeof(Stamp) == 32);

/// 32..64 bytes.
uint32_t messageBytes(uint64_t seq) {
  return sizeof(Stamp) + static_cast<uint32_t>(seq % 33);
}
uint8_t filler(uint64_t seq, size_t i) {
  return static_cast<uint8_t>(seq * 31 + i * 7 + 1);
}

/// The same writes and messages in every process: writes of random sizes packed back to back (so none rewrites
/// another), and after some of them a message.
struct Plan {
  std::vector<uint64_t> sizes;
  std::vector<bool> messageAfter;  ///< per write
  uint64_t total = 0;
  size_t messages = 0;

  Plan(size_t writes, uint64_t maxWrite, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < writes; ++i) {
      sizes.push_back(1 + rng() % maxWrite);
      total += sizes.back();
      bool message = rng() % 4 == 0 || i + 1 == writes;
      messageAfter.push_back(message);
      messages += message;
    }
  }
};

/// Posts the plan's writes from `src` and its messages on `lane` to `peer`; returns how many ops it posted.
size_t postPlan(TransportLane& lane, int peer, const Plan& plan, const std::vector<unsigned char>& src) {
  size_t posted = 0;
  uint64_t offset = 0, begin = 0, seq = 0;
  for (size_t i = 0; i < plan.sizes.size(); ++i) {
    lane.post(WriteOp{peer, kSrcWindow, offset, kDstWindow, offset, plan.sizes[i], false, 0, posted++});
    offset += plan.sizes[i];
    if (!plan.messageAfter[i]) continue;
    MessageOp m;
    m.peer = peer;
    m.bytes = messageBytes(seq);
    m.cookie = posted++;
    Stamp stamp{seq, begin, offset, checksum(src.data() + begin, offset - begin)};
    std::memcpy(m.data, &stamp, sizeof stamp);
    for (size_t k = sizeof stamp; k < m.bytes; ++k) m.data[k] = filler(seq, k);
    lane.postMessage(m);
    begin = offset;
    ++seq;
  }
  return posted;
}

/// The receiving side: checks each message as it is delivered against `expected` (what the sender's source holds).
class OrderChecker {
 public:
  OrderChecker(int sender, const std::vector<unsigned char>& expected, const std::vector<unsigned char>& dst)
      : sender_(sender), expected_(expected), dst_(dst) {}

  void onMessage(const RemoteMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    Stamp s{};
    if (m.bytes >= sizeof s) std::memcpy(&s, m.data, sizeof s);
    std::string bad;
    if (m.peer != sender_ || m.bytes != messageBytes(next_) || s.seq != next_) {
      bad = "message from peer " + std::to_string(m.peer) + " of " + std::to_string(m.bytes) + " bytes numbered " +
            std::to_string(s.seq) + " where #" + std::to_string(next_) + " was due";
    } else if (s.begin != end_ || s.end < s.begin || s.end > expected_.size()) {
      bad = "message #" + std::to_string(s.seq) + " covers [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
            ") after [.., " + std::to_string(end_) + ")";
    } else if (s.sum != checksum(expected_.data() + s.begin, s.end - s.begin)) {
      bad = "message #" + std::to_string(s.seq) + " carries a wrong checksum";
    } else if (long long at = test::firstMismatch(expected_.data() + s.begin, dst_.data() + s.begin, s.end - s.begin);
               at >= 0) {
      bad = "message #" + std::to_string(s.seq) + " delivered before byte " + std::to_string(s.begin + at) +
            " written before it was in place";
    } else {
      for (size_t k = sizeof s; k < m.bytes && bad.empty(); ++k)
        if (m.data[k] != filler(s.seq, k)) bad = "message #" + std::to_string(s.seq) + " byte " + std::to_string(k);
    }
    if (!bad.empty()) errors_.push_back(bad);
    end_ = s.end;
    ++next_;
    delivered_.fetch_add(1);
  }
  size_t delivered() const { return delivered_.load(); }
  std::vector<std::string> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  const int sender_;
  const std::vector<unsigned char>& expected_;
  const std::vector<unsigned char>& dst_;
  std::mutex mu_;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  std::vector<std::string> errors_;
  std::atomic<size_t> delivered_{0};
};

/// Source data of the plan and the destination, every byte of which starts different from what must land there.
void prepare(const Plan& plan, std::vector<unsigned char>& expected, std::vector<unsigned char>& dst) {
  expected.resize(plan.total);
  test::fillRandom(expected.data(), expected.size(), kDataSeed);
  dst.resize(plan.total);
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = expected[i] ^ 0x5A;
}

/// Every op completed once, successfully.
std::string checkCompletions(const std::vector<Completion>& done, size_t posted, int peer) {
  std::set<uint64_t> cookies;
  for (auto& c : done) {
    if (c.status != Status::kOk || c.peer != peer) return "cookie " + std::to_string(c.cookie) + " failed";
    cookies.insert(c.cookie);
  }
  if (done.size() != posted || cookies.size() != posted)
    return std::to_string(done.size()) + " completions (" + std::to_string(cookies.size()) + " distinct) for " +
           std::to_string(posted) + " ops";
  return "";
}

// Rank 0 writes, rank 1 receives. Writes of up to 5 chunks go round-robin over 4 sockets and each message on the
// next socket in turn, so a message regularly overtakes the chunks before it unless the receiver holds it back.
int orderedRank(int rank) {
  constexpr size_t kChunk = 8 << 10;
  const Plan plan(4000, 5 * kChunk, 11);
  Bootstrap boot(BootstrapConfig::fromEnv());
  auto t = makeTcpTransport(test::tcpOptions(rank, 2, 4, kChunk, 20000));
  std::vector<unsigned char> expected, dst;
  prepare(plan, expected, dst);
  OrderChecker checker(0, expected, dst);
  std::atomic<int> failures{0};
  t->setPeerFailureHandler([&](int peer, const std::string& why) {
    std::fprintf(stderr, "rank %d: peer %d failed: %s\n", rank, peer, why.c_str());
    failures++;
  });
  t->setMessageHandler([&](const RemoteMessage& m) { checker.onMessage(m); });
  std::string key;
  if (rank == 0)
    t->registerWindow(kSrcWindow, expected.data(), expected.size(), MemoryKind::kHost);
  else
    key = t->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost);
  std::vector<std::string> keys = boot.allGather(key);
  if (rank == 0) t->addRemoteWindow(1, kDstWindow, plan.total, keys[1]);
  t->connect(boot.allGather(t->localAddress()), 1);

  int rc = 0;
  if (rank == 0) {
    TransportLane& lane = t->lane(0);
    const size_t posted = postPlan(lane, 1, plan, expected);
    std::string bad = checkCompletions(test::pollCompletions(lane, posted, 60000), posted, 1);
    if (!bad.empty()) std::fprintf(stderr, "rank 0: %s\n", bad.c_str()), rc = 2;
    if (lane.inFlight() != 0) std::fprintf(stderr, "rank 0: %zu ops still in flight\n", lane.inFlight()), rc = 3;
  } else {
    if (!waitFor([&] { return checker.delivered() >= plan.messages; }, 60000))
      std::fprintf(stderr, "rank 1: %zu of %zu messages delivered\n", checker.delivered(), plan.messages), rc = 4;
    for (auto& e : checker.errors()) std::fprintf(stderr, "rank 1: %s\n", e.c_str()), rc = 5;
    if (long long at = test::firstMismatch(expected.data(), dst.data(), dst.size()); at >= 0)
      std::fprintf(stderr, "rank 1: byte %lld differs at the end\n", at), rc = 6;
  }
  if (checker.delivered() != (rank == 1 ? plan.messages : 0)) rc = rc ? rc : 7;
  boot.barrier();  // neither leaves while the other still checks
  t->shutdown();
  if (failures.load() != 0) rc = rc ? rc : 8;
  return rc;
}

TEST(TcpMessage, MessagesArriveInOrderIntactAndOnlyAfterEveryEarlierWriteBetweenTwoProcesses) {
  std::vector<int> codes = test::runRanks(2, orderedRank, 180);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A message to oneself travels through one's own listener like a write to oneself, in a world of one and of two.
TEST(TcpMessage, MessagesToSelfFollowTheWritesBeforeThem) {
  constexpr size_t kChunk = 4 << 10;
  const Plan plan(400, 3 * kChunk, 12);
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const int self = world - 1;
    std::vector<unsigned char> expected, dst;
    prepare(plan, expected, dst);
    OrderChecker checker(self, expected, dst);
    auto t = test::tcpWorld(world, 3, kChunk);
    t[self]->setMessageHandler([&](const RemoteMessage& m) { checker.onMessage(m); });
    t[self]->registerWindow(kSrcWindow, expected.data(), expected.size(), MemoryKind::kHost);
    t[self]->addRemoteWindow(self, kDstWindow, plan.total,
                             t[self]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
    test::connectAll(t, 1);
    TransportLane& lane = t[self]->lane(0);
    const size_t posted = postPlan(lane, self, plan, expected);
    EXPECT_EQ(checkCompletions(test::pollCompletions(lane, posted, 20000), posted, self), "");
    ASSERT_TRUE(waitFor([&] { return checker.delivered() >= plan.messages; }, 20000)) << checker.delivered();
    for (auto& e : checker.errors()) ADD_FAILURE() << e;
    EXPECT_EQ(test::firstMismatch(expected.data(), dst.data(), dst.size()), -1);
    for (auto& x : t) x->shutdown();
  }
}

TEST(TcpMessage, InvalidMessagesThrowBeforeAnythingIsSent) {
  auto t = test::tcpWorld(2, 2, 4096);
  std::mutex mu;
  std::vector<RemoteMessage> got;
  t[1]->setMessageHandler([&](const RemoteMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(m);
  });
  test::connectAll(t, 1);
  TransportLane& lane = t[0]->lane(0);

  MessageOp good;
  good.peer = 1;
  good.bytes = kMaxMessageBytes;
  test::fillRandom(good.data, sizeof good.data, 5);
  good.cookie = 1;
  test::expectInvalidArguments<MessageOp>(good,
                                          {
                                              {"empty", [](MessageOp& o) { o.bytes = 0; }, "0 bytes"},
                                              {"one byte too long", [](MessageOp& o) { o.bytes = 65; }, "65 bytes"},
                                              {"far too long", [](MessageOp& o) { o.bytes = 1u << 31; }, "bytes"},
                                              {"negative peer", [](MessageOp& o) { o.peer = -1; }, "peer -1"},
                                              {"peer past the world", [](MessageOp& o) { o.peer = 2; }, "unknown peer"},
                                          },
                                          [&](const MessageOp& o) { lane.postMessage(o); });
  EXPECT_EQ(lane.inFlight(), 0u);
  Completion c;
  EXPECT_EQ(lane.poll(&c, 1), 0u);

  // Nothing went out: the valid message that follows is the first of the direction, delivered whole.
  lane.postMessage(good);
  EXPECT_EQ(lane.inFlight(), 1u);
  auto done = test::pollCompletions(lane, 1, 5000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);
  EXPECT_EQ(done[0].cookie, 1u);
  EXPECT_EQ(lane.inFlight(), 0u);
  ASSERT_TRUE(waitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return !got.empty();
      },
      5000));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].peer, 0);
  EXPECT_EQ(got[0].bytes, kMaxMessageBytes);
  EXPECT_EQ(std::memcmp(got[0].data, good.data, kMaxMessageBytes), 0);
  EXPECT_EQ(t[0]->peerStatus(1), Status::kOk);
  EXPECT_EQ(t[1]->peerStatus(0), Status::kOk);
}

// Without a handler a message is dropped (with a warning); it is not a failure, and what follows still works.
TEST(TcpMessage, AMessageWithNoHandlerIsDroppedWithoutFailingThePeer) {
  auto t = test::tcpWorld(2, 1, 4096);
  std::atomic<int> announced{0}, failures{0};
  std::vector<unsigned char> src(16, 3), dst(16, 0);
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  for (auto& x : t) x->setPeerFailureHandler([&](int, const std::string&) { failures++; });
  t[0]->registerWindow(kSrcWindow, src.data(), src.size(), MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, dst.size(),
                        t[1]->registerWindow(kDstWindow, dst.data(), dst.size(), MemoryKind::kHost));
  test::connectAll(t, 1);
  TransportLane& lane = t[0]->lane(0);
  MessageOp m;
  m.peer = 1;
  m.bytes = 1;
  m.cookie = 1;
  lane.postMessage(m);
  lane.post(WriteOp{1, kSrcWindow, 0, kDstWindow, 0, src.size(), true, 9, 2});
  auto done = test::pollCompletions(lane, 2, 5000);
  ASSERT_EQ(done.size(), 2u);
  for (auto& c : done) EXPECT_EQ(c.status, Status::kOk);
  ASSERT_TRUE(waitFor([&] { return announced.load() == 1; }, 5000));
  EXPECT_EQ(dst, src);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t[1]->peerStatus(0), Status::kOk);
}

}  // namespace
}  // namespace gdx
