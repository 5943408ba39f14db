// GDX_FAULT over the TCP transport, two real processes: rank 0 sends ten 4 KiB putWithSignals to rank 1 with its
// third operation to rank 1 dropped, delayed, corrupted or replaced by closing the connection; each fault must end in
// the documented outcome on both ranks (correct data late, a bounded timeout naming the signal and the value seen, or
// a peer failure naming the sender or the fault), never a hang and never wrong bytes reported as delivered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "rdma/common/fault.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

constexpr int kPuts = 10;
constexpr size_t kBytes = 4096;

enum class Expect { kDelivered, kTimeout, kPeerFailed };

// Rank 0 sends with GDX_FAULT=`fault`; rank 1 waits for all ten signals and checks the data. Each rank returns 0 when
// it saw what `expect` says (and, with `senderNamesFault`, rank 0's flush fails naming GDX_FAULT), another code
// (printed) otherwise.
std::vector<int> runFault(const std::string& fault, Expect expect, bool senderNamesFault = false,
                          long long minMs = 0) {
  return test::runRanks(2, [&](int rank) {
    setenv("GDX_TIMEOUT_MS", "4000", 1);
    if (rank == 0) setenv("GDX_FAULT", fault.c_str(), 1);
    Context ctx;
    std::vector<unsigned char> src(kPuts * kBytes), dst(kPuts * kBytes, 0);
    test::fillRandom(src.data(), src.size(), 5);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    ctx.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (rank == 0) {
      Channel ch = ctx.channel(1);
      try {
        for (int i = 0; i < kPuts; ++i) ch.putWithSignal(d, i * kBytes, s, i * kBytes, kBytes, 0, 1);
        ch.flush();
        if (senderNamesFault) return 10;
      } catch (const Error& e) {
        std::fprintf(stderr, "rank 0: %s\n", e.what());
        if (expect != Expect::kPeerFailed) return 11;
        if (senderNamesFault && std::string(e.what()).find("GDX_FAULT") == std::string::npos) return 12;
      }
      if (expect == Expect::kDelivered) {
        ctx.barrier();  // rank 1 has checked everything: close normally
        return 0;
      }
      // Stay until rank 1's wait ended on its own (a closed connection would end it sooner).
      if (expect == Expect::kTimeout) std::this_thread::sleep_for(std::chrono::milliseconds(5500));
      std::fflush(stderr);
      _exit(0);
    }
    try {
      ctx.wait(0, kPuts);
      const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                               .count();
      if (expect != Expect::kDelivered) return 20;
      if (std::memcmp(dst.data(), src.data(), dst.size()) != 0) return 21;
      if (ms < minMs) return 22;
      ctx.barrier();
      return 0;
    } catch (const Error& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      const std::string what = e.what();
      if (expect == Expect::kTimeout) {
        if (e.code() != ErrorCode::kTimeout) return 23;
        if (what.find("signal 0 >= 10") == std::string::npos || what.find("last value seen") == std::string::npos)
          return 24;
      } else if (expect == Expect::kPeerFailed) {
        if (e.code() != ErrorCode::kPeerFailed && e.code() != ErrorCode::kProtocol) return 25;
        if (what.find("rank 0") == std::string::npos && what.find("peer 0") == std::string::npos) return 26;
      } else {
        return 27;
      }
    }
    std::fflush(stderr);
    _exit(0);
  });
}

TEST(FaultInjection, ADelayedOperationArrivesLateAndIntact) {
  EXPECT_EQ(runFault("delay:1:3:400", Expect::kDelivered, false, 400), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, ADroppedOperationEndsTheWaitWithATimeoutNamingTheSignal) {
  EXPECT_EQ(runFault("drop:1:3", Expect::kTimeout), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, ACorruptHeaderFailsTheSenderByName) {
  EXPECT_EQ(runFault("corrupt:1:3", Expect::kPeerFailed), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, AClosedConnectionFailsThePeerOnBothSides) {
  EXPECT_EQ(runFault("close:1:3", Expect::kPeerFailed, true), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, BadSpecificationsAreRefusedNamingTheVariable) {
  for (const char* bad : {"explode:1:3", "drop:7:3", "drop:1:0", "drop:1", "drop:1:3:50", "delay:1:3:x"}) {
    try {
      common::FaultPlan::parse(bad, 2);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("GDX_FAULT=") + bad), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(common::FaultPlan::parse("", 2).action, common::FaultAction::kNone);
  const common::FaultPlan p = common::FaultPlan::parse("delay:1:3:250", 2);
  EXPECT_EQ(p.action, common::FaultAction::kDelay);
  EXPECT_EQ(p.peer, 1);
  EXPECT_EQ(p.atOperation, 3u);
  EXPECT_EQ(p.delayMs, 250u);
}

}  // namespace
}  // namespace gdx
