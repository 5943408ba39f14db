// Command ring throughput with host-thread producers: commands/s for 1, 2, 4 and 8 producers against one
// consumer that drains, publishes the tail and completion counter exactly as a proxy thread does.
#include <benchmark/benchmark.h>

#include <atomic>
#include <thread>

#include "base/command_ring.hpp"
#include "benchmarks/proxy_drain.hpp"

namespace {

class DrainedRing {
 public:
  explicit DrainedRing(uint64_t capacity) : ring_({capacity, -1, 60ull * 1000 * 1000 * 1000}) {
    consumer_ = std::thread([this] {
      gdx::Command batch[256];
      while (!stop_.load(std::memory_order_relaxed)) {
        size_t n = ring_.poll(batch, 256);
        if (n == 0) {
          std::this_thread::yield();
          continue;
        }
        ring_.publishTail();
        ring_.publishCompleted(ring_.consumed());
      }
    });
  }
  ~DrainedRing() {
    stop_ = true;
    consumer_.join();
  }
  gdx::RingDeviceHandle handle() const { return ring_.hostHandle(); }

 private:
  gdx::CommandRing ring_;
  std::atomic<bool> stop_{false};
  std::thread consumer_;
};

DrainedRing& sharedRing() {
  static DrainedRing ring(4096);
  return ring;
}

void BM_RingPush(benchmark::State& state) {
  gdx::RingDeviceHandle h = sharedRing().handle();
  const gdx::Command c = gdx::Command::put(1, 2, 3, 4, 5, 6);
  for (auto _ : state) {
    if (h.push(c) != gdx::Status::kOk) state.SkipWithError("push failed");
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["commands/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RingPush)->ThreadRange(1, 8)->UseRealTime()->MinTime(0.5);

void BM_RingPushPair(benchmark::State& state) {
  gdx::RingDeviceHandle h = sharedRing().handle();
  const gdx::Command a = gdx::Command::put(1, 2, 3, 4, 5, 6, gdx::Opcode::kPutWithSignal),
                     b = gdx::Command::signal(1, 2, 3, gdx::SignalOp::kAdd);
  for (auto _ : state) {
    if (h.pushPair(a, b) != gdx::Status::kOk) state.SkipWithError("push failed");
  }
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_RingPushPair)->ThreadRange(1, 8)->UseRealTime()->MinTime(0.5);

// The consumer alone (benchmarks/proxy_drain.hpp): what one proxy thread can take out, check and complete per second
// when producers are never the limit.
void BM_ProxyDrainNull(benchmark::State& state) {
  constexpr uint64_t kCommands = uint64_t{1} << 20;
  gdx::WindowRegistry registry(0, 2, gdx::kMaxWindows);
  static char fake;  // never touched: the null transport moves no data
  registry.addLocal(0, &fake, size_t{1} << 30, gdx::MemoryKind::kHost);
  registry.addRemote(1, 0, size_t{1} << 30);
  for (auto _ : state) {
    try {
      state.SetIterationTime(gdx::bench::drainFilledRingSeconds(registry, 1, kCommands));
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
  state.counters["commands/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kCommands), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ProxyDrainNull)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace

BENCHMARK_MAIN();
