// The round trip of gdx's TCP transport itself, measured by benchmark_p2p beside the endpoint's send/recv: a world of
// two processes, a write-with-immediate of `bytes` answered by one of the same size, the waiting thread polling for
// the immediate (and yielding) as an endpoint's blocking call does. It is set up as an endpoint's connection is
// (GDX_TCP_SOCKETS, GDX_TCP_CHUNK, small messages sent by the posting thread), so endpoint / transport is what the
// endpoint's protocol costs on top of the transport, and transport / raw socket what the transport costs.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/status.hpp"
#include "transport/transport.hpp"

namespace gdx::bench {

class TransportRoundTrip {
 public:
  /// The same as p2p connections use (p2p/pair_link.cpp): small messages leave from the posting thread.
  static constexpr size_t kInlineSendBytes = 16 << 10;

  /// Rank 0 measures, rank 1 answers. `swap` hands this side's blob to the peer and returns the peer's (the
  /// benchmark passes them over its endpoint connection); it is called for the address, then for the window key.
  /// `bindAddress`: where to listen (one the peer can reach), unless GDX_TCP_BIND_ADDR says; empty: the default.
  TransportRoundTrip(int rank, size_t maxBytes, const std::function<std::string(const std::string&)>& swap,
                     const std::string& bindAddress = "")
      : rank_(rank), buffer_(maxBytes) {
    TcpTransportOptions o = TcpTransportOptions::fromEnv(rank, 2, "benchmark_p2p transport round trip");
    if (o.bindAddress.empty()) o.bindAddress = bindAddress;
    o.inlineSendBytes = kInlineSendBytes;
    timeoutNs_ = o.timeoutNs;
    t_ = makeTcpTransport(o);
    t_->setImmHandler([this](const RemoteWrite&) { arrived_.fetch_add(1); });
    std::vector<std::string> addresses(2);
    addresses[rank] = t_->localAddress();
    addresses[1 - rank] = swap(addresses[rank]);
    t_->connect(addresses, 1);
    const std::string key = t_->registerWindow(kWindow, buffer_.data(), buffer_.size(), MemoryKind::kHost);
    t_->addRemoteWindow(1 - rank, kWindow, buffer_.size(), swap(key));
  }
  ~TransportRoundTrip() { t_->shutdown(); }

  /// Rank 0: `iters` round trips of `bytes`; half a round trip in microseconds. Rank 1: the answers; -1.
  double run(uint64_t bytes, int iters) {
    const uint64_t t0 = nowNs();
    for (int i = 0; i < iters; ++i) {
      if (rank_ == 0) post(bytes);
      await(bytes, i);
      if (rank_ == 1) post(bytes);
    }
    drain();
    return rank_ == 0 ? static_cast<double>(nowNs() - t0) / iters / 2 / 1e3 : -1;
  }

 private:
  static constexpr uint32_t kWindow = 1;

  void post(uint64_t bytes) {
    WriteOp op;
    op.peer = 1 - rank_;
    op.localWindow = op.remoteWindow = kWindow;
    op.bytes = bytes;
    op.withImm = true;
    op.cookie = 1;
    t_->lane(0).post(op);
  }

  /// Until the peer's write number `i` (from 0 on, in this size's run) is announced, polling completions meanwhile.
  void await(uint64_t bytes, int i) {
    const uint64_t want = base_ + static_cast<uint64_t>(i) + 1;
    const uint64_t deadline = nowNs() + timeoutNs_;
    uint64_t spins = 0;
    while (arrived_.load() < want) {
      poll();
      if (nowNs() > deadline)
        throw Error(ErrorCode::kTimeout, "transport round trip, rank " + std::to_string(rank_) + ": write " +
                                             std::to_string(i) + " of " + std::to_string(bytes) +
                                             " bytes from the peer not announced within GDX_TIMEOUT_MS (" +
                                             std::to_string(arrived_.load() - base_) + " arrived)");
      spinPause(++spins);
    }
  }

  void poll() {
    Completion done[16];
    size_t n = t_->lane(0).poll(done, 16);
    for (size_t i = 0; i < n; ++i)
      if (done[i].status != Status::kOk)
        throw Error(ErrorCode::kPeerFailed,
                    std::string("transport round trip: a write failed: ") + statusName(done[i].status));
  }

  /// Every posted write completed (so that shutting down loses none), and the next run counts from here.
  void drain() {
    const uint64_t deadline = nowNs() + timeoutNs_;
    while (t_->lane(0).inFlight() > 0) {
      poll();
      if (nowNs() > deadline)
        throw Error(ErrorCode::kTimeout, "transport round trip: writes not completed within GDX_TIMEOUT_MS");
      std::this_thread::yield();
    }
    base_ = arrived_.load();
  }

  const int rank_;
  std::vector<char> buffer_;
  std::unique_ptr<Transport> t_;
  uint64_t timeoutNs_ = 0;
  std::atomic<uint64_t> arrived_{0};
  uint64_t base_ = 0;
};

}  // namespace gdx::bench
