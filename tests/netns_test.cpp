// The same multi-process data test as over loopback, but every rank in its own network namespace, joined by
// veth pairs to a bridge: real separate network stacks, so addresses, routing and the interface the bootstrap
// picks are exercised as on separate hosts. Skipped (with the reason) where the kernel or the user may not
// create namespaces.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
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
#include "support/test_support.hpp"

namespace gdx {
namespace {

int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

// Namespaces gdx<pid>h (the bridge) and gdx<pid>r0..rN-1 with 10.77.<k>.(r+1)/24 on each rank's veth.
class NetnsJob {
 public:
  NetnsJob(int ranks, int subnet) : prefix_("gdx" + std::to_string(getpid()) + "s" + std::to_string(subnet)) {
    subnet_ = "10.77." + std::to_string(subnet) + ".";
    if (sh("ip netns add " + hub())) {
      error_ = "ip netns add failed (not root, or no network namespaces in this kernel)";
      return;
    }
    ok_ = sh("ip netns exec " + hub() + " ip link add br0 type bridge") == 0 &&
          sh("ip netns exec " + hub() + " ip link set br0 up") == 0;
    for (int r = 0; ok_ && r < ranks; ++r) {
      std::string ns = rankNs(r), a = "v" + std::to_string(r) + "a" + std::to_string(getpid() % 10000),
                  b = "v" + std::to_string(r) + "b" + std::to_string(getpid() % 10000);
      devices_.push_back(a);
      ok_ = sh("ip netns add " + ns) == 0 && sh("ip link add " + a + " type veth peer name " + b) == 0 &&
            sh("ip link set " + a + " netns " + ns) == 0 && sh("ip link set " + b + " netns " + hub()) == 0 &&
            sh("ip netns exec " + hub() + " ip link set " + b + " master br0") == 0 &&
            sh("ip netns exec " + hub() + " ip link set " + b + " up") == 0 &&
            sh("ip netns exec " + ns + " ip addr add " + address(r) + "/24 dev " + a) == 0 &&
            sh("ip netns exec " + ns + " ip link set " + a + " up") == 0 &&
            sh("ip netns exec " + ns + " ip link set lo up") == 0;
      created_ = r + 1;
    }
    if (!ok_) error_ = "creating veth pairs or the bridge failed";
  }
  ~NetnsJob() {
    for (int r = 0; r < created_; ++r) sh("ip netns del " + rankNs(r));
    sh("ip netns del " + hub());
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string address(int r) const { return subnet_ + std::to_string(r + 1); }
  /// Rank r's end of its veth pair, inside its namespace.
  const std::string& device(int r) const { return devices_.at(r); }
  // Called in the child: move this process into rank r's namespace.
  void enter(int r) const {
    int fd = open(("/var/run/netns/" + rankNs(r)).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      std::perror("setns");
      _exit(90);
    }
    close(fd);
  }

 private:
  std::string hub() const { return prefix_ + "h"; }
  std::string rankNs(int r) const { return prefix_ + "r" + std::to_string(r); }
  std::string prefix_, subnet_, error_;
  std::vector<std::string> devices_;
  bool ok_ = false;
  int created_ = 0;
};

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
