// The TCP transport between real processes when one of them goes away: killed mid-transfer (a failure the
// survivor must notice within its timeout) or shut down cleanly (not a failure).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "gdx/device/impl/clock.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

constexpr uint32_t kSrc = 1, kDst = 2;
constexpr size_t kBytes = 16 << 20;
constexpr int kTimeoutMs = 3000;

/// A pair of pipes over which parent and child swap their transport addresses.
struct Channel {
  int toChild[2], toParent[2];
  Channel() {
    EXPECT_EQ(::pipe(toChild), 0);
    EXPECT_EQ(::pipe(toParent), 0);
  }
  ~Channel() {
    for (int fd : {toChild[0], toChild[1], toParent[0], toParent[1]}) ::close(fd);
  }
  static void put(int fd, const std::string& s) {
    std::string line = s + "\n";
    [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());
  }
  static std::string get(int fd, int timeoutMs = 20000) {
    std::string s;
    char c;
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, timeoutMs) <= 0 || ::read(fd, &c, 1) != 1) return s;
      if (c == '\n') return s;
      s += c;
    }
  }
};

/// Rank 1 in the child: connects to the parent, announces "ready", then runs `after`.
int childRank1(Channel& ch, const std::function<int(Transport&)>& after) {
  auto t = makeTcpTransport(test::tcpOptions(1, 2, 4, 256 << 10, kTimeoutMs));
  std::vector<char> dst(kBytes);
  t->registerWindow(kDst, dst.data(), dst.size(), MemoryKind::kHost);
  std::atomic<int> announced{0};
  t->setImmHandler([&](const RemoteWrite&) { announced++; });
  Channel::put(ch.toParent[1], t->localAddress());
  std::string rank0 = Channel::get(ch.toChild[0]);
  t->connect({rank0, t->localAddress()}, 1);
  Channel::put(ch.toParent[1], "ready");
  // Waits (bounded) for the parent's write with an immediate before the next step.
  if (!test::waitFor([&] { return announced.load() > 0; }, 20000)) return 3;
  return after(*t);
}

struct Parent {
  std::unique_ptr<Transport> t;
  std::vector<char> src = std::vector<char>(kBytes);
  std::mutex mu;
  std::vector<std::pair<int, std::string>> failures;
  uint64_t failedAtNs = 0;

  void connect(Channel& ch) {
    t = makeTcpTransport(test::tcpOptions(0, 2, 4, 256 << 10, kTimeoutMs));
    t->setPeerFailureHandler([this](int peer, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      failures.emplace_back(peer, why);
      failedAtNs = nowNs();
    });
    test::fillRandom(src.data(), src.size(), 1);
    t->registerWindow(kSrc, src.data(), src.size(), MemoryKind::kHost);
    t->addRemoteWindow(1, kDst, kBytes, "");
    std::string rank1 = Channel::get(ch.toParent[0]);
    Channel::put(ch.toChild[1], t->localAddress());
    t->connect({t->localAddress(), rank1}, 1);
    ASSERT_EQ(Channel::get(ch.toParent[0]), "ready");
  }
};

TEST(TcpFailure, PeerKilledMidTransferIsReportedWithinTheTimeout) {
  Channel ch;
  pid_t child = test::forkChild([&] {
    return childRank1(ch, [](Transport&) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // killed long before
      return 4;
    });
  });
  Parent parent;
  parent.connect(ch);
  if (HasFailure()) {
    ::kill(child, SIGKILL);
    test::waitChild(child, 10);
    return;
  }

  TransportLane& lane = parent.t->lane(0);
  uint64_t posted = 0, ok = 0, failed = 0, killedAtNs = 0;
  Completion done[16];
  const uint64_t hardStop = nowNs() + 15000000000ull;
  while (nowNs() < hardStop) {
    while (lane.inFlight() < 4 && failed == 0)
      lane.post(WriteOp{1, kSrc, 0, kDst, 0, kBytes, true, static_cast<uint32_t>(posted), posted}), ++posted;
    size_t n = lane.poll(done, 16);
    for (size_t i = 0; i < n; ++i) {
      if (done[i].status == Status::kOk)
        ++ok;
      else {
        EXPECT_EQ(done[i].status, Status::kPeerFailed);
        EXPECT_EQ(done[i].peer, 1);
        ++failed;
      }
    }
    if (killedAtNs == 0 && ok >= 3) {
      ::kill(child, SIGKILL);  // mid-transfer: four 16 MiB writes are outstanding
      killedAtNs = nowNs();
    }
    if (failed > 0 && lane.inFlight() == 0) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(test::waitChild(child, 10), 128 + SIGKILL);
  ASSERT_NE(killedAtNs, 0u) << "the transfer never got going";
  EXPECT_GT(failed, 0u) << "no kPeerFailed completion after the kill";
  EXPECT_EQ(lane.inFlight(), 0u) << "writes to the dead peer never completed";
  EXPECT_EQ(parent.t->peerStatus(1), Status::kPeerFailed);
  EXPECT_EQ(parent.t->peerStatus(0), Status::kOk);
  {
    std::lock_guard<std::mutex> lock(parent.mu);
    ASSERT_EQ(parent.failures.size(), 1u);
    EXPECT_EQ(parent.failures[0].first, 1);
    EXPECT_NE(parent.failures[0].second.find("peer 1"), std::string::npos) << parent.failures[0].second;
    EXPECT_LT(parent.failedAtNs - killedAtNs, static_cast<uint64_t>(kTimeoutMs) * 1000000ull);
  }
  // Later writes to the dead peer complete with kPeerFailed; they do not throw.
  lane.post(WriteOp{1, kSrc, 0, kDst, 0, 100, false, 0, 777});
  auto later = test::pollCompletions(lane, 1, 5000);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].status, Status::kPeerFailed);
  uint64_t t0 = nowNs();
  parent.t->shutdown();
  EXPECT_LT(nowNs() - t0, 2 * static_cast<uint64_t>(kTimeoutMs) * 1000000ull) << "shutdown took too long";
}

TEST(TcpFailure, PeerThatStopsReadingFailsAfterTheTimeout) {
  Channel ch;
  pid_t child = test::forkChild([&] {
    return childRank1(ch, [](Transport&) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // stopped, then killed, long before
      return 4;
    });
  });
  Parent parent;
  parent.connect(ch);
  if (HasFailure()) {
    ::kill(child, SIGKILL);
    test::waitChild(child, 10);
    return;
  }
  TransportLane& lane = parent.t->lane(0);
  lane.post(WriteOp{1, kSrc, 0, kDst, 0, kBytes, true, 0, 0});
  ASSERT_EQ(test::pollCompletions(lane, 1, 10000).size(), 1u);
  // The peer is alive (its sockets stay open) but takes nothing: only the progress timeout can tell.
  ::kill(child, SIGSTOP);
  const uint64_t stoppedAtNs = nowNs();
  uint64_t posted = 1, failed = 0;
  Completion done[16];
  while (nowNs() - stoppedAtNs < 4ull * kTimeoutMs * 1000000ull && failed == 0) {
    while (lane.inFlight() < 4) lane.post(WriteOp{1, kSrc, 0, kDst, 0, kBytes, false, 0, posted++});
    size_t n = lane.poll(done, 16);
    for (size_t i = 0; i < n; ++i) failed += done[i].status == Status::kPeerFailed;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const uint64_t detectedNs = nowNs() - stoppedAtNs;
  ::kill(child, SIGKILL);
  EXPECT_EQ(test::waitChild(child, 10), 128 + SIGKILL);
  EXPECT_GT(failed, 0u) << "a peer that stopped reading was never failed";
  EXPECT_LT(detectedNs, 2ull * kTimeoutMs * 1000000ull);
  EXPECT_EQ(parent.t->peerStatus(1), Status::kPeerFailed);
  std::lock_guard<std::mutex> lock(parent.mu);
  ASSERT_EQ(parent.failures.size(), 1u);
  EXPECT_NE(parent.failures[0].second.find("no progress"), std::string::npos) << parent.failures[0].second;
}

TEST(TcpFailure, PeerShuttingDownCleanlyIsNotAFailure) {
  Channel ch;
  pid_t child = test::forkChild([&] {
    return childRank1(ch, [](Transport& t) {
      t.shutdown();
      return 0;
    });
  });
  Parent parent;
  parent.connect(ch);
  if (HasFailure()) {
    ::kill(child, SIGKILL);
    test::waitChild(child, 10);
    return;
  }
  TransportLane& lane = parent.t->lane(0);
  lane.post(WriteOp{1, kSrc, 0, kDst, 0, kBytes, true, 1, 1});
  auto first = test::pollCompletions(lane, 1, 10000);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].status, Status::kOk);
  EXPECT_EQ(test::waitChild(child, 20), 0);
  ASSERT_TRUE(test::waitFor([&] { return parent.t->peerStatus(1) == Status::kShutdown; }, 5000));
  lane.post(WriteOp{1, kSrc, 0, kDst, 0, 100, false, 0, 2});
  auto later = test::pollCompletions(lane, 1, 5000);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_NE(later[0].status, Status::kOk);
  parent.t->shutdown();
  std::lock_guard<std::mutex> lock(parent.mu);
  EXPECT_TRUE(parent.failures.empty()) << parent.failures[0].second;
}

}  // namespace
}  // namespace gdx
