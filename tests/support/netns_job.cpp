#include "support/netns_job.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace gdx::test {

int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

NetnsJob::NetnsJob(int ranks, int subnet) : prefix_("gdx" + std::to_string(getpid()) + "s" + std::to_string(subnet)) {
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

NetnsJob::~NetnsJob() {
  for (int r = 0; r < created_; ++r) sh("ip netns del " + rankNs(r));
  sh("ip netns del " + hub());
}

void NetnsJob::enter(int r) const {
  int fd = open(("/var/run/netns/" + rankNs(r)).c_str(), O_RDONLY);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    std::perror("setns");
    _exit(90);
  }
  close(fd);
}

}  // namespace gdx::test
