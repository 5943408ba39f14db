// The same multi-process data test as over loopback, but every rank in its own network namespace, joined by
// veth pairs to a bridge: real separate network stacks, so addresses, routing and the interface the bootstrap
// picks are exercised as on separate hosts. Skipped (with the reason) where the kernel or the user may not
// create namespaces.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace gdx
