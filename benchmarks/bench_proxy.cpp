// The proxy's cost per command, on a machine without a GPU: the path of benchmark_local's GPU ping-pong
// (pingPutWithSignal: 8-byte putWithSignal between host windows, world of one, loopback transport, then a spin on
// the signal) with a host thread as the producer. The thread pushes the command pair onto a host ring with the
// same calls a kernel's ChannelDeviceHandle makes, and spins on the signal word, so what is measured is the ring
// and everything the proxy thread does per command; Channel's host-side argument checks are left out.
// The peer, in the same run: a raw ping-pong between two host threads through one flag each way, the host
// analogue of the raw GPU->CPU->GPU round trip that benchmark_local prints beside its ping-pong.
//
// Time per iteration is one round trip.
//
//   bench_proxy [--benchmark_out=FILE --benchmark_out_format=json] [other Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/command_ring.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/config.hpp"
#include "gdx/context.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/put_commands.hpp"
#include "runtime/context_impl.hpp"

namespace {

// One step of a spin. Past a few thousand steps (tens of microseconds, far beyond a round trip) it yields, so that
// on a machine with fewer free cores than spinning threads the thread being waited for gets to run.
inline void relax(uint64_t spins) {
  if (spins > 4096) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done(), for at most GDX_TIMEOUT_MS: a proxy or echo thread that stopped answering ends the run with
// an error instead of hanging it. False on timeout.
template <typename Done>
bool spinUntil(Done done) {
  const uint64_t start = gdx::nowNs(), bound = gdx::defaultTimeoutNs();
  for (uint64_t spins = 0; !done(); ++spins) {
    relax(spins);
    if ((spins & 1023) == 1023 && gdx::nowNs() - start > bound) return false;
  }
  return true;
}

// One Context for every benchmark run: a world of one on the loopback transport, two small host windows.
struct LoopbackWorld {
  LoopbackWorld() : ctx(makeContext()) {
    src.assign(4096, 1);
    dst.assign(4096, 0);
    s = std::make_unique<gdx::Window>(ctx->registerWindow(src.data(), src.size()));
    d = std::make_unique<gdx::Window>(ctx->registerWindow(dst.data(), dst.size()));
    ring = gdx::detail::contextImpl(*ctx).proxy().ring(0).hostHandle();
  }
  static std::unique_ptr<gdx::Context> makeContext() {
    setenv("GDX_RANK", "0", 1);
    setenv("GDX_WORLD_SIZE", "1", 1);
    setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
    setenv("GDX_MASTER_PORT", std::to_string(gdx::bench::freeLoopbackPort()).c_str(), 1);
    setenv("GDX_JOB_SECRET", "bench_proxy", 0);
    setenv("GDX_TRANSPORT", "loopback", 0);
    return std::make_unique<gdx::Context>();
  }
  std::unique_ptr<gdx::Context> ctx;
  std::vector<unsigned char> src, dst;
  std::unique_ptr<gdx::Window> s, d;
  gdx::RingDeviceHandle ring{};
  uint64_t pings = 0;  ///< signal 0's value so far
};

LoopbackWorld& world() {
  static LoopbackWorld w;
  return w;
}

// putWithSignal of 8 bytes to this rank, then a spin until the signal counts it: one round trip through the proxy.
void BM_PutWithSignalPingPong(benchmark::State& state) {
  LoopbackWorld& w = world();
  const gdx::PutTarget target{0, -1, w.d->id(), 0, w.s->id(), 0};
  const gdx::SignalUpdateArgs add{0, 1, gdx::SignalOp::kAdd};
  for (auto _ : state) {
    uint64_t pos = 0;
    if (gdx::pushPutCommands(w.ring, target, 8, &add, &pos) != gdx::Status::kOk) {
      state.SkipWithError("push failed");
      break;
    }
    ++w.pings;
    if (!spinUntil([&] { return w.ctx->signalValue(0) >= w.pings; })) {
      const std::string what = "signal 0 stayed at " + std::to_string(w.ctx->signalValue(0)) + ", waiting for " +
                               std::to_string(w.pings) + " (ring position " + std::to_string(pos) +
                               "); proxy: " + w.ctx->proxyError();
      state.SkipWithError(what.c_str());
      break;
    }
  }
}
BENCHMARK(BM_PutWithSignalPingPong)->UseRealTime()->MinTime(1.0);

// Two threads bounce a counter through two flags on separate lines: what a round trip costs without gdx.
void BM_RawFlagPingPong(benchmark::State& state) {
  alignas(128) static std::atomic<uint64_t> ping{0};
  alignas(128) static std::atomic<uint64_t> pong{0};
  std::atomic<bool> stop{false};
  ping = 0;
  pong = 0;
  std::thread echo([&] {
    uint64_t seen = 0, spins = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t v = ping.load(std::memory_order_acquire);
      if (v != seen) {
        seen = v;
        spins = 0;
        pong.store(v, std::memory_order_release);
      } else {
        relax(++spins);
      }
    }
  });
  uint64_t i = 0;
  for (auto _ : state) {
    ping.store(++i, std::memory_order_release);
    if (!spinUntil([&] { return pong.load(std::memory_order_acquire) >= i; })) {
      const std::string what =
          "the echo thread answered " + std::to_string(pong.load()) + ", waiting for " + std::to_string(i);
      state.SkipWithError(what.c_str());
      break;
    }
  }
  stop = true;
  echo.join();
}
BENCHMARK(BM_RawFlagPingPong)->UseRealTime()->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
