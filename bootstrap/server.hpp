// The rendezvous server that rank 0 runs on a thread of its own: it admits the ranks of the job (checking the
// secret), tells everyone once all have joined, and serves allGather rounds. One poll() loop over
// non-blocking sockets, so a stranger that connects and stays silent, or a rank sending a large blob, never
// holds up the others. Every wait it makes is bounded by the job's timeout; when a rank fails (never arrives,
// dies, misbehaves) it sends kAbort naming that rank to every rank and stops serving.
#pragma once

#include <cstdint>
#include <memory>

#include "bootstrap/bootstrap.hpp"

namespace gdx::bootstrap {

class RendezvousServer {
 public:
  /// Binds and listens on config.masterAddr:masterPort before returning (bind errors throw here, in rank 0's
  /// constructor), then serves on a thread.
  explicit RendezvousServer(const BootstrapConfig& config);
  /// Stops the thread (without waiting for the ranks) and joins it.
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  /// The port it listens on (the one chosen by the kernel when config.masterPort was 0).
  int port() const;
  /// Waits up to `ns` for the server to finish on its own: every rank said goodbye, or the job was aborted and
  /// the ranks were told. False on timeout.
  bool waitFinished(uint64_t ns);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::bootstrap
