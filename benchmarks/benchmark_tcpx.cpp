// benchmark_tcpx: gdx::p2p::TcpxSession between two processes, measured as the TCPX library's test_tcpx_perf_multi
// measures it: a transfer of UCCL_TCPX_PERF_SIZE bytes (default 64 MiB) posted in chunks of UCCL_TCPX_CHUNK_BYTES
// (512 KiB), client -> server, UCCL_TCPX_PERF_ITERS times (10) after one warm-up; the bandwidth per GPU (one session
// pair) is the size over the time from the client's first post until the server's acknowledgement of its last
// receive arrived.
//
//   benchmark_tcpx [--role server|client [--peer HOST] [--port N] [--bind ADDR]] [--device cpu|gpu] [--size N]
//                  [--iters N] [--chunk N] [--channels N] [--json FILE] [--plot DIR] [--no-iperf3]
//
// Launch: with no --role it runs itself as a server and a client on 127.0.0.1; on two hosts start `--role server` on
// one and `--role client --peer SERVER` on the other. The server hands its connection info (TcpxSession::listen()) to
// the client over a TCP connection of its own on --port, as the TCPX library's bootstrap does. Channels come from
// --channels or UCCL_TCPX_NUM_CHANNELS (2), sockets per channel from NCCL_NSOCKS_PERTHREAD (2); the client's decide.
// The peer, measured by the client in the same run: iperf3 with as many streams (-P) as the session has sockets
// (channels × sockets), toward the server's host (on two hosts, toward an `iperf3 -s` started there beforehand).
// A table on stdout, the same as JSON in --json. --device gpu puts both buffers in cudaMalloc memory (kPtrCuda; server
// GPU 0, client GPU 1 where there are two; GDX_CUDA_DEVICE overrides).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/cli.hpp"
#include "benchmarks/host_or_gpu_buffer.hpp"
#include "benchmarks/peer_tcp.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/tcpx_session.hpp"
#include "sockets/socket.hpp"

namespace {

using namespace gdx;
using p2p::TcpxSession;
using p2p::TcpxSessionOptions;
using p2p::TcpxTransfer;

struct Args {
  std::string role;
  std::string peer = "127.0.0.1";
  std::string bind;  // the server's session and bootstrap address; "" every interface, advertised by route
  int port = 29520;
  std::string device = "cpu";
  uint64_t size = 64 << 20;
  int iters = 10;
  uint64_t chunk = 0;  // 0: UCCL_TCPX_CHUNK_BYTES
  int channels = 0;    // 0: UCCL_TCPX_NUM_CHANNELS
  std::string json = "benchmark_tcpx.json";
  std::string plotDir;  // --plot: the client draws its JSON there
  bool iperf3 = true;
};

/// The bound of the bootstrap exchange (the other side may still be starting).
constexpr uint64_t kBootstrapNs = 60ull * 1000 * 1000 * 1000;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the bootstrap: the server's connection info to the client over a TCP connection of its own ------------------

void sendText(int fd, const std::string& text) {
  uint32_t n = static_cast<uint32_t>(text.size());
  iovec iov[2] = {{&n, sizeof n}, {const_cast<char*>(text.data()), text.size()}};
  net::IoLimits limits;
  limits.deadline = net::deadlineIn(kBootstrapNs);
  const net::IoStatus s = net::sendFull(fd, iov, 2, limits);
  if (!s.ok()) throw Error(ErrorCode::kPeerFailed, "bootstrap: sending the connection info: " + s.describe());
}

std::string recvText(int fd) {
  net::IoLimits limits;
  limits.deadline = net::deadlineIn(kBootstrapNs);
  uint32_t n = 0;
  net::IoStatus s = net::recvFull(fd, &n, sizeof n, limits);
  if (s.ok() && n > 4096) throw Error(ErrorCode::kProtocol, "bootstrap: " + std::to_string(n) + " bytes of info");
  std::string text(n, '\0');
  if (s.ok() && n) s = net::recvFull(fd, &text[0], n, limits);
  if (!s.ok()) throw Error(ErrorCode::kPeerFailed, "bootstrap: receiving the connection info: " + s.describe());
  return text;
}

/// Server: waits (bounded) for the client on `a.port` and hands it `info`.
void shipInfo(const Args& a, const std::string& info) {
  int err = 0;
  net::UniqueFd listener = net::listenAt(net::ipv4(a.bind, a.port), &err);
  if (!listener.valid())
    throw Error(ErrorCode::kInvalidArgument, "bootstrap: cannot listen on port " + std::to_string(a.port));
  const net::Deadline deadline = net::deadlineIn(kBootstrapNs);
  for (;;) {
    pollfd p{listener.get(), POLLIN, 0};
    const int ms = net::msUntil(deadline, 100);
    if (ms == 0) throw Error(ErrorCode::kTimeout, "bootstrap: no client came to port " + std::to_string(a.port));
    if (::poll(&p, 1, ms) <= 0) continue;
    net::UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    sendText(fd.get(), info);
    return;
  }
}

/// Client: the server's connection info.
std::string fetchInfo(const Args& a) {
  std::string why;
  net::UniqueFd fd = net::connectTo(net::HostPort{a.peer, a.port}, net::deadlineIn(kBootstrapNs), &why);
  if (!fd.valid()) throw Error(ErrorCode::kTimeout, "bootstrap: cannot reach " + a.peer + ": " + why);
  return recvText(fd.get());
}

// ---- the measurement -------------------------------------------------------------------------------------------

struct Result {
  std::vector<double> seconds;  // per measured iteration
  double meanGbps() const {
    double total = 0;
    for (double s : seconds) total += s;
    return seconds.empty() ? 0 : static_cast<double>(bytes) * seconds.size() / total / 1e9;
  }
  double bestGbps() const {
    return seconds.empty() ? 0 : static_cast<double>(bytes) / *std::min_element(seconds.begin(), seconds.end()) / 1e9;
  }
  uint64_t bytes = 0;
};

/// Posts the transfer as chunks of `chunk` bytes (the last one shorter) with `post(offset, size)`.
template <typename Post>
void postChunks(uint64_t size, uint64_t chunk, Post post) {
  for (uint64_t off = 0; off < size; off += chunk) post(off, std::min(chunk, size - off));
}

void report(const Args& a, const TcpxSessionOptions& o, const Result& r, const bench::Iperf3Result* iperf3) {
  const int sockets = o.channels * o.socketsPerChannel;
  std::printf("benchmark_tcpx: TcpxSession client -> server, device %s, %d channels x %d sockets, %llu-byte chunks\n",
              a.device.c_str(), o.channels, o.socketsPerChannel, static_cast<unsigned long long>(o.chunkBytes));
  std::printf("%11s | %9s | %6s | %9s | %11s | %13s | %s\n", "bytes", "chunk", "iters", "mean ms", "GB/s per GPU",
              "best GB/s", "iperf3 -P GB/s (same run)");
  double meanMs = 0;
  for (double s : r.seconds) meanMs += s * 1e3 / r.seconds.size();
  char peer[64] = "-";
  if (iperf3 && iperf3->gbPerSec >= 0) std::snprintf(peer, sizeof peer, "%.3f (-P %d)", iperf3->gbPerSec, sockets);
  std::printf("%11llu | %9llu | %6zu | %9.2f | %11.3f | %13.3f | %s\n", static_cast<unsigned long long>(a.size),
              static_cast<unsigned long long>(o.chunkBytes), r.seconds.size(), meanMs, r.meanGbps(), r.bestGbps(),
              peer);
  std::printf("[PERF] Bandwidth: %.3f GB/s (per GPU)\n", r.meanGbps());
  std::ostringstream js;
  js << "{\"benchmark\":\"benchmark_tcpx\",\"transport\":\"tcp\",\"device\":\"" << a.device
     << "\",\"channels\":" << o.channels << ",\"sockets_per_channel\":" << o.socketsPerChannel
     << ",\"chunk_bytes\":" << o.chunkBytes << ",\"bytes\":" << a.size << ",\"iters\":" << r.seconds.size()
     << bench::runInfoJson(bench::hostMachine()) << ",\"seconds\":[";
  for (size_t i = 0; i < r.seconds.size(); ++i) js << (i ? "," : "") << r.seconds[i];
  js << "],\"mean_ms\":" << meanMs << ",\"gb_per_s\":" << r.meanGbps() << ",\"best_gb_per_s\":" << r.bestGbps();
  bench::finishJson(js, iperf3, a.json);
}

int run(const Args& a) {
  const int gpu = bench::sideGpu(a.device == "gpu", a.role == "client");
  TcpxSessionOptions o = TcpxSessionOptions::fromEnv(gpu, a.channels);
  if (a.chunk) o.chunkBytes = a.chunk;
  if (a.role == "server") o.bindAddress = a.bind;
  TcpxSession s(o);
  bench::HostOrGpuBuffer region(a.size, a.device == "gpu");
  const int ptrType = a.device == "gpu" ? p2p::kPtrCuda : p2p::kPtrHost;
  char ack[8] = {};
  const bool server = a.role == "server";
  if (server) {
    const std::string info = s.listen();
    shipInfo(a, info);
    s.accept("client");
  } else {
    s.loadRemoteConnInfo("server", fetchInfo(a));
    s.connect("server");
  }
  const char* peer = server ? "client" : "server";
  const uint64_t mem = s.registerMemory(region.p, a.size, ptrType, /*isRecv=*/server);
  const uint64_t ackMem = s.registerMemory(ack, sizeof ack, p2p::kPtrHost, /*isRecv=*/!server);
  std::unique_ptr<TcpxTransfer> t(s.createTransfer(peer));
  Result r;
  r.bytes = a.size;
  for (int it = 0; it <= a.iters; ++it) {  // iteration 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    if (server) {
      postChunks(a.size, o.chunkBytes, [&](uint64_t off, uint64_t n) { t->postRecv(mem, off, n); });
      t->wait();
      t->postSend(ackMem, 0, sizeof ack);  // every byte is in place
    } else {
      postChunks(a.size, o.chunkBytes, [&](uint64_t off, uint64_t n) { t->postSend(mem, off, n); });
      t->postRecv(ackMem, 0, sizeof ack);
    }
    t->wait();
    t->release();
    if (it > 0) r.seconds.push_back(secondsSince(t0));
  }
  if (server) {
    std::printf("server: received %d x %llu bytes; the client prints the results\n", a.iters + 1,
                static_cast<unsigned long long>(a.size));
    return 0;
  }
  bench::Iperf3Result iperf3;
  if (a.iperf3) iperf3 = bench::iperf3Toward(a.peer, 3, o.channels * o.socketsPerChannel);
  report(a, o, r, a.iperf3 ? &iperf3 : nullptr);
  return a.plotDir.empty() ? 0 : bench::plotJson("benchmark_tcpx", a.json, a.plotDir);
}

/// A count from the environment variable `name` (K/M/G suffixes), or `fallback` when unset; exits 2 naming it.
uint64_t countFromEnv(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return bench::parseCount(v);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_tcpx: %s: %s\n", name, e.what());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.size = countFromEnv("UCCL_TCPX_PERF_SIZE", a.size);
  a.iters = static_cast<int>(countFromEnv("UCCL_TCPX_PERF_ITERS", a.iters));
  auto integer = [](const std::string& v) { return static_cast<int>(bench::parseCount(v)); };
  const int parsed = bench::parseFlags(
      argc, argv,
      "gdx::p2p::TcpxSession client -> server: bandwidth per GPU of a transfer posted in chunks (the TCPX library's\n"
      "test_tcpx_perf_multi), beside iperf3 in the same run. With no --role it runs itself as both on 127.0.0.1.\n"
      "Environment: UCCL_TCPX_PERF_SIZE, UCCL_TCPX_PERF_ITERS, UCCL_TCPX_CHUNK_BYTES, UCCL_TCPX_NUM_CHANNELS,\n"
      "NCCL_NSOCKS_PERTHREAD (flags win).",
      {{"--role", "server|client", "this process's side (default: both, on 127.0.0.1)",
        [&](const std::string& v) { a.role = v; }},
       {"--peer", "HOST", "the server's address (client; default 127.0.0.1)",
        [&](const std::string& v) { a.peer = v; }},
       {"--port", "N", "the server's bootstrap port (default 29520)",
        [&](const std::string& v) { a.port = integer(v); }},
       {"--bind", "ADDR", "the server's address (default: every interface, advertised by route)",
        [&](const std::string& v) { a.bind = v; }},
       {"--device", "cpu|gpu", "where the buffers live (default cpu)", [&](const std::string& v) { a.device = v; }},
       {"--size", "N", "bytes per transfer (default UCCL_TCPX_PERF_SIZE, else 64M)",
        [&](const std::string& v) { a.size = bench::parseCount(v); }},
       {"--iters", "N", "measured transfers (default UCCL_TCPX_PERF_ITERS, else 10)",
        [&](const std::string& v) { a.iters = integer(v); }},
       {"--chunk", "N", "bytes per post (default UCCL_TCPX_CHUNK_BYTES, else 512K)",
        [&](const std::string& v) { a.chunk = bench::parseCount(v); }},
       {"--channels", "N", "channels (default UCCL_TCPX_NUM_CHANNELS, else 2)",
        [&](const std::string& v) { a.channels = integer(v); }},
       {"--json", "FILE", "where the results go (default benchmark_tcpx.json)",
        [&](const std::string& v) { a.json = v; }},
       bench::plotFlag(a.plotDir),
       {"--no-iperf3", "", "skip the iperf3 peer", [&](const std::string&) { a.iperf3 = false; }}});
  if (parsed >= 0) return parsed;
  if ((!a.role.empty() && a.role != "server" && a.role != "client") || (a.device != "cpu" && a.device != "gpu") ||
      a.size == 0 || a.iters < 1 || a.port < 1 || a.port > 65535 || a.channels < 0) {
    std::fprintf(stderr,
                 "benchmark_tcpx: --role is server or client, --device cpu or gpu, --size and --iters positive, "
                 "--port 1..65535 (--help)\n");
    return 2;
  }
  // The client plots: checked before anything runs (started by hand, before both sides are started).
  if (!a.plotDir.empty() && a.role != "server" && bench::checkPlotter("benchmark_tcpx")) return 2;
  if (a.role.empty()) return bench::runServerAndClient(argv, {"--bind", "127.0.0.1"});
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_tcpx (%s): %s\n", a.role.c_str(), e.what());
    return 1;
  }
}
