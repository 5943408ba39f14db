// The state behind gdx::p2p::Endpoint, shared by endpoint.cpp (connections, accept, metadata), endpoint_transfers.cpp
// (memory and transfers) and ipc.cpp (the CUDA IPC forms).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gdx/p2p/endpoint.hpp"
#include "p2p/connection.hpp"
#include "p2p/handshakes.hpp"
#include "p2p/ipc.hpp"
#include "p2p/progress_pool.hpp"
#include "sockets/socket.hpp"

namespace gdx::p2p {

struct Endpoint::Impl {
  explicit Impl(const EndpointOptions& o);
  ~Impl();

  /// "endpoint 10.0.0.1:19500 (GPU 0)", the start of this endpoint's errors.
  std::string who() const;
  uint64_t deadlineNs() const;
  std::shared_ptr<Connection> connection(uint64_t connId, const char* op);
  /// The region `mrId` after checking that [ptr, ptr + size) lies in it; throws kInvalidArgument naming both.
  MemoryRegion region(uint64_t mrId, const void* ptr, size_t size, const char* op);
  Piece piece(uint64_t mrId, const void* ptr, size_t size, const char* op);
  /// Waits for a client until `waitUntil` and starts its handshake (GDX_TIMEOUT_MS of its own) in a thread of its
  /// own, which queues the outcome in `accepted`; false when none came by then.
  bool acceptOne(net::Deadline waitUntil);
  /// The handshake of one accepted socket (run by `handshakes`).
  void answer(net::UniqueFd fd, const std::string& from, const std::function<void()>& heard);
  /// The next client whose handshake finished by `deadline` (nowNs() clock): false when none; throws a refused
  /// handshake's error. Without the passive thread, this thread takes the clients meanwhile.
  bool acceptUntil(uint64_t deadline, Accepted* out);
  uint64_t adopt(PairLink link);
  /// Releases connection `connId` (Endpoint::close, or reap()), failing what still waits on it with `why`.
  /// Idempotent; false when `connId` is no connection this endpoint ever made.
  bool release(uint64_t connId, ErrorCode code, const std::string& why);
  /// Releases every connection that failed (its peer left, died, or broke the protocol), keeping why.
  void reap();
  uint64_t remember(std::shared_ptr<Transfer> t);
  /// The transfer `id` names (the caller holds `mutex`); throws kInvalidArgument for an id it does not know.
  std::map<uint64_t, std::shared_ptr<Transfer>>::iterator transferOf(uint64_t id);
  /// A transfer on `c` whose wait() drives `c` from the waiting thread.
  std::shared_ptr<Transfer> newTransfer(TransferName name, int parts, const std::shared_ptr<Connection>& c);
  /// A transfer without a driver, for a blocking call that drives its connection itself (finish(c, t)).
  std::shared_ptr<Transfer> newTransfer(TransferName name, int parts);
  /// Waits for a transfer started by a blocking call.
  void finish(const std::shared_ptr<Transfer>& t);
  /// The same for a transfer without a driver: the calling thread drives `c` until `t` is done, then waits for it.
  void finish(Connection& c, const Transfer& t);
  void passiveLoop();

  EndpointOptions options;
  net::UniqueFd listener;
  int port = 0;
  std::string ip;
  std::unique_ptr<ProgressPool> pool;
  std::unique_ptr<IpcPeers> ipc;

  std::mutex mutex;
  std::map<uint64_t, std::shared_ptr<Connection>> conns;
  std::map<std::string, uint64_t> byAddress;  ///< addRemoteEndpoint's cache: "ip:port:gpu" -> connId
  std::map<uint64_t, MemoryRegion> regions;
  std::map<uint64_t, std::shared_ptr<Transfer>> transfers;
  /// Why the last released connections went (the oldest forgotten past kReleasedKept): their ids fail with it.
  std::map<uint64_t, std::string> released;
  uint64_t nextConn = 1, nextMr = 1, nextTransfer = 1;

  /// A finished handshake: the client, or why it was refused (`code` not kOk).
  struct Arrival {
    Accepted client;
    ErrorCode code = ErrorCode::kOk;
    std::string why;
  };
  std::mutex acceptMutex;  ///< guards `accepted`
  std::condition_variable acceptedCv;
  std::deque<Arrival> accepted;  ///< filled by the handshake threads, in the order they finish
  Handshakes handshakes;
  std::thread passive;
  std::atomic<bool> stopping{false};
};

}  // namespace gdx::p2p
