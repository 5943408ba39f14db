// benchmark_p2p: gdx::p2p::Endpoint between two processes, client -> server, per message size.
//
//   benchmark_p2p [--role server|client [--peer HOST] [--port N]] [--device cpu|gpu] [--transport tcp|verbs]
//                 [--min-bytes N] [--max-bytes N] [--depth N] [--target-bytes N] [--json FILE] [--plot DIR] [--ipc]
//
// Launch: by hand with no --role it runs itself as a server and a client on 127.0.0.1; on two hosts start
// `--role server` on one and `--role client --peer SERVER` on the other, with the same flags. Per size (powers of
// two from --min-bytes 256 to --max-bytes 256 MiB) the client measures:
//   send/recv  latency: half the round trip of a blocking send answered by a send of the same size;
//              bandwidth: --depth sendAsync in flight, timed until the server acknowledges the last receive
//   sendv      bandwidth of sendv of 16 pieces of size/16 (sizes of 16 pieces or more)
//   write      latency: one blocking write (it returns once the data is placed at the server); bandwidth:
//              --depth writeAsync in flight into the region the server advertised
//   read       the same with read / readAsync
// and, over TCP, what lies beneath it in the same run: gdx's TCP transport alone (half the round trip of a
// write-with-immediate answered by one, benchmarks/transport_round_trip.hpp), the kernel's TCP (the one-way latency
// of a raw socket ping-pong of the same size on loopback), and iperf3 with as many streams (-P) as the endpoint's
// connection has sockets (GDX_TCP_SOCKETS). A table on stdout, the same as JSON in --json. Over verbs, perftest's
// ib_write_bw/ib_read_bw are the peer (tests/softroce/bench-p2p-in-vm.sh runs them in the same VM boot). On GPUs
// --device gpu puts both regions in cudaMalloc memory (server GPU 0, client GPU 1 where there are two; GDX_CUDA_DEVICE
// overrides), and --ipc adds writeIpc/readIpc GPU to GPU beside cudaMemcpyPeerAsync between the same GPUs (a table, not
// yet in the JSON).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/cli.hpp"
#include "benchmarks/host_or_gpu_buffer.hpp"
#include "benchmarks/nccl_peer.hpp"
#include "benchmarks/peer_tcp.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "benchmarks/transport_round_trip.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "sockets/socket.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace gdx;
using p2p::Endpoint;
using p2p::Iov;

struct Args {
  std::string role;
  std::string peer = "127.0.0.1";
  int port = 29519;
  std::string device = "cpu";
  std::string transport;
  uint64_t minBytes = 256;
  uint64_t maxBytes = 256 << 20;
  int depth = 8;
  uint64_t targetBytes = 256 << 20;
  std::string json = "benchmark_p2p.json";
  std::string plotDir;  // --plot: the client draws its JSON there
  bool ipc = false;
  bool nccl = true;  // with --ipc: NCCL send/recv through PyTorch beside it
};

constexpr int kPieces = 16;  // sendv's vector length

using Region = bench::HostOrGpuBuffer;  // the region both sides move data from and into

/// How often each measurement repeats at `bytes`: about --target-bytes, at least 8 and at most 20000 times.
struct Plan {
  uint64_t bytes;
  int latencyIters;
  int bandwidthOps;
};

std::vector<Plan> plans(const Args& a) {
  std::vector<Plan> out;
  for (uint64_t n = a.minBytes; n <= a.maxBytes; n *= 2) {
    const uint64_t ops = std::min<uint64_t>(20000, std::max<uint64_t>(8, a.targetBytes / n));
    out.push_back(Plan{n, static_cast<int>(std::min<uint64_t>(ops, 1000)), static_cast<int>(ops)});
  }
  return out;
}

/// Round trips of the transport alone per size: as many as the endpoint's send/recv latency takes.
int transportIters(const Plan& p) {
  return p.latencyIters;
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Keeps `depth` of `ops` asynchronous transfers in flight, started by `start(i)`; waits for all of them.
template <typename Start>
void pipeline(Endpoint& ep, int ops, int depth, Start start) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < ops; ++i) {
    if (static_cast<int>(ids.size()) >= depth) {
      ep.wait(ids.front());
      ids.erase(ids.begin());
    }
    ids.push_back(start(i));
  }
  for (uint64_t id : ids) ep.wait(id);
}

std::vector<Iov> pieces(uint64_t mr, const Region& r, uint64_t bytes) {
  std::vector<Iov> v;
  for (int i = 0; i < kPieces; ++i) v.push_back(Iov{mr, r.at(i * (bytes / kPieces)), bytes / kPieces});
  return v;
}

/// The server's side of every measurement, in the client's order; it serves writes and reads in the background.
void serve(const Args& a, Endpoint& ep, uint64_t conn, uint64_t mr, const Region& r, uint64_t ackMr, char* ack,
           bench::TransportRoundTrip* transport) {
  for (const Plan& p : plans(a)) {
    for (int i = 0; i < p.latencyIters; ++i) {
      ep.recv(conn, mr, r.p, p.bytes);
      ep.send(conn, mr, r.p, p.bytes);
    }
    pipeline(ep, p.bandwidthOps, a.depth, [&](int) { return ep.recvAsync(conn, mr, r.p, p.bytes); });
    ep.send(conn, ackMr, ack, 8);
    if (p.bytes >= kPieces) {
      for (int i = 0; i < p.bandwidthOps; ++i) ep.recvv(conn, pieces(mr, r, p.bytes));
      ep.send(conn, ackMr, ack, 8);
    }
    ep.recv(conn, ackMr, ack, 8);  // the client is done with writes and reads of this size
    if (transport) transport->run(p.bytes, transportIters(p));
  }
}

struct Row {
  uint64_t bytes = 0;
  double sendUs = 0, sendGbps = 0, sendvGbps = -1, writeUs = 0, writeGbps = 0, readUs = 0, readGbps = 0;
  double transportUs = -1, rawTcpUs = -1;
};

Row measure(const Args& a, const Plan& p, Endpoint& ep, uint64_t conn, uint64_t mr, const Region& r, uint64_t ackMr,
            char* ack, const std::string& desc, bench::TransportRoundTrip* transport) {
  Row row;
  row.bytes = p.bytes;
  const double bytes = static_cast<double>(p.bytes);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.latencyIters; ++i) {
    ep.send(conn, mr, r.p, p.bytes);
    ep.recv(conn, mr, r.p, p.bytes);
  }
  row.sendUs = secondsSince(t0) / p.latencyIters / 2 * 1e6;
  t0 = std::chrono::steady_clock::now();
  pipeline(ep, p.bandwidthOps, a.depth, [&](int) { return ep.sendAsync(conn, mr, r.p, p.bytes); });
  ep.recv(conn, ackMr, ack, 8);
  row.sendGbps = bytes * p.bandwidthOps / secondsSince(t0) / 1e9;
  if (p.bytes >= kPieces) {
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < p.bandwidthOps; ++i) ep.sendv(conn, pieces(mr, r, p.bytes));
    ep.recv(conn, ackMr, ack, 8);
    row.sendvGbps = static_cast<double>(p.bytes / kPieces * kPieces) * p.bandwidthOps / secondsSince(t0) / 1e9;
  }
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.latencyIters; ++i) ep.write(conn, mr, r.p, p.bytes, desc);
  row.writeUs = secondsSince(t0) / p.latencyIters * 1e6;
  t0 = std::chrono::steady_clock::now();
  pipeline(ep, p.bandwidthOps, a.depth, [&](int) { return ep.writeAsync(conn, mr, r.p, p.bytes, desc); });
  row.writeGbps = bytes * p.bandwidthOps / secondsSince(t0) / 1e9;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < p.latencyIters; ++i) ep.read(conn, mr, r.p, p.bytes, desc);
  row.readUs = secondsSince(t0) / p.latencyIters * 1e6;
  t0 = std::chrono::steady_clock::now();
  pipeline(ep, p.bandwidthOps, a.depth, [&](int) { return ep.readAsync(conn, mr, r.p, p.bytes, desc); });
  row.readGbps = bytes * p.bandwidthOps / secondsSince(t0) / 1e9;
  ep.send(conn, ackMr, ack, 8);
  if (transport) {
    row.transportUs = transport->run(p.bytes, transportIters(p));
    row.rawTcpUs = bench::tcpPingPongUs(p.bytes, std::min(p.latencyIters, 200));
  }
  return row;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

void report(const Args& a, const Endpoint& ep, const std::string& shape, const std::vector<Row>& rows,
            const bench::Iperf3Result* iperf3) {
  std::printf("benchmark_p2p: %s, device %s, depth %d, client -> server\n", shape.c_str(), a.device.c_str(), a.depth);
  std::printf("%11s | %9s %9s %9s | %9s %9s | %9s %9s | %12s %9s\n", "bytes", "send us", "send GB/s", "sendv GB/s",
              "write us", "wr GB/s", "read us", "rd GB/s", "transport us", "raw tcp us");
  std::ostringstream js;
  js << "{\"benchmark\":\"benchmark_p2p\",\"transport\":" << bench::jsonString(ep.transport())
     << ",\"connection\":" << bench::jsonString(shape) << ",\"device\":\"" << a.device << "\",\"depth\":" << a.depth
     << bench::runInfoJson(bench::hostMachine()) << ",\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%11llu | %9.2f %9.3f %9s | %9.2f %9.3f | %9.2f %9.3f | %12s %9s\n",
                static_cast<unsigned long long>(r.bytes), r.sendUs, r.sendGbps,
                r.sendvGbps < 0 ? "-" : num(r.sendvGbps).c_str(), r.writeUs, r.writeGbps, r.readUs, r.readGbps,
                r.transportUs < 0 ? "-" : num(r.transportUs).c_str(), r.rawTcpUs < 0 ? "-" : num(r.rawTcpUs).c_str());
    js << (i ? "," : "") << "{\"bytes\":" << r.bytes << ",\"send_us\":" << r.sendUs
       << ",\"send_gb_per_s\":" << r.sendGbps << ",\"sendv_gb_per_s\":" << r.sendvGbps << ",\"write_us\":" << r.writeUs
       << ",\"write_gb_per_s\":" << r.writeGbps << ",\"read_us\":" << r.readUs << ",\"read_gb_per_s\":" << r.readGbps
       << ",\"transport_us\":" << r.transportUs << ",\"raw_tcp_us\":" << r.rawTcpUs << "}";
  }
  js << "]";
  bench::finishJson(js, iperf3, a.json);
}

/// N of a TCP connection's "tcp, N sockets, ..." (Endpoint::connectionTransport); 1 for anything else.
int socketsOf(const std::string& shape) {
  return shape.rfind("tcp, ", 0) == 0 ? std::max(1, std::atoi(shape.c_str() + 5)) : 1;
}

/// A descriptor to the peer: its length, then its bytes, as two sends (the receiver sizes its buffer in between).
void sendText(Endpoint& ep, uint64_t conn, const std::string& text) {
  uint64_t n = text.size();
  std::vector<char> blob(8 + n);
  std::memcpy(blob.data(), &n, 8);
  std::memcpy(blob.data() + 8, text.data(), n);
  const uint64_t mr = ep.reg(blob.data(), blob.size());
  ep.send(conn, mr, blob.data(), 8);
  ep.send(conn, mr, blob.data() + 8, n);
  ep.dereg(mr);
}

std::string recvText(Endpoint& ep, uint64_t conn) {
  uint64_t n = 0;
  const uint64_t nmr = ep.reg(&n, 8);
  ep.recv(conn, nmr, &n, 8);
  ep.dereg(nmr);
  std::string text(n, '\0');
  const uint64_t mr = ep.reg(&text[0], n);
  ep.recv(conn, mr, &text[0], n);
  ep.dereg(mr);
  return text;
}

/// --ipc: writeIpc / readIpc into the server's GPU region beside cudaMemcpyPeerAsync between the same two GPUs.
void measureIpc(const Args& a, Endpoint& ep, const Region& r, const std::string& ipcDesc, int peerGpu) {
#if defined(GDX_HAVE_CUDA)
  int self = 0;
  cudaGetDevice(&self);
  void* peerBuf = nullptr;
  cudaSetDevice(peerGpu);
  const bool peerOk = cudaMalloc(&peerBuf, a.maxBytes) == cudaSuccess;
  cudaSetDevice(self);
  // Without peer access cudaMemcpyPeerAsync stages through host memory (about 38 GB/s on H200s): not the NVLink peer.
  const cudaError_t access = cudaDeviceEnablePeerAccess(peerGpu, 0);
  if (access == cudaErrorPeerAccessAlreadyEnabled)
    cudaGetLastError();
  else if (access != cudaSuccess)
    std::fprintf(stderr, "benchmark_p2p: no peer access %d -> %d (%s): memcpyPeer is staged\n", self, peerGpu,
                 cudaGetErrorString(access));
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::printf("IPC, GPU %d -> GPU %d (same host)\n%11s | %11s %11s | %11s %11s | %15s\n", self, peerGpu, "bytes",
              "writeIpc us", "wr GB/s", "readIpc us", "rd GB/s", "memcpyPeer GB/s");
  std::vector<std::pair<uint64_t, std::pair<double, double>>> rows;  // bytes -> (writeIpc, memcpyPeer) GB/s
  for (const Plan& p : plans(a)) {
    const double bytes = static_cast<double>(p.bytes);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < p.latencyIters; ++i) ep.writeIpc(r.p, p.bytes, ipcDesc);
    const double wUs = secondsSince(t0) / p.latencyIters * 1e6;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < p.latencyIters; ++i) ep.readIpc(r.p, p.bytes, ipcDesc);
    const double rUs = secondsSince(t0) / p.latencyIters * 1e6;
    double peerGbps = -1;
    if (peerOk) {
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < p.latencyIters; ++i) cudaMemcpyPeerAsync(peerBuf, peerGpu, r.p, self, p.bytes, stream);
      cudaStreamSynchronize(stream);
      peerGbps = bytes * p.latencyIters / secondsSince(t0) / 1e9;
    }
    std::printf("%11llu | %11.2f %11.3f | %11.2f %11.3f | %15.3f\n", static_cast<unsigned long long>(p.bytes), wUs,
                bytes / wUs / 1e3, rUs, bytes / rUs / 1e3, peerGbps);
    rows.push_back({p.bytes, {bytes / wUs / 1e3, peerGbps}});
  }
  if (a.nccl) {  // the other peer of the same run: NCCL send/recv between the two GPUs, through PyTorch
    std::map<uint64_t, double> nccl;
    std::string args = std::to_string(bench::freeLoopbackPort());
    for (const auto& row : rows) args += " " + std::to_string(row.first);
    bench::runNcclPeer("p2p", bench::kNcclSendRecvScript, args, [&](std::istream& in) {
      std::string line, kind;
      uint64_t n;
      double v;
      while (std::getline(in, line))  // line by line: a line of another shape skips only itself
        if (std::istringstream(line) >> kind >> n >> v && kind == "nccl") nccl[n] = v;
    });
    std::printf("writeIpc against its peers (GB/s)\n%11s | %9s %11s %9s | %9s %9s\n", "bytes", "writeIpc", "memcpyPeer",
                "NCCL", "/memcpy", "/NCCL");
    for (const auto& [n, g] : rows) {
      const double nc = nccl.count(n) ? nccl[n] : -1;
      std::printf("%11llu | %9.1f %11.1f %9.1f | %8.2fx %8.2fx\n", static_cast<unsigned long long>(n), g.first,
                  g.second, nc, g.second > 0 ? g.first / g.second : 0.0, nc > 0 ? g.first / nc : 0.0);
    }
  }
  cudaStreamDestroy(stream);
  if (peerOk) cudaFree(peerBuf);
#else
  (void)a, (void)ep, (void)r, (void)ipcDesc, (void)peerGpu;
#endif
}

int run(const Args& a) {
  p2p::EndpointOptions o = p2p::EndpointOptions::fromEnv(-1, 1);
  o.localGpu = bench::sideGpu(a.device == "gpu", a.role == "client");
  if (!a.transport.empty()) o.transport = a.transport;
  o.port = a.role == "server" ? a.port : 0;
  Region r(a.maxBytes, a.device == "gpu");
  char ack[8] = {};
  Endpoint ep(o);
  std::string peerIp = a.peer;  // the server learns the client's address from accept
  uint64_t conn = 0;
  if (a.role == "server") {
    const p2p::Accepted acc = ep.accept();
    conn = acc.connId;
    peerIp = acc.ip;
  } else {
    conn = ep.connect(a.peer, -1, a.port);
  }
  const uint64_t mr = ep.reg(r.p, a.maxBytes), ackMr = ep.reg(ack, sizeof ack);
  const std::string shape = ep.connectionTransport(conn);
  // Over TCP, a transport of its own between the same two processes, its address and key passed over the endpoint
  // (the client speaks first: a blocking send waits for the peer's receive).
  std::unique_ptr<bench::TransportRoundTrip> transport;
  if (ep.transport() == "tcp") {
    auto swap = [&](const std::string& mine) {
      if (a.role == "client") {
        sendText(ep, conn, mine);
        return recvText(ep, conn);
      }
      std::string theirs = recvText(ep, conn);
      sendText(ep, conn, mine);
      return theirs;
    };
    // It listens on the interface that routes to the other side (the default, loopback, only reaches a peer on this
    // host and in this network namespace).
    transport = std::make_unique<bench::TransportRoundTrip>(a.role == "client" ? 0 : 1, a.maxBytes, swap,
                                                            net::localAddressToward(peerIp));
  }
  if (a.role == "server") {
    sendText(ep, conn, ep.advertise(conn, mr, r.p, a.maxBytes));
    serve(a, ep, conn, mr, r, ackMr, ack, transport.get());
    if (a.ipc) sendText(ep, conn, ep.advertiseIpc(mr, r.p, a.maxBytes) + "@" + std::to_string(o.localGpu));
    ep.recv(conn, ackMr, ack, 8);  // the client has finished: nothing is in flight when this side closes
    std::printf("server: served %s over %s; the client prints the results\n", a.device.c_str(), shape.c_str());
    return 0;
  }
  const std::string desc = recvText(ep, conn);
  std::vector<Row> rows;
  const bool tcp = transport != nullptr;
  for (const Plan& p : plans(a)) rows.push_back(measure(a, p, ep, conn, mr, r, ackMr, ack, desc, transport.get()));
  if (a.ipc) {  // the server's IPC descriptor, then "@" and its GPU
    const std::string text = recvText(ep, conn);
    const size_t at = text.rfind('@');
    measureIpc(a, ep, r, text.substr(0, at), std::atoi(text.c_str() + at + 1));
  }
  ep.send(conn, ackMr, ack, 8);
  bench::Iperf3Result iperf3;
  if (tcp) {
    // iperf3 toward the same host as the endpoint's connection, with as many streams as it has sockets (on two
    // hosts, toward an `iperf3 -s` that the user started beside the server).
    iperf3 = bench::iperf3Toward(a.peer, 3, socketsOf(shape));
  }
  report(a, ep, shape, rows, tcp ? &iperf3 : nullptr);
  return a.plotDir.empty() ? 0 : bench::plotJson("benchmark_p2p", a.json, a.plotDir);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto integer = [](const std::string& v) { return static_cast<int>(bench::parseCount(v)); };
  const int parsed = bench::parseFlags(
      argc, argv,
      "gdx::p2p::Endpoint client -> server per size: send/recv, sendv, write and read latency and bandwidth, beside\n"
      "a raw TCP socket and iperf3 in the same run. With no --role it runs itself as both on 127.0.0.1.",
      {{"--role", "server|client", "this process's side (default: both, on 127.0.0.1)",
        [&](const std::string& v) { a.role = v; }},
       {"--peer", "HOST", "the server's address (client; default 127.0.0.1)",
        [&](const std::string& v) { a.peer = v; }},
       {"--port", "N", "the server's port (default 29519)", [&](const std::string& v) { a.port = integer(v); }},
       {"--device", "cpu|gpu", "where the regions live (default cpu)", [&](const std::string& v) { a.device = v; }},
       {"--transport", "tcp|verbs", "default GDX_TRANSPORT", [&](const std::string& v) { a.transport = v; }},
       {"--min-bytes", "N", "smallest message (default 256)",
        [&](const std::string& v) { a.minBytes = bench::parseCount(v); }},
       {"--max-bytes", "N", "largest message (default 256M)",
        [&](const std::string& v) { a.maxBytes = bench::parseCount(v); }},
       {"--depth", "N", "asynchronous transfers in flight (default 8)",
        [&](const std::string& v) { a.depth = integer(v); }},
       {"--target-bytes", "N", "bytes per size and measurement, 8..20000 transfers (default 256M)",
        [&](const std::string& v) { a.targetBytes = bench::parseCount(v); }},
       {"--json", "FILE", "where the results go (default benchmark_p2p.json)",
        [&](const std::string& v) { a.json = v; }},
       bench::plotFlag(a.plotDir),
       {"--ipc", "", "with --device gpu: also writeIpc/readIpc beside cudaMemcpyPeerAsync (same host; table only)",
        [&](const std::string&) { a.ipc = true; }},
       {"--no-nccl", "", "with --ipc: skip the NCCL send/recv peer (PyTorch)",
        [&](const std::string&) { a.nccl = false; }}});
  if (parsed >= 0) return parsed;
  if ((!a.role.empty() && a.role != "server" && a.role != "client") || (a.device != "cpu" && a.device != "gpu") ||
      (!a.transport.empty() && a.transport != "tcp" && a.transport != "verbs") || a.minBytes == 0 ||
      a.maxBytes < a.minBytes || a.depth < 1 || a.port < 1 || a.port > 65535 || (a.ipc && a.device != "gpu")) {
    std::fprintf(stderr,
                 "benchmark_p2p: --role is server or client, --device cpu or gpu, --transport tcp or verbs, --depth "
                 "positive, 0 < --min-bytes <= --max-bytes, --port 1..65535, --ipc only with --device gpu (--help)\n");
    return 2;
  }
  // The client plots: checked before anything runs (started by hand, before both sides are started).
  if (!a.plotDir.empty() && a.role != "server" && bench::checkPlotter("benchmark_p2p")) return 2;
  if (a.role.empty()) return bench::runServerAndClient(argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_p2p (%s): %s\n", a.role.c_str(), e.what());
    return 1;
  }
}
