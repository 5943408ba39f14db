// benchmark_local. On a machine with a GPU (and a build with CUDA) it runs the GPU mode of
// benchmark_local_gpu.cu. Otherwise, or with --mode host, the host mode: host threads produce commands ->
// command ring -> proxy thread -> TCP over loopback -> the second process's proxy -> its signal. Rank 0
// measures, per message size, the one-way latency (half a putWithSignal ping-pong), the bandwidth of a stream
// of puts closed by a putWithSignal, and the message rate; rank 1 answers. Started by hand it runs both ranks.
//
// Host mode measures its peer in the same run, once gdx has left both processes: the kernel's TCP over the same
// loopback (a raw socket ping-pong per size, iperf3's single-stream bandwidth), so a plot shows gdx beside it.
//
//   benchmark_local [--mode auto|host|gpu] [--min-bytes N] [--max-bytes N] [--json FILE] [--plot DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/cli.hpp"
#include "benchmarks/peer_tcp.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/context.hpp"
#include "gdx/error.hpp"
#if defined(GDX_HAVE_CUDA)
#include "benchmarks/benchmark_local_gpu.hpp"
#endif

namespace {

struct Row {
  size_t bytes;
  double latencyUs;
  double gbPerSec;
  double messagesPerSec;
  double tcpLatencyUs;  ///< the peer: raw TCP ping-pong over loopback, one way
};

constexpr uint32_t kPing = 0, kPong = 1, kData = 2, kAck = 3;

// Both ranks derive the same iteration counts from the size.
int latencyIters(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 10, 2000));
}
int bandwidthIters(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{512} << 20) / bytes, 8, 20000));
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the gdx part of a host-mode run leaves behind once its Context is gone.
struct HostRun {
  int rank = 0;
  std::string transport;
  gdx::ProxyCounters counters;
  uint64_t pings = 0, datas = 0;
  std::vector<Row> rows;      ///< rank 0 only
  double idleLatencyUs = -1;  ///< rank 0: 8 B ping-pong, one way, after kIdleMs without traffic before each ping
};

// The idle ping-pong: how long a command takes when it finds the proxies and the waiting thread napping (they nap
// after 0.2 ms without work), as a decode step that follows compute does.
constexpr int kIdleMs = 1, kIdleIters = 200;

HostRun measureHost(size_t minBytes, size_t maxBytes) {
  HostRun run;
  gdx::Context ctx;
  if (ctx.worldSize() != 2) throw gdx::Error(gdx::ErrorCode::kInvalidArgument, "benchmark_local needs 2 ranks");
  const int rank = ctx.rank(), peer = 1 - rank;
  // The destination is large enough that a stream of puts rotates over distinct memory.
  const size_t window = std::max(maxBytes, size_t{64} << 20);
  std::vector<unsigned char> src(window, static_cast<unsigned char>(rank + 1)), dst(window, 0);
  gdx::Window s = ctx.registerWindow(src.data(), src.size());
  gdx::Window d = ctx.registerWindow(dst.data(), dst.size());
  gdx::Channel ch = ctx.channel(peer);
  // One round of the putWithSignal ping-pong: rank 0 pings and waits for the pong, rank 1 answers.
  auto pingPong = [&](size_t bytes) {
    ++run.pings;
    if (rank == 0) {
      ch.putWithSignal(d, 0, s, 0, bytes, kPing, 1);
      ctx.wait(kPong, run.pings);
    } else {
      ctx.wait(kPing, run.pings);
      ch.putWithSignal(d, 0, s, 0, bytes, kPong, 1);
    }
  };
  ctx.barrier();
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= 2) {
    // Latency: ping-pong of putWithSignal.
    const int li = latencyIters(bytes);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < li; ++i) pingPong(bytes);
    double lat = seconds(t0) / li / 2 * 1e6;
    // Bandwidth: a stream of puts closed by a putWithSignal, acknowledged by the receiver.
    const int bi = bandwidthIters(bytes);
    const size_t slots = window / bytes;
    ++run.datas;
    ctx.barrier();
    t0 = std::chrono::steady_clock::now();
    if (rank == 0) {
      for (int i = 0; i + 1 < bi; ++i) ch.put(d, (i % slots) * bytes, s, 0, bytes);
      ch.putWithSignal(d, ((bi - 1) % slots) * bytes, s, 0, bytes, kData, 1);
      ctx.wait(kAck, run.datas);
    } else {
      ctx.wait(kData, run.datas);
      ch.signal(kAck, 1);
    }
    double t = seconds(t0);
    ch.flush();
    if (rank == 0) run.rows.push_back(Row{bytes, lat, double(bytes) * bi / t / 1e9, bi / t, -1});
  }
  ctx.barrier();
  double idleSeconds = 0;
  for (int i = 0; i < kIdleIters; ++i) {
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(kIdleMs));
    const auto t0 = std::chrono::steady_clock::now();
    pingPong(8);
    idleSeconds += seconds(t0);  // rank 0's is the round trip; rank 1's is not used
  }
  if (rank == 0) run.idleLatencyUs = idleSeconds / kIdleIters / 2 * 1e6;
  ctx.barrier();
  run.rank = rank;
  run.transport = ctx.transportName();
  run.counters = ctx.stats();
  return run;
}

int runHostMode(size_t minBytes, size_t maxBytes, const std::string& json, const std::string& plotDir) {
  HostRun run = measureHost(minBytes, maxBytes);
  if (run.rank != 0) {
    std::printf("rank 1: answered %llu ping-pongs and %llu streams; rank 0 prints the results\n",
                (unsigned long long)run.pings, (unsigned long long)run.datas);
    return 0;
  }
  // The peers, measured once gdx has left both processes so that none of its threads runs beside them: the
  // kernel's TCP over the same loopback without gdx (latency: one socket ping-pong; bandwidth: iperf3, 1 stream).
  for (Row& r : run.rows) r.tcpLatencyUs = gdx::bench::tcpPingPongUs(r.bytes, latencyIters(r.bytes));
  const gdx::bench::Iperf3Result iperf3 = gdx::bench::iperf3Loopback(3);
  std::printf("benchmark_local (host mode): host threads -> ring -> proxy -> %s loopback -> second process\n",
              run.transport.c_str());
  std::printf("latency: one way (half a putWithSignal ping-pong); GB/s and messages/s: a stream of puts\n");
  std::printf("peer, same run, without gdx: raw TCP ping-pong over one loopback socket (one way)\n");
  std::printf("%12s %18s %14s %16s %16s\n", "bytes", "one-way_latency_us", "GB/s", "messages/s", "raw_tcp_us");
  for (const Row& r : run.rows)
    std::printf("%12zu %18.2f %14.3f %16.0f %16.2f\n", r.bytes, r.latencyUs, r.gbPerSec, r.messagesPerSec,
                r.tcpLatencyUs);
  std::printf(
      "8 B ping-pong after %d ms idle before each ping (proxies and the waiting thread napping): one way %.2f us\n",
      kIdleMs, run.idleLatencyUs);
  std::printf("%s\n", iperf3.describe().c_str());
  std::printf("proxy: %llu commands, %llu bytes, %llu errors\n", (unsigned long long)run.counters.commands,
              (unsigned long long)run.counters.bytes, (unsigned long long)run.counters.errors);
  if (run.counters.handlingNs > 0 && run.counters.commands > 0)  // GDX_PROXY_TIMING=1
    std::printf("proxy time per command (GDX_PROXY_TIMING): handling %.3f us, operations in flight %.3f us\n",
                run.counters.handlingNs / 1e3 / run.counters.commands,
                run.counters.inFlightNs / 1e3 / run.counters.commands);
  std::ofstream out(json);
  out << "{\"benchmark\":\"benchmark_local\",\"mode\":\"host\",\"transport\":\"" << run.transport << "\""
      << gdx::bench::runInfoJson(gdx::bench::hostMachine()) << ",\"peer_iperf3\":" << iperf3.json()
      << ",\"idle_latency_8B_us\":" << run.idleLatencyUs << ",\"idle_ms_before_each_ping\":" << kIdleMs
      << ",\"results\":[";
  for (size_t i = 0; i < run.rows.size(); ++i) {
    const Row& r = run.rows[i];
    out << (i ? "," : "") << "{\"bytes\":" << r.bytes << ",\"latency_us\":" << r.latencyUs
        << ",\"gb_per_s\":" << r.gbPerSec << ",\"messages_per_s\":" << r.messagesPerSec
        << ",\"tcp_loopback_latency_us\":" << r.tcpLatencyUs << "}";
  }
  out << "]}\n";
  out.close();
  std::printf("wrote %s\n", json.c_str());
  return plotDir.empty() ? 0 : gdx::bench::plotJson("benchmark_local", json, plotDir);
}

}  // namespace

int main(int argc, char** argv) {
  size_t minBytes = 8, maxBytes = 0;
  std::string json = "benchmark_local.json", mode = "auto", plotDir;
  const int parsed = gdx::bench::parseFlags(
      argc, argv,
      "Measures gdx on this machine: one-way latency (half a putWithSignal ping-pong), bandwidth and message rate\n"
      "per size. GPU mode (a GPU and a CUDA build): kernels -> command ring -> proxy, the raw GPU->CPU->GPU round\n"
      "trip and the command rate beside it. Host mode: host threads -> ring -> proxy -> TCP over loopback -> a\n"
      "second process. Started by hand it runs its two ranks itself; prints a table and writes JSON.",
      {{"--mode", "auto|host|gpu", "auto: gpu where a GPU is present, else host",
        [&](const std::string& v) {
          if (v != "auto" && v != "host" && v != "gpu") throw std::invalid_argument("not auto, host or gpu");
          mode = v;
        }},
       {"--min-bytes", "N", "smallest message (default 8)",
        [&](const std::string& v) { minBytes = gdx::bench::parseCount(v); }},
       {"--max-bytes", "N", "largest message (default 64M host, the GPU mode's own)",
        [&](const std::string& v) { maxBytes = gdx::bench::parseCount(v); }},
       {"--json", "FILE", "where the results go (default benchmark_local.json)",
        [&](const std::string& v) { json = v; }},
       gdx::bench::plotFlag(plotDir)});
  if (parsed >= 0) return parsed;
  if (minBytes == 0 || (maxBytes != 0 && maxBytes < minBytes)) {
    std::fprintf(stderr, "benchmark_local: --min-bytes must be positive and at most --max-bytes\n");
    return 2;
  }
  // The process started by hand checks once, before its children run; the rank that writes the JSON plots it.
  if (!plotDir.empty() && gdx::bench::launchedByHand() && gdx::bench::checkPlotter("benchmark_local")) return 2;
#if defined(GDX_HAVE_CUDA)
  if (mode == "gpu" || (mode == "auto" && !std::getenv("GDX_BENCH_MODE_HOST") && gdx::bench::gpuAvailable())) {
    try {
      gdx::bench::GpuModeOptions o;
      o.minBytes = minBytes;
      if (maxBytes) o.maxBytes = maxBytes;
      o.json = json;
      const int rc = gdx::bench::runGpuMode(o);
      return rc != 0 || plotDir.empty() ? rc : gdx::bench::plotJson("benchmark_local", json, plotDir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "benchmark_local (GPU mode): %s\n", e.what());
      return 1;
    }
  }
#endif
  if (mode == "gpu") {
    std::fprintf(stderr, "benchmark_local: --mode gpu needs a GPU and a build with CUDA; this %s\n",
#if defined(GDX_HAVE_CUDA)
                 "machine has no usable GPU"
#else
                 "build has no CUDA"
#endif
    );
    return 2;
  }
  if (maxBytes == 0) maxBytes = size_t{64} << 20;
  if (gdx::bench::launchedByHand()) {
    // The children run the host mode too, whatever this machine has.
    setenv("GDX_BENCH_MODE_HOST", "1", 1);
    return gdx::bench::runSelfAsJob(2, argv);
  }

  try {
    return runHostMode(minBytes, maxBytes, json, plotDir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_local: %s\n", e.what());
    return 1;
  }
}
