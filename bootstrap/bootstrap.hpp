// Bootstrap: rank, world size and a TCP rendezvous that exchanges small blobs (window keys, transport
// addresses) between all ranks. Rank 0 serves the rendezvous at MASTER_ADDR:MASTER_PORT; every rank
// (rank 0 included) connects to it and presents the job secret; a connection without it is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gdx/bootstrap_config.hpp"

namespace gdx {

class Bootstrap {
 public:
  /// Joins the job: rank 0 starts the rendezvous server, every rank connects and waits until all have
  /// arrived. Throws gdx::Error(kTimeout) naming the ranks that never arrived, kProtocol when the secret is
  /// refused.
  explicit Bootstrap(const BootstrapConfig& config);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const;
  int worldSize() const;
  int localRank() const;
  /// Ranks that share this host (same hostname), in rank order; this rank included.
  const std::vector<int>& hostRanks() const;
  /// The hostname `rank` joined from (ranks with the same name share a host).
  const std::string& hostname(int rank) const;
  /// The job secret, for transports that authenticate their own connections.
  const std::string& secret() const;
  /// The address MASTER_ADDR is reached from (the local interface the rendezvous connection uses).
  const std::string& localIp() const;

  /// Every rank contributes a blob; every rank gets all blobs, indexed by rank. Bounded by the timeout. The ranks'
  /// tags are checked against each other (CollectiveTag); a mismatch throws kInvalidArgument on every rank and the
  /// job goes on (the next round is checked afresh).
  std::vector<std::string> allGather(const std::string& mine, const CollectiveTag& tag = CollectiveTag{});
  /// allGather of nothing, tagged "barrier".
  void barrier();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx
