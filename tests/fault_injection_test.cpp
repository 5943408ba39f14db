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
#include "support/fault_job.hpp"
#include "support/test_support.hpp"
#include "transport/common/fault.hpp"

namespace gdx {
namespace {

TEST(FaultInjection, ADelayedOperationArrivesLateAndIntact) {
  EXPECT_EQ(test::runFaultJob("tcp", "delay:1:3:400", test::FaultExpect::kDelivered, false, 400),
            (std::vector<int>{0, 0}));
}

// A delay far past the timeout: closing the Context gives up on the delayed operation at the drain deadline (the
// timeout) instead of sleeping the whole delay in the sender thread it joins.
TEST(FaultInjection, ADelayLongerThanTheTimeoutDoesNotHoldTheClose) {
  const std::vector<int> codes = test::runRanks(
      2,
      [](int rank) {
        setenv("GDX_TIMEOUT_MS", "1000", 1);
        setenv("GDX_TRANSPORT", "tcp", 1);
        if (rank == 0) setenv("GDX_FAULT", "delay:1:3:120000", 1);
        std::vector<unsigned char> buf(4096, 1);
        std::chrono::steady_clock::time_point closing;
        {
          Context ctx;
          Window w = ctx.registerWindow(buf.data(), buf.size());
          ctx.barrier();
          if (rank == 0) {
            Channel ch = ctx.channel(1);
            for (int i = 0; i < 5; ++i) ch.putWithSignal(w, 0, w, 0, 64, 0, 1);  // the third sleeps in the sender
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          closing = std::chrono::steady_clock::now();
        }  // ~Context
        const auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - closing);
        std::fprintf(stderr, "rank %d: ~Context took %lld s\n", rank, static_cast<long long>(s.count()));
        return s.count() < 20 ? 0 : 1;
      },
      90);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(FaultInjection, ADroppedOperationEndsTheWaitWithATimeoutNamingTheSignal) {
  EXPECT_EQ(test::runFaultJob("tcp", "drop:1:3", test::FaultExpect::kTimeout), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, ACorruptHeaderFailsTheSenderByName) {
  EXPECT_EQ(test::runFaultJob("tcp", "corrupt:1:3", test::FaultExpect::kPeerFailed), (std::vector<int>{0, 0}));
}

TEST(FaultInjection, AClosedConnectionFailsThePeerOnBothSides) {
  EXPECT_EQ(test::runFaultJob("tcp", "close:1:3", test::FaultExpect::kPeerFailed, true), (std::vector<int>{0, 0}));
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
