// The same multi-process data test as over loopback, but every rank in its own network namespace, joined by
// veth pairs to a bridge: real separate network stacks, so addresses, routing and the interface the bootstrap
// picks are exercised as on separate hosts. Skipped (with the reason) where the kernel or the user may not
// create namespaces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "support/data_exchange.hpp"
#include "support/netns_job.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

using test::NetnsJob;
using test::sh;

void runInNamespaces(int ranks, int subnet) {
  NetnsJob job(ranks, subnet);
  if (!job.ok()) GTEST_SKIP() << "network namespaces unavailable: " << job.error();
  auto codes = test::runRanksWith(
      ranks, job.address(0), [&](int r) { job.enter(r); },
      [](int) { return test::exchangeRandomData(size_t{64} << 20); });
  EXPECT_EQ(codes, std::vector<int>(ranks, 0));
}

TEST(Netns, TwoRanksInSeparateNamespaces) {
  runInNamespaces(2, 1);
}
TEST(Netns, FourRanksInSeparateNamespaces) {
  runInNamespaces(4, 2);
}

// Rank 1 takes its link down without closing anything, so no FIN or RST reaches rank 0: rank 0's wait for a signal
// rank 1 never sends must end with kPeerFailed naming rank 1 (TCP keepalive finds the dead link) within
// GDX_TIMEOUT_MS, not with a bare timeout.
TEST(Netns, ACutLinkFailsThePeerByNameWithinTheTimeout) {
  NetnsJob job(2, 3);
  if (!job.ok()) GTEST_SKIP() << "network namespaces unavailable: " << job.error();
  constexpr int kTimeoutMs = 8000;
  auto codes = test::runRanksWith(
      2, job.address(0),
      [&](int r) {
        job.enter(r);
        setenv("GDX_TIMEOUT_MS", std::to_string(kTimeoutMs).c_str(), 1);
      },
      [&](int rank) {
        Context ctx;
        ctx.barrier();
        if (rank == 1) {
          if (sh("ip link set " + job.device(1) + " down") != 0) return 5;
          std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 4000));
          _exit(0);  // without its link the Context cannot close cleanly; rank 0's verdict is what is tested
        }
        const auto t0 = std::chrono::steady_clock::now();
        try {
          ctx.wait(0, 1);
          return 1;
        } catch (const Error& e) {
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "rank 0 after %.0f ms: %s\n", ms, e.what());
          if (e.code() != ErrorCode::kPeerFailed) return 2;
          if (std::string(e.what()).find("rank 1") == std::string::npos) return 3;
          if (ms > kTimeoutMs) return 4;
          _exit(0);  // closing would wait for rank 1 at the barrier of ~Context
        }
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "2: not kPeerFailed, 3: rank 1 not named, 4: later than the timeout, "
                                                "5: could not take the link down";
}

}  // namespace
}  // namespace gdx
