// How a process joins a job (BootstrapConfig, read from torchrun's, mpirun's or gdx's variables) and what one
// collective call of the job is (CollectiveTag: the ranks check each call against the others' before it goes on).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "gdx/config.hpp"

namespace gdx {

struct BootstrapConfig {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;  ///< rank among the processes of this host (LOCAL_RANK), -1 if unknown
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string secret;  ///< per-job secret; all ranks of a job must agree
  uint64_t timeoutNs = kDefaultTimeoutNs;
  /// Emulated host of this rank, -1: none (the real hostname decides). Ranks with another emulated host id count as
  /// another host, though on this machine: hostRanks(), the direct path and relays see them as remote, so their
  /// traffic takes the proxy and the transport. The local rank is then the rank's index among its host's ranks.
  int emulatedHost = -1;
  /// Hook for an external key-value store that carries the rendezvous address (torch.distributed's store, from the
  /// Python package): with masterPort 0, rank 0 listens on an ephemeral port of masterAddr and calls
  /// publishPort(port) before it waits for the other ranks, which must learn the port through the store and join
  /// with it as their masterPort. Saves picking a free port in advance (and the race of doing so).
  std::function<void(int port)> publishPort;

  /// Reads GDX_RANK / RANK, GDX_WORLD_SIZE / WORLD_SIZE, GDX_LOCAL_RANK / LOCAL_RANK, GDX_MASTER_ADDR /
  /// MASTER_ADDR, GDX_MASTER_PORT / MASTER_PORT (GDX_ variables win), GDX_JOB_SECRET (else a secret derived
  /// from TORCHELASTIC_RUN_ID, SLURM_JOB_ID or the master address and port), GDX_BOOTSTRAP_TIMEOUT_MS (else
  /// GDX_TIMEOUT_MS), GDX_HOST_ID (this rank's emulated host) or GDX_HOSTS=N (the ranks split into N emulated hosts
  /// of consecutive ranks, world size / N each). Throws gdx::Error(kInvalidArgument) for missing or inconsistent
  /// values.
  static BootstrapConfig fromEnv();
};

/// What one collective call is. Every allGather round carries the caller's tag; the ranks compare them and a round
/// whose tags do not match (another kind, another non-empty name, another size where sizes must be equal) throws
/// gdx::Error(kInvalidArgument) on every rank, naming the sequence number and both sides.
struct CollectiveTag {
  std::string kind = "allGather";  ///< the call: "barrier", "registerWindow", ... (at most 64 bytes)
  uint64_t size = 0;               ///< a window's bytes, for messages; compared only with sameSize
  bool sameSize = false;           ///< the sizes of all ranks must be equal
  std::string name;                ///< optional (at most 256 bytes); compared where both ranks gave one
};

}  // namespace gdx
