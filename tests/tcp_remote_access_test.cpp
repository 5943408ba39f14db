// Transport::setRemoteAccess() on the TCP transport, between two real transports over loopback: a window a peer may
// not write (kNone: memory registered only as the source of this side's writes) refuses every write, one that takes
// only writes with an immediate (kImmediateWrites: the p2p eager buffer) refuses the others, and a refused write fails
// the peer that sent it (named by the receiver) and changes no byte of the window (compared whole). Allowed writes
// land as always, and kWrite makes a window writable again. The writer fails with the receiver's reason (a refusal
// comes before the connections close), not with a closed connection.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
constexpr size_t kBytes = 64 << 10;
constexpr unsigned char kGuard = 0xCD;

/// Rank 0 writes `bytes` random bytes (with an immediate or not) into rank 1's window of `access`; whether rank 1
/// let it land. Every byte of the window is compared: the write's range holds the data, or nothing changed.
bool writeLands(RemoteAccess access, bool withImm, size_t bytes = 4096, RemoteAccess after = RemoteAccess::kNone,
                bool reopen = false) {
  auto t = tcpWorld(2, 2, 4096, 5000);
  std::vector<unsigned char> src(kBytes), dst(kBytes, kGuard), before(kBytes, kGuard);
  test::fillRandom(src.data(), kBytes, 31 + static_cast<int>(access) * 2 + withImm);
  std::atomic<int> announced{0};
  t[1]->setImmHandler([&](const RemoteWrite&) { announced++; });
  std::mutex mutex;
  std::string writerHeard;  // why rank 0 failed rank 1, if it did
  t[0]->setPeerFailureHandler([&](int, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    writerHeard = why;
  });
  t[0]->registerWindow(kSrcWindow, src.data(), kBytes, MemoryKind::kHost);
  t[0]->addRemoteWindow(1, kDstWindow, kBytes, t[1]->registerWindow(kDstWindow, dst.data(), kBytes, MemoryKind::kHost));
  t[1]->setRemoteAccess(kDstWindow, access);
  if (reopen) t[1]->setRemoteAccess(kDstWindow, after);
  connectAll(t, 2);
  WriteOp op{1, kSrcWindow, 0, kDstWindow, 8192, bytes, withImm, 5, 7};
  t[0]->lane(0).post(op);
  // Landed: its completion (and its immediate) came, and the data is in place. Refused: rank 1 fails rank 0.
  const bool ended = waitFor(
      [&] {
        return t[1]->peerStatus(0) != Status::kOk ||
               (std::memcmp(dst.data() + 8192, src.data(), bytes) == 0 && (!withImm || announced.load() == 1));
      },
      10000);
  const Status peer = t[1]->peerStatus(0);
  const bool landed = peer == Status::kOk && std::memcmp(dst.data() + 8192, src.data(), bytes) == 0;
  std::memcpy(before.data() + 8192, src.data(), landed ? bytes : 0);
  const long long changed = test::firstMismatch(dst.data(), before.data(), kBytes);
  std::fprintf(stderr,
               "access %d, immediate %d: ended %d, rank 1 sees rank 0 as %s, landed %d, first wrong byte %lld\n",
               static_cast<int>(access), withImm, ended, statusName(peer), landed, changed);
  EXPECT_TRUE(ended);
  EXPECT_EQ(changed, -1);
  if (!landed) {  // the writer is told why, not only that the connection closed
    EXPECT_TRUE(waitFor(
        [&] {
          std::lock_guard<std::mutex> lock(mutex);
          return !writerHeard.empty();
        },
        10000));
    std::lock_guard<std::mutex> lock(mutex);
    std::fprintf(stderr, "the writer heard: %s\n", writerHeard.c_str());
    EXPECT_NE(writerHeard.find("refused what this side sent"), std::string::npos) << writerHeard;
    EXPECT_NE(writerHeard.find("peers may not write there"), std::string::npos) << writerHeard;
  }
  return landed;
}

TEST(TcpRemoteAccess, AWindowPeersMayNotWriteRefusesEveryWrite) {
  EXPECT_FALSE(writeLands(RemoteAccess::kNone, false));
  EXPECT_FALSE(writeLands(RemoteAccess::kNone, true));
}

TEST(TcpRemoteAccess, AWindowOfImmediateWritesRefusesTheOthers) {
  EXPECT_FALSE(writeLands(RemoteAccess::kImmediateWrites, false));
  EXPECT_TRUE(writeLands(RemoteAccess::kImmediateWrites, true));
}

TEST(TcpRemoteAccess, WritableWindowsTakeEveryWriteAndAccessCanBeWidenedAgain) {
  EXPECT_TRUE(writeLands(RemoteAccess::kWrite, false, 40000));
  EXPECT_TRUE(writeLands(RemoteAccess::kNone, false, 4096, RemoteAccess::kWrite, true));
}

/// Ranks whose chunk sizes differ (GDX_TCP_CHUNK): both sides' connect() fail at once, each naming the mismatch and
/// both settings, not the accepting side with a timeout.
TEST(TcpRemoteAccess, RanksWithMismatchedSettingsBothFailWithTheReasonBeforeTheTimeout) {
  std::vector<std::unique_ptr<Transport>> t;
  t.push_back(makeTcpTransport(test::tcpOptions(0, 2, 2, 1 << 20, 10000)));
  t.push_back(makeTcpTransport(test::tcpOptions(1, 2, 2, 4096, 10000)));
  std::vector<std::string> addresses{t[0]->localAddress(), t[1]->localAddress()};
  std::string why[2];
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        t[r]->connect(addresses, 1);
      } catch (const Error& e) {
        why[r] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) std::fprintf(stderr, "rank %d: %s\n", r, why[r].c_str());
  std::fprintf(stderr, "both ended within %.2f s\n", took);
  EXPECT_LT(took, 5.0);
  for (int r = 0; r < 2; ++r) EXPECT_NE(why[r].find("chunk size exceeds"), std::string::npos) << why[r];
  EXPECT_NE(why[1].find("1048576-byte chunks"), std::string::npos) << why[1];
}

}  // namespace
}  // namespace gdx
