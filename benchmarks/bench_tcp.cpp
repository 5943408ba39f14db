// Write bandwidth of the TCP transport over loopback: rank 0 -> rank 1, two transports in one process. Every
// write carries an immediate and the window of outstanding writes is bounded by what the receiver has announced,
// so the numbers are end to end (data in the remote window), not just handed to the kernel.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "transport/transport.hpp"

namespace {

constexpr size_t kMaxBytes = 64 << 20;
constexpr uint64_t kWindowBytesInFlight = 64 << 20;  // outstanding bytes, at least two writes

struct Pair {
  std::vector<std::unique_ptr<gdx::Transport>> t;
  std::vector<char> src, dst;
  std::atomic<uint64_t> announced{0};

  explicit Pair(int sockets) : src(kMaxBytes, 1), dst(kMaxBytes, 0) {
    for (int r = 0; r < 2; ++r) {
      gdx::TcpTransportOptions o;
      o.rank = r;
      o.worldSize = 2;
      o.socketsPerPeer = sockets;
      o.chunkBytes = 1 << 20;
      o.bindAddress = "127.0.0.1";
      o.secret = "bench";
      o.timeoutNs = 30ull * 1000 * 1000 * 1000;
      t.push_back(gdx::makeTcpTransport(o));
    }
    t[1]->setImmHandler([this](const gdx::RemoteWrite&) { announced.fetch_add(1, std::memory_order_relaxed); });
    t[0]->registerWindow(1, src.data(), src.size(), gdx::MemoryKind::kHost);
    t[0]->addRemoteWindow(1, 2, dst.size(), t[1]->registerWindow(2, dst.data(), dst.size(), gdx::MemoryKind::kHost));
    std::vector<std::string> addresses{t[0]->localAddress(), t[1]->localAddress()};
    std::thread other([&] { t[1]->connect(addresses, 1); });
    t[0]->connect(addresses, 1);
    other.join();
  }
};

void BM_TcpWrite(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  const int sockets = static_cast<int>(state.range(1));
  Pair pair(sockets);
  gdx::TransportLane& lane = pair.t[0]->lane(0);
  const uint64_t depth = std::max<uint64_t>(2, std::min<uint64_t>(64, kWindowBytesInFlight / bytes));
  uint64_t posted = 0;
  gdx::Completion done[64];
  // Bounded like every wait in gdx: a transport that stops delivering ends the benchmark with an error.
  const auto limit = std::chrono::seconds(60);
  auto drainTo = [&](uint64_t outstanding) {
    auto t0 = std::chrono::steady_clock::now();
    while (posted - pair.announced.load(std::memory_order_relaxed) > outstanding) {
      if (lane.poll(done, 64) == 0) std::this_thread::yield();
      if (std::chrono::steady_clock::now() - t0 > limit) {
        state.SkipWithError("no immediate announced for 60 s");
        return false;
      }
    }
    return true;
  };
  for (auto _ : state) {
    if (!drainTo(depth - 1)) break;
    lane.post(gdx::WriteOp{1, 1, 0, 2, 0, bytes, true, 0, posted});
    ++posted;
    lane.poll(done, 64);
  }
  drainTo(0);
  for (auto t0 = std::chrono::steady_clock::now();
       lane.inFlight() > 0 && std::chrono::steady_clock::now() - t0 < limit;)
    lane.poll(done, 64);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["sockets"] = sockets;
}

void sizesAndSockets(benchmark::internal::Benchmark* b) {
  for (int sockets : {1, 2, 4, 8})
    for (int64_t bytes = 4 << 10; bytes <= static_cast<int64_t>(kMaxBytes); bytes *= 4) b->Args({bytes, sockets});
}

BENCHMARK(BM_TcpWrite)->Apply(sizesAndSockets)->ArgNames({"bytes", "sockets"})->MinTime(0.2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
