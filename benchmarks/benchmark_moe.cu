// benchmark_moe: MoE dispatch and combine of gdx::ep::Buffer (normal mode, direct NVLink path) between the GPUs of
// one host, one process a GPU (self-launched), and in the same run NCCL's all_to_all_single through PyTorch carrying
// the same bytes. Per token count (128 .. 4096 per rank, hidden 7168, top-8 of 256 experts, uniformly random routing)
// and dtype (BF16, FP8 with scales): the time per call, the median of 5 rounds' means of the timed calls (cached form:
// the handle of a prepare reused; after warm-up; NCCL timed alike), GB/s counted as DeepEP does (received rows x hidden
// x 2 for BF16, x (1 + 4/128) for FP8; combine as BF16), and the SMs the kernels use. Table on stdout, JSON with
// --json. With --hosts N the ranks form N emulated hosts (GDX_HOSTS): ranks on other hosts are reached through the
// proxy and the transport (TCP here), which is how the internode path is measured on one machine.
// --mode ll adds the low-latency mode (gdx::ep::LowLatencyBuffer, moe_low_latency.cuh) before the normal mode at the
// same token counts (default 1 .. 256, 288 experts): whole calls, each half of the hook form, and, across
// emulated hosts, where a call's time goes (kernels, proxy, transport) and whether every command arrived.
//   benchmark_moe [--json PATH] [--plot DIR] [--ranks N] [--hosts N] [--tokens LIST] [--iters N] [--sms N] [--mode ll]
//                 [--no-nccl]
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/cuda_check.hpp"
#include "benchmarks/cli.hpp"
#include "benchmarks/moe_low_latency.cuh"
#include "benchmarks/nccl_peer.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/context.hpp"
#include "gdx/ep/buffer.hpp"

namespace gdx::bench {
namespace {

constexpr int kHidden = 7168, kTopk = 8;

struct Options {
  std::vector<int> tokens{128, 256, 512, 1024, 2048, 4096};
  int iters = 20;
  int sms = 0;                     // 0: each mode's default (ep::Config, ep::LowLatencyConfig)
  int threads = 0;                 // 0: ep::Config::forRanks
  bool lowLatency = false;         // --mode ll
  bool programmaticLaunch = true;  // --no-pdl: plain launches of the low-latency kernels
  bool nextKernelEarly = false;    // --next-kernel-early: LowLatencyConfig::nextKernelEarly
  int experts = 256;               // 288 with --mode ll
  bool tokensGiven = false;
};

__global__ void fillKernel(uint32_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    // Finite BF16 pairs / FP8 bytes: clear the exponent's top bit of every half word.
    p[i] = (x ^ (x >> 15)) & 0xBFFFBFFFu;
  }
}

/// Time per call of `iters` back-to-back collective calls on `s`: the median over kRounds rounds of each round's mean.
/// The ranks leave the host barrier before it at different moments (tens of microseconds apart); a few untimed calls
/// queued right before each round let the ranks' kernels wait for each other there, so that the timed calls start
/// together and a small case does not carry that skew. The median of rounds keeps one stall of a host thread (a
/// round's calls issued late: seen as one 128-token case of 20 calls 30 us a call slower than the same case run again
/// in the same process, on 2 x H200) from standing for the case.
float timeMs(cudaStream_t s, int iters, const std::function<void()>& call) {
  constexpr int kAlignCalls = 3, kRounds = 5;
  cudaEvent_t a, b;
  GDX_CUDA_CHECK(cudaEventCreate(&a));
  GDX_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> perCall;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < kAlignCalls; ++i) call();
    GDX_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) call();
    GDX_CUDA_CHECK(cudaEventRecord(b, s));
    GDX_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    GDX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    perCall.push_back(ms / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(perCall.begin(), perCall.end());
  return perCall[perCall.size() / 2];
}

// One rank: every (tokens, dtype) case; rank 0 writes "moe TOKENS DTYPE OP US BYTES" lines (means over the ranks).
int rankMain(const Options& o, const std::string& resultsPath) {
  if (!envFirstSet({"GDX_CUDA_DEVICE"})) {
    int gpus = 1;
    cudaGetDeviceCount(&gpus);
    setenv("GDX_CUDA_DEVICE", std::to_string(envInt("GDX_LOCAL_RANK", 0) % std::max(gpus, 1)).c_str(), 1);
  }
  Context ctx;
  const int R = ctx.worldSize(), me = ctx.rank();
  const int maxTokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  ep::Config cfg = ep::Config::forRanks(R);
  if (o.sms > 0) cfg.numSms = o.sms;
  if (o.threads > 0) cfg.numThreads = o.threads;
  const size_t nvlBytes = size_t(maxTokens) * R * (kHidden * 2 + 128) + (size_t(8) << 20);
  int remote = 0;
  for (int p = 0; p < R; ++p) remote += p != me && !ctx.isDirect(p);
  const size_t stageBytes = size_t(maxTokens) * (kHidden * 2 + 256) + (size_t(1) << 20);
  ep::Buffer buf(ctx, nvlBytes, remote * stageBytes, cfg);
  cudaStream_t stream;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void *x, *scales, *topk, *weights, *recvX, *recvScales, *recvIdx, *recvW, *combined;
  const size_t maxRecv = size_t(maxTokens) * R;
  GDX_CUDA_CHECK(cudaMalloc(&x, size_t(maxTokens) * kHidden * 2));
  GDX_CUDA_CHECK(cudaMalloc(&scales, size_t(maxTokens) * kHidden / 128 * 4));
  GDX_CUDA_CHECK(cudaMalloc(&topk, size_t(maxTokens) * kTopk * 8));
  GDX_CUDA_CHECK(cudaMalloc(&weights, size_t(maxTokens) * kTopk * 4));
  GDX_CUDA_CHECK(cudaMalloc(&recvX, maxRecv * kHidden * 2));
  GDX_CUDA_CHECK(cudaMalloc(&recvScales, maxRecv * kHidden / 128 * 4));
  GDX_CUDA_CHECK(cudaMalloc(&recvIdx, maxRecv * kTopk * 8));
  GDX_CUDA_CHECK(cudaMalloc(&recvW, maxRecv * kTopk * 4));
  GDX_CUDA_CHECK(cudaMalloc(&combined, size_t(maxTokens) * kHidden * 2));
  fillKernel<<<264, 512>>>(static_cast<uint32_t*>(x), size_t(maxTokens) * kHidden / 2, 17 + me);
  GDX_CUDA_CHECK(cudaMemset(scales, 0x3f, size_t(maxTokens) * kHidden / 128 * 4));
  std::mt19937_64 rng(1000 + me);
  std::vector<int64_t> idx(size_t(maxTokens) * kTopk);
  std::vector<float> w(idx.size(), 0.125f);
  for (int t = 0; t < maxTokens; ++t) {  // top-8 of 256 distinct experts, uniformly at random
    std::vector<int> e(o.experts);
    for (int i = 0; i < o.experts; ++i) e[i] = i;
    for (int k = 0; k < kTopk; ++k) {
      std::swap(e[k], e[k + rng() % (o.experts - k)]);
      idx[size_t(t) * kTopk + k] = e[k];
    }
  }
  GDX_CUDA_CHECK(cudaMemcpy(topk, idx.data(), idx.size() * 8, cudaMemcpyHostToDevice));
  GDX_CUDA_CHECK(cudaMemcpy(weights, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  GDX_CUDA_CHECK(cudaDeviceSynchronize());
  std::ostringstream out;
  if (me == 0)
    out << "gpu " << ctx.gpu().name << "\nranks " << R << "\nremote " << remote << "\nsms " << cfg.numSms << " "
        << cfg.numThreads << "\n";
  if (o.lowLatency) {
    const ep::LowLatencyConfig lc;
    const LowLatencyShape sh{kHidden,
                             kTopk,
                             o.experts,
                             o.sms > 0 ? o.sms : lc.numSms,
                             o.threads > 0 ? o.threads : lc.numThreads,
                             o.iters,
                             o.programmaticLaunch,
                             o.nextKernelEarly};
    if (me == 0)
      out << "llsms " << sh.sms << " " << sh.threads << " "
          << (sh.programmaticLaunch ? (sh.nextKernelEarly ? 2 : 1) : 0) << "\n";
    const std::string lines = runLowLatency(ctx, sh, o.tokens, x, static_cast<int64_t*>(topk),
                                            static_cast<float*>(weights), idx, stream, timeMs);
    if (me == 0) out << lines;
  }
  {  // warm-up: clocks, first launches, first touch of the peers' mappings
    const int n = o.tokens.front();
    ep::DispatchInputs in{x,     nullptr,   static_cast<int64_t*>(topk), static_cast<float*>(weights), n, kHidden,
                          kTopk, o.experts, ep::DType::kBFloat16};
    ep::DispatchHandle h = buf.newHandle(n);
    ep::DispatchOutputs outp;
    outp.recvX = recvX;
    outp.capacity = buf.dispatchPrepare(in, h, 1, stream).numRecvTokens;
    for (int i = 0; i < 200; ++i) {
      buf.dispatch(in, h, outp, stream);
      buf.combine(ep::CombineInputs{recvX, nullptr, nullptr, nullptr}, h, ep::CombineOutputs{combined, nullptr},
                  stream);
    }
    GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  for (int n : o.tokens) {
    for (ep::DType dt : {ep::DType::kBFloat16, ep::DType::kFloat8E4M3}) {
      const bool fp8 = dt == ep::DType::kFloat8E4M3;
      ep::DispatchInputs in{x,
                            fp8 ? static_cast<float*>(scales) : nullptr,
                            static_cast<int64_t*>(topk),
                            static_cast<float*>(weights),
                            n,
                            kHidden,
                            kTopk,
                            o.experts,
                            dt};
      ep::DispatchHandle h = buf.newHandle(n);
      const ep::DispatchCounts c = buf.dispatchPrepare(in, h, 1, stream);
      ep::DispatchOutputs outp;
      outp.recvX = recvX;
      outp.recvXScales = fp8 ? static_cast<float*>(recvScales) : nullptr;
      outp.recvTopkIdx = static_cast<int64_t*>(recvIdx);
      outp.recvTopkWeights = static_cast<float*>(recvW);
      outp.capacity = c.numRecvTokens;
      auto dispatch = [&] { buf.dispatch(in, h, outp, stream); };
      for (int i = 0; i < 5; ++i) dispatch();
      GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
      ctx.barrier();
      const double dispUs = timeMs(stream, o.iters, dispatch) * 1e3;
      buf.checkErrors();
      const double dispBytes = double(c.numRecvTokens) * (fp8 ? kHidden + kHidden / 128 * 4 : kHidden * 2);
      double combUs = -1, combBytes = double(c.numRecvTokens) * kHidden * 2;
      if (!fp8) {
        auto combine = [&] {
          buf.combine(ep::CombineInputs{recvX, nullptr, nullptr, nullptr}, h, ep::CombineOutputs{combined, nullptr},
                      stream);
        };
        for (int i = 0; i < 5; ++i) combine();
        GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
        ctx.barrier();
        combUs = timeMs(stream, o.iters, combine) * 1e3;
        buf.checkErrors();
      }
      std::ostringstream mine;
      mine << dispUs << " " << dispBytes << " " << combUs << " " << combBytes;
      std::vector<std::string> all = ctx.allGather(mine.str());
      double sums[4] = {0, 0, 0, 0};
      for (const std::string& a : all) {
        std::istringstream is(a);
        for (double& s : sums) {
          double v;
          is >> v;
          s += v;
        }
      }
      const char* name = fp8 ? "fp8" : "bf16";
      out << "moe " << n << " " << name << " dispatch " << sums[0] / R << " " << sums[1] / R << "\n";
      if (!fp8) out << "moe " << n << " " << name << " combine " << sums[2] / R << " " << sums[3] / R << "\n";
    }
  }
  GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (void* p : {x, scales, topk, weights, recvX, recvScales, recvIdx, recvW, combined}) cudaFree(p);
  cudaStreamDestroy(stream);
  if (me == 0) std::ofstream(resultsPath) << out.str();
  return 0;
}

const char* kNcclScript = R"PY(
import sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world, port, iters, cases):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for key, nbytes in cases:
        n = max(world, int(nbytes) // world * world)
        a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
        for i in range(5): dist.all_to_all_single(b, a)
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rounds = []
        for r in range(5):  # the median of 5 rounds' means, as gdx's timeMs
            for i in range(3): dist.all_to_all_single(b, a)  # untimed, lining the ranks up as gdx's calls are
            s.record()
            for i in range(iters): dist.all_to_all_single(b, a)
            e.record(); torch.cuda.synchronize()
            rounds.append(s.elapsed_time(e) / iters * 1e3)
        if rank == 0: print(f"nccl {key} {sorted(rounds)[2]}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    world, port, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    cases = [(c.split("=")[0], float(c.split("=")[1])) for c in sys.argv[4:]]
    mp.spawn(run, args=(world, port, iters, cases), nprocs=world)
)PY";

int byHand(char** argv, int ranks, int hosts, const Options& o, std::string json, bool nccl,
           const std::string& plotDir) {
  const std::string results = "/tmp/gdx_moe_" + std::to_string(getpid()) + ".txt";
  setenv("GDX_MOE_RESULTS", results.c_str(), 1);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (hosts > 1) setenv("GDX_HOSTS", std::to_string(hosts).c_str(), 1);
  if (o.lowLatency) setenv("GDX_PROXY_TIMING", "1", 0);  // the low-latency mode splits a call's time
  const int rc = runSelfAsJob(ranks, argv);
  unsetenv("GDX_HOSTS");  // not for the NCCL peer
  if (rc != 0) {
    std::fprintf(stderr, "benchmark_moe: a rank failed (%d)\n", rc);
    return rc;
  }
  std::string gpu = "?";
  int sms = 0, threads = 0, llSms = 0, llThreads = 0, llPdl = 0, remote = 0;
  std::map<std::string, std::pair<double, double>> r;                // "tokens dtype op" -> (us, bytes)
  std::map<std::string, double> peer;                                // same key -> NCCL us
  std::map<std::pair<int, std::string>, std::vector<double>> split;  // (tokens, op) -> a "split" line's numbers
  auto readLines = [&](std::istream& in) {
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string kind;
      ls >> kind;
      if (kind == "gpu") {
        std::getline(ls, gpu);
        if (!gpu.empty() && gpu[0] == ' ') gpu.erase(0, 1);
      } else if (kind == "remote") {
        ls >> remote;
      } else if (kind == "sms") {
        ls >> sms >> threads;
      } else if (kind == "llsms") {
        ls >> llSms >> llThreads >> llPdl;
      } else if (kind == "moe") {
        std::string n, dt, op;
        double us, bytes;
        if (ls >> n >> dt >> op >> us >> bytes) r[n + "_" + dt + "_" + op] = {us, bytes};
      } else if (kind == "split") {
        int n;
        std::string op;
        std::vector<double> v(8);
        if (ls >> n >> op >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7]) split[{n, op}] = v;
      } else if (kind == "nccl") {
        std::string key;
        double us;
        if (ls >> key >> us) peer[key] = us;
      }
    }
  };
  {
    std::ifstream f(results);
    readLines(f);
  }
  std::remove(results.c_str());
  if (nccl) {
    std::string args = std::to_string(ranks) + " " + std::to_string(freeLoopbackPort()) + " " + std::to_string(o.iters);
    for (auto& [key, v] : r) args += " " + key + "=" + std::to_string(static_cast<long long>(v.second));
    runNcclPeer("moe", kNcclScript, args, readLines);  // all_to_all_single of the same bytes per rank
  }
  const std::string date = isoDateUtc();
  int gpus = 0;  // the ranks share them when there are fewer
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  gpus = std::max(1, std::min(gpus, ranks));
  std::printf(
      "benchmark_moe: %d ranks on %d x %s, %d host(s) (%d rank(s) through the proxy per rank), %s; hidden %d, top-%d "
      "of %d experts, %d SMs x %d threads per kernel, median of 5 rounds' means of %d calls\n",
      ranks, gpus, gpu.c_str(), std::max(hosts, 1), remote, date.c_str(), kHidden, kTopk, o.experts, sms, threads,
      o.iters);
  std::printf("%8s %6s %9s %10s %9s %11s %10s %8s\n", "tokens", "dtype", "op", "us", "GB/s", "NCCL us", "NCCL GB/s",
              "speedup");
  std::ostringstream js;
  js << "{\n  \"benchmark\": \"moe\",\n  \"gpu\": " << jsonString(gpu)
     << ",\n  \"machine\": " << jsonString(std::to_string(gpus) + " x " + gpu + ", " + hostName())
     << ",\n  \"date\": " << jsonString(date) << ",\n  \"ranks\": " << ranks << ",\n  \"hosts\": " << std::max(hosts, 1)
     << ",\n  \"remote_ranks_per_rank\": " << remote << ",\n  \"hidden\": " << kHidden << ",\n  \"topk\": " << kTopk
     << ",\n  \"experts\": " << o.experts << ",\n  \"sms\": " << sms << ",\n  \"threads\": " << threads
     << (llSms > 0 ? ",\n  \"ll_sms\": " + std::to_string(llSms) + ",\n  \"ll_threads\": " + std::to_string(llThreads) +
                         ",\n  \"ll_programmatic_launch\": " + (llPdl ? "true" : "false") +
                         ",\n  \"ll_next_kernel_early\": " + (llPdl == 2 ? "true" : "false")
                   : "")
     << ",\n  \"results\": [";
  bool first = true;
  for (int n : o.tokens)
    for (const char* dt : {"ll-fp8", "bf16", "fp8"})
      for (const char* op : {"dispatch", "combine", "dispatch-send", "dispatch-recv", "combine-send", "combine-recv",
                             "dispatch-graph", "combine-graph"}) {
        const std::string key = std::to_string(n) + "_" + dt + "_" + op;
        auto it = r.find(key);
        if (it == r.end()) continue;
        const double us = it->second.first, bytes = it->second.second, gb = bytes / us / 1e3;
        const double nus = peer.count(key) ? peer[key] : -1, ngb = nus > 0 ? bytes / nus / 1e3 : -1;
        std::printf("%8d %6s %9s %10.1f %9.1f %11.1f %10.1f %7.2fx\n", n, dt, op, us, gb, nus, ngb,
                    nus > 0 ? nus / us : 0.0);
        js << (first ? "\n" : ",\n") << "    {\"tokens\": " << n << ", \"dtype\": \"" << dt << "\", \"op\": \"" << op
           << "\", \"us\": " << us << ", \"bytes_per_rank\": " << bytes << ", \"GBps\": " << gb
           << ", \"nccl_all_to_all_us\": " << nus << ", \"nccl_GBps\": " << ngb << "}";
        first = false;
      }
  if (!split.empty())
    std::printf(
        "low-latency (%d blocks x %d threads per kernel, %s launches), per call and rank (means over the ranks): the "
        "whole call, its send and receive halves (hook form), the proxy threads' time taking and posting its commands, "
        "the time with transport operations in flight (these overlap), and the ring slots the proxy took against the "
        "slots the kernels must push\n"
        "%8s %9s %9s %9s %9s %9s %11s %9s %9s %9s\n",
        llSms, llThreads,
        llPdl == 2 ? "programmatic, next kernel early,"
        : llPdl    ? "programmatic"
                   : "plain",
        "tokens", "op", "call us", "send us", "recv us", "proxy us", "in-flight us", "taken", "expected",
        "commands/us");
  for (auto& [key, v] : split) {
    const int n = key.first;
    const std::string& op = key.second;
    const bool accounted = v[5] == v[6] && v[7] == 0;
    std::printf("%8d %9s %9.1f %9.1f %9.1f %9.1f %11.1f %9.1f %9.1f %9.2f%s\n", n, op.c_str(), v[0], v[1], v[2], v[3],
                v[4], v[5], v[6], v[1] > 0 ? v[5] / v[1] : 0.0, accounted ? "" : "  << commands missing or extra");
    js << (first ? "\n" : ",\n") << "    {\"tokens\": " << n << ", \"op\": \"ll-split-" << op
       << "\", \"call_us\": " << v[0] << ", \"send_half_us\": " << v[1] << ", \"recv_half_us\": " << v[2]
       << ", \"proxy_handling_us\": " << v[3] << ", \"transport_in_flight_us\": " << v[4]
       << ", \"commands_taken\": " << v[5] << ", \"commands_expected\": " << v[6] << ", \"ranks_off\": " << v[7]
       << ", \"commands_accounted\": " << (accounted ? "true" : "false") << "}";
    first = false;
  }
  js << "\n  ],\n  \"units\": \"us: mean per call; GB/s = DeepEP's bytes (received rows x hidden x 2, FP8 x (1 + "
        "4/128); low-latency: valid selections x (H + 4H/128 + 16) dispatch, x 2H combine) / time; -1: not "
        "measured\"\n}\n";
  if (json.empty() && !plotDir.empty()) {
    std::filesystem::create_directories(plotDir);
    json = plotDir + "/benchmark_moe.json";
  }
  if (!json.empty()) {
    std::ofstream(json) << js.str();
    std::printf("wrote %s\n", json.c_str());
  }
  return plotDir.empty() ? 0 : plotJson("benchmark_moe", json, plotDir);
}

}  // namespace
}  // namespace gdx::bench

int main(int argc, char** argv) {
  // Before the first CUDA call of this process and of the ranks it starts, as gdx's Context would (gpu.cpp).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  gdx::bench::Options o;
  std::string json, plotDir;
  bool nccl = true;
  int ranks = 0, hosts = 0;
  const int parsed = gdx::bench::parseFlags(
      argc, argv,
      "MoE dispatch and combine (gdx::ep::Buffer, normal mode, NVLink) between the GPUs of one host, one process a\n"
      "GPU (self-launched), beside NCCL all_to_all_single through PyTorch carrying the same bytes. Table on stdout,\n"
      "JSON with --json, plots with --plot.",
      {{"--json", "FILE", "where the results go (default: none; DIR/benchmark_moe.json with --plot)",
        [&](const std::string& v) { json = v; }},
       gdx::bench::plotFlag(plotDir),
       {"--ranks", "N", "ranks (default: the GPUs, at least 2; ranks share GPUs when there are fewer)",
        [&](const std::string& v) { ranks = int(gdx::bench::parseCount(v)); }},
       {"--hosts", "N", "emulated hosts (GDX_HOSTS): ranks on other hosts through the proxy (default: one host)",
        [&](const std::string& v) { hosts = int(gdx::bench::parseCount(v)); }},
       {"--tokens", "LIST", "tokens per rank, comma-separated (default 128,256,512,1024,2048,4096)",
        [&](const std::string& v) {
          o.tokens.clear();
          std::istringstream is(v);
          std::string t;
          while (std::getline(is, t, ',')) o.tokens.push_back(int(gdx::bench::parseCount(t)));
          o.tokensGiven = true;
          if (o.tokens.empty()) throw std::invalid_argument("no token counts");
        }},
       {"--iters", "N", "timed calls per case (default 20)",
        [&](const std::string& v) { o.iters = std::max(1, int(gdx::bench::parseCount(v))); }},
       {"--sms", "N",
        "blocks (SMs) of the EP kernels (default: ep::Config's 24 in normal mode, ep::LowLatencyConfig's in ll)",
        [&](const std::string& v) { o.sms = std::max(1, int(gdx::bench::parseCount(v))); }},
       {"--threads", "N",
        "threads per block of those kernels (default: ep::Config::forRanks, ep::LowLatencyConfig's in ll)",
        [&](const std::string& v) { o.threads = int(gdx::bench::parseCount(v)); }},
       {"--mode", "MODE", "normal (default) or ll: the low-latency mode first, then normal mode at the same tokens",
        [&](const std::string& v) {
          if (v != "ll" && v != "normal") throw std::invalid_argument("--mode " + v + ": normal or ll");
          o.lowLatency = v == "ll";
        }},
       {"--no-pdl", "", "launch the low-latency kernels plainly (LowLatencyConfig::programmaticLaunch false)",
        [&](const std::string&) { o.programmaticLaunch = false; }},
       {"--next-kernel-early", "",
        "let each low-latency kernel start the next one from its start (LowLatencyConfig::nextKernelEarly)",
        [&](const std::string&) { o.nextKernelEarly = true; }},
       {"--no-nccl", "", "skip the NCCL peer (PyTorch)", [&](const std::string&) { nccl = false; }}});
  if (parsed >= 0) return parsed;
  if (o.lowLatency) {  // decoding: few tokens, DeepEP's low-latency shapes
    o.experts = 288;
    if (!o.tokensGiven) o.tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  }
  try {
    if (gdx::bench::launchedByHand()) {
      int gpus = 0;
      const cudaError_t e = cudaGetDeviceCount(&gpus);
      if (e != cudaSuccess || gpus < 1) {
        std::fprintf(stderr, "benchmark_moe: needs GPUs of one host; this machine has none (%s)\n",
                     e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 2;
      }
      if (!plotDir.empty() && gdx::bench::checkPlotter("benchmark_moe")) return 2;
      if (ranks == 0) ranks = std::max(2, std::min(gpus, gdx::ep::kMaxRanks));
      return gdx::bench::byHand(argv, ranks, hosts, o, json, nccl, plotDir);
    }
    const char* results = std::getenv("GDX_MOE_RESULTS");
    return gdx::bench::rankMain(o, results ? results : "/dev/stdout");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_moe: %s\n", e.what());
    return 1;
  }
}
