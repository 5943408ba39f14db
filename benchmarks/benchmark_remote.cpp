// benchmark_remote: one-sided write bandwidth and command rate between two ranks through one transport lane.
//
//   benchmark_remote [--rank 0|1 --peer HOST [--port N]] [--transport verbs|tcp] [--device cpu|gpu]
//                    [--min-bytes N] [--max-bytes N] [--depth N] [--target-bytes N] [--json FILE] [--plot DIR]
//                    [--peer-iperf3]
//
// Launch: with --rank/--peer (HOST: where rank 0 runs; rank 0 passes its own address), under torchrun / mpirun /
// the GDX_* variables, or by hand with nothing at all: it then runs itself as two processes on 127.0.0.1.
// Rank 0 writes to rank 1: per size (powers of two from --min-bytes 8 KiB to --max-bytes 256 MiB) it keeps
// --depth writes in flight until about --target-bytes moved (at least 8 writes), and times from the first post to
// the last completion (an RC completion means the data is placed at the receiver). It prints a table (time per
// write, GB/s, million writes/s) and writes the same as JSON. --transport defaults to verbs when an RDMA device
// is present, else tcp. The peer in the same run: over TCP, iperf3 between the two ranks' hosts (rank 1 serves, rank
// 0 connects; --peer-iperf3, and always when started by hand); over verbs, perftest's ib_write_bw, which
// tests/softroce/bench-in-vm.sh runs in the same boot and adds to the JSON.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/cli.hpp"
#include "benchmarks/host_or_gpu_buffer.hpp"
#include "benchmarks/peer_tcp.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "bootstrap/bootstrap.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "transport/transport.hpp"

// Defined only when libgdx was built with libibverbs; weak, so this program links (and falls back to tcp) without.
namespace gdx {
__attribute__((weak)) std::unique_ptr<Transport> makeVerbsTransport(const VerbsTransportOptions& options);
}

namespace {

using namespace gdx;

struct Args {
  int rank = -1;
  std::string peer;
  int port = 29517;
  std::string transport = "auto";
  std::string device = "cpu";
  uint64_t minBytes = 8 << 10;
  uint64_t maxBytes = 256 << 20;
  int depth = 16;
  uint64_t targetBytes = 1ull << 30;
  std::string json = "benchmark_remote.json";
  std::string plotDir;
  bool peerIperf3 = false;
};

// Set by the process started by hand for its two ranks: they measure iperf3 beside gdx when the transport is TCP.
constexpr const char* kPeerIperf3Env = "GDX_BENCH_PEER_IPERF3";

struct Row {
  uint64_t bytes;
  uint64_t writes;
  double seconds;
};

using Buffer = bench::HostOrGpuBuffer;  // the buffer both windows live in

std::unique_ptr<Transport> makeTransport(const Args& a, const Bootstrap& b, std::string* why) {
  const bool tryVerbs = a.transport == "verbs" || a.transport == "auto";
  if (tryVerbs) {
    if (!makeVerbsTransport) {
      if (a.transport == "verbs") throw Error(ErrorCode::kInvalidArgument, "gdx was built without libibverbs");
      *why = "gdx built without libibverbs";
    } else {
      try {
        VerbsTransportOptions o = VerbsTransportOptions::fromEnv(b.rank(), b.worldSize());
        o.lanes = 1;
        return makeVerbsTransport(o);
      } catch (const Error& e) {
        if (a.transport == "verbs" || e.code() != ErrorCode::kVerbs) throw;
        *why = std::string("no RDMA device: ") + e.what();
      }
    }
  }
  TcpTransportOptions o = TcpTransportOptions::fromEnv(b.rank(), b.worldSize(), b.secret());
  o.bindAddress = b.localIp();
  return makeTcpTransport(o);
}

// iperf3 between the two ranks' hosts, over the path the TCP transport takes: rank 1 serves, rank 0 connects.
bench::Iperf3Result iperf3BetweenRanks(Bootstrap& boot, int seconds) {
  const bool server = boot.rank() == 1;
  const int port = server ? bench::freeLoopbackPort() : 0;
  const pid_t pid = server ? bench::startIperf3Server(port) : -1;
  const std::vector<std::string> where = boot.allGather(boot.localIp() + " " + std::to_string(port));
  bench::Iperf3Result r;
  if (!server) {
    std::istringstream in(where[1]);
    std::string host;
    int serverPort = 0;
    in >> host >> serverPort;
    r = bench::runIperf3Client(host, serverPort, seconds);
  }
  boot.barrier();
  if (pid > 0) bench::reapIperf3Server(pid);
  return r;
}

int run(const Args& a) {
  BootstrapConfig cfg = BootstrapConfig::fromEnv();
  if (cfg.worldSize != 2) throw Error(ErrorCode::kInvalidArgument, "benchmark_remote needs exactly two ranks");
  Bootstrap boot(cfg);
  const int rank = boot.rank();
  std::string fallback;
  std::unique_ptr<Transport> t = makeTransport(a, boot, &fallback);
  std::vector<std::string> names = boot.allGather(t->name());
  if (names[0] != names[1])
    throw Error(ErrorCode::kInvalidArgument, "the ranks picked different transports: " + names[0] + ", " + names[1]);
  std::atomic<bool> done{false};
  t->setImmHandler([&](const RemoteWrite& w) {
    if (w.imm == 0xdeadu) done.store(true);
  });
  t->connect(boot.allGather(t->localAddress()), 1);
  Buffer buf(a.maxBytes, a.device == "gpu");
  std::string key = t->registerWindow(1, buf.p, a.maxBytes, a.device == "gpu" ? MemoryKind::kCuda : MemoryKind::kHost);
  std::vector<std::string> keys = boot.allGather(key);
  for (int p = 0; p < 2; ++p) t->addRemoteWindow(p, 1, a.maxBytes, keys[p]);
  boot.barrier();

  std::vector<Row> rows;
  std::ostringstream js;
  if (rank == 0) {
    if (!fallback.empty()) std::printf("transport: tcp (%s)\n", fallback.c_str());
    TransportLane& lane = t->lane(0);
    Completion c[64];
    auto drainTo = [&](size_t limit, uint64_t deadline) {
      while (lane.inFlight() > limit) {
        size_t n = lane.poll(c, 64);
        for (size_t i = 0; i < n; ++i)
          if (c[i].status != Status::kOk)
            throw Error(ErrorCode::kPeerFailed, std::string("a write failed: ") + statusName(c[i].status));
        if (nowNs() > deadline) throw Error(ErrorCode::kTimeout, "writes did not complete in time");
      }
    };
    const uint64_t bound = 600ull * 1000 * 1000 * 1000;
    for (uint64_t size = a.minBytes; size <= a.maxBytes; size *= 2) {
      uint64_t writes = std::max<uint64_t>(8, a.targetBytes / size);
      for (int i = 0; i < 2; ++i) lane.post(WriteOp{1, 1, 0, 1, 0, size, false, 0, 0});  // warm-up
      drainTo(0, nowNs() + bound);
      uint64_t start = nowNs();
      for (uint64_t i = 0; i < writes; ++i) {
        drainTo(static_cast<size_t>(a.depth) - 1, start + bound);
        lane.post(WriteOp{1, 1, 0, 1, 0, size, false, 0, i});
      }
      drainTo(0, start + bound);
      rows.push_back(Row{size, writes, (nowNs() - start) / 1e9});
    }
    lane.post(WriteOp{1, 1, 0, 1, 0, 8, true, 0xdeadu, 0});
    drainTo(0, nowNs() + bound);
    std::printf("benchmark_remote: transport %s, device %s, depth %d, rank 0 -> rank 1\n", t->name().c_str(),
                a.device.c_str(), a.depth);
    std::printf("%12s %8s %14s %12s %14s\n", "bytes", "writes", "us/write", "GB/s", "writes/s");
    js << "{\"benchmark\":\"benchmark_remote\",\"transport\":\"" << t->name() << "\",\"device\":\"" << a.device
       << "\",\"depth\":" << a.depth << bench::runInfoJson(bench::hostMachine()) << ",\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      double us = r.seconds * 1e6 / r.writes, gbps = r.bytes * r.writes / r.seconds / 1e9,
             mops = r.writes / r.seconds / 1e6;
      std::printf("%12llu %8llu %14.2f %12.3f %14.0f\n", static_cast<unsigned long long>(r.bytes),
                  static_cast<unsigned long long>(r.writes), us, gbps, mops * 1e6);
      js << (i ? "," : "") << "{\"bytes\":" << r.bytes << ",\"writes\":" << r.writes << ",\"seconds\":" << r.seconds
         << ",\"us_per_write\":" << us << ",\"gb_per_s\":" << gbps << ",\"mwrites_per_s\":" << mops << "}";
    }
    js << "]";
  } else {
    uint64_t deadline = nowNs() + 3600ull * 1000 * 1000 * 1000;
    while (!done.load()) {
      if (t->peerStatus(0) != Status::kOk) throw Error(ErrorCode::kPeerFailed, "rank 0 failed");
      if (nowNs() > deadline) throw Error(ErrorCode::kTimeout, "rank 0 never finished");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::printf("rank 1: received rank 0's writes into its %s window over %s; rank 0 prints the results\n",
                a.device.c_str(), t->name().c_str());
  }
  boot.barrier();
  const std::string transport = t->name();
  t->shutdown();
  if (transport == "tcp" && (a.peerIperf3 || std::getenv(kPeerIperf3Env))) {
    const bench::Iperf3Result peer = iperf3BetweenRanks(boot, 3);
    if (rank == 0) std::printf("%s\n", peer.describe().c_str());
    js << ",\"peer_iperf3\":" << peer.json();
  }
  if (rank != 0) return 0;
  js << "}\n";
  std::ofstream(a.json) << js.str();
  std::printf("wrote %s\n", a.json.c_str());
  return a.plotDir.empty() ? 0 : bench::plotJson("benchmark_remote", a.json, a.plotDir);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto integer = [](const std::string& v) { return static_cast<int>(bench::parseCount(v)); };
  const int parsed = bench::parseFlags(
      argc, argv,
      "One-sided write bandwidth and command rate between two ranks through one transport lane: rank 0 keeps --depth\n"
      "writes in flight to rank 1 per size and times first post to last completion. Launch with --rank/--peer, under\n"
      "torchrun / mpirun / GDX_* variables, or with nothing: it then runs itself as two processes on 127.0.0.1.",
      {{"--rank", "0|1", "this process's rank (with --peer)", [&](const std::string& v) { a.rank = integer(v); }},
       {"--peer", "HOST", "where rank 0 runs (rank 0 passes its own address)",
        [&](const std::string& v) { a.peer = v; }},
       {"--port", "N", "rank 0's rendezvous port (default 29517)", [&](const std::string& v) { a.port = integer(v); }},
       {"--transport", "verbs|tcp", "default: verbs when an RDMA device is present, else tcp",
        [&](const std::string& v) { a.transport = v; }},
       {"--device", "cpu|gpu", "where the windows live (default cpu)", [&](const std::string& v) { a.device = v; }},
       {"--min-bytes", "N", "smallest write (default 8K)",
        [&](const std::string& v) { a.minBytes = bench::parseCount(v); }},
       {"--max-bytes", "N", "largest write (default 256M)",
        [&](const std::string& v) { a.maxBytes = bench::parseCount(v); }},
       {"--depth", "N", "writes in flight (default 16)", [&](const std::string& v) { a.depth = integer(v); }},
       {"--target-bytes", "N", "bytes per size, at least 8 writes (default 1G)",
        [&](const std::string& v) { a.targetBytes = bench::parseCount(v); }},
       {"--json", "FILE", "where the results go (default benchmark_remote.json)",
        [&](const std::string& v) { a.json = v; }},
       {"--peer-iperf3", "", "over TCP, also run iperf3 between the two hosts (always when started by hand)",
        [&](const std::string&) { a.peerIperf3 = true; }},
       bench::plotFlag(a.plotDir)});
  if (parsed >= 0) return parsed;
  if ((a.transport != "auto" && a.transport != "verbs" && a.transport != "tcp") ||
      (a.device != "cpu" && a.device != "gpu") || a.minBytes == 0 || a.maxBytes < a.minBytes || a.depth < 1) {
    std::fprintf(stderr,
                 "benchmark_remote: --transport must be verbs or tcp, --device cpu or gpu, --depth positive, "
                 "0 < --min-bytes <= --max-bytes (--help)\n");
    return 2;
  }
  if (a.rank >= 0) {
    if (a.rank > 1 || a.peer.empty()) {
      std::fprintf(stderr, "benchmark_remote: --rank is 0 or 1 and needs --peer (--help)\n");
      return 2;
    }
    setenv("GDX_RANK", std::to_string(a.rank).c_str(), 1);
    setenv("GDX_WORLD_SIZE", "2", 1);
    setenv("GDX_MASTER_ADDR", a.peer.c_str(), 1);
    setenv("GDX_MASTER_PORT", std::to_string(a.port).c_str(), 1);
    if (a.rank == 0 && !a.plotDir.empty() && bench::checkPlotter("benchmark_remote")) return 2;
  } else if (bench::launchedByHand()) {
    if (!a.plotDir.empty() && bench::checkPlotter("benchmark_remote")) return 2;
    setenv(kPeerIperf3Env, "1", 1);
    return bench::runSelfAsJob(2, argv);
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_remote: %s\n", e.what());
    return 1;
  }
}
