// Network namespaces for multi-process tests: one namespace per process, joined by veth pairs to a bridge in a hub
// namespace, so that addresses, routing and interface choice are exercised as on separate hosts (needs root and
// network namespaces; ok() says whether they could be made, error() why not).
#pragma once

#include <string>
#include <vector>

namespace gdx::test {

/// Runs `cmd` through the shell with its output discarded; its exit status.
int sh(const std::string& cmd);

// Namespaces gdx<pid>s<subnet>h (the bridge) and ...r0..rN-1 with 10.77.<subnet>.(r+1)/24 on each process's veth.
class NetnsJob {
 public:
  NetnsJob(int ranks, int subnet);
  ~NetnsJob();
  NetnsJob(const NetnsJob&) = delete;
  NetnsJob& operator=(const NetnsJob&) = delete;
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string address(int r) const { return subnet_ + std::to_string(r + 1); }
  /// Rank r's end of its veth pair, inside its namespace.
  const std::string& device(int r) const { return devices_.at(r); }
  /// Called in the child: moves this process into rank r's namespace (exits 90 when it cannot).
  void enter(int r) const;

 private:
  std::string hub() const { return prefix_ + "h"; }
  std::string rankNs(int r) const { return prefix_ + "r" + std::to_string(r); }
  std::string prefix_, subnet_, error_;
  std::vector<std::string> devices_;
  bool ok_ = false;
  int created_ = 0;
};

}  // namespace gdx::test
