// benchmark_moe --mode ll: gdx::ep::LowLatencyBuffer per token count (FP8 dispatch, BF16 combine): the mean time of
// a whole call, of its send half and of its receive half (the hook form: events around each half of every call), of
// a call replayed from a CUDA graph (ops "dispatch-graph", "combine-graph": no launch cost on the host, as in a decode
// loop captured in a graph),
// the bytes counted per valid (token, expert) selection (dispatch H + 4H/128 + 16, combine 2H), and, for ranks on
// other hosts, where a call's time goes and whether every command arrived: the ring slots the proxy threads took per
// call against the slots the kernels must push (dispatch: a put per token and rank on another host one of its experts
// lives on, the count put-with-signal (two slots) and the receive's release signal per such rank; combine: a put per
// (token, rank) row going back, the weights' put-with-signal (two slots), the "sent" and the release signal per such
// rank), the proxy threads' time taking and posting them and
// the time with transport operations in flight (GDX_PROXY_TIMING, which benchmark_moe sets). Lines "moe TOKENS ll-fp8
// OP US BYTES" and "split TOKENS OP ..." go to rank 0's results.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/cuda_check.hpp"
#include "gdx/context.hpp"
#include "gdx/ep/low_latency.hpp"
#include "proxy/proxy.hpp"

namespace gdx::bench {

struct LowLatencyShape {
  int hidden, topk, experts, sms, threads, iters;
  bool programmaticLaunch;  // LowLatencyConfig::programmaticLaunch
  bool nextKernelEarly;     // LowLatencyConfig::nextKernelEarly
};

/// Mean microseconds of each half of `iters` calls: send() then hook() on `s`, events around each.
inline std::pair<double, double> timeHalves(cudaStream_t s, int iters, const std::function<void()>& send,
                                            const std::function<void()>& hook) {
  cudaEvent_t a, b, c;
  GDX_CUDA_CHECK(cudaEventCreate(&a));
  GDX_CUDA_CHECK(cudaEventCreate(&b));
  GDX_CUDA_CHECK(cudaEventCreate(&c));
  double first = 0, second = 0;
  for (int i = 0; i < iters; ++i) {
    GDX_CUDA_CHECK(cudaEventRecord(a, s));
    send();
    GDX_CUDA_CHECK(cudaEventRecord(b, s));
    hook();
    GDX_CUDA_CHECK(cudaEventRecord(c, s));
    GDX_CUDA_CHECK(cudaEventSynchronize(c));
    float x = 0, y = 0;
    GDX_CUDA_CHECK(cudaEventElapsedTime(&x, a, b));
    GDX_CUDA_CHECK(cudaEventElapsedTime(&y, b, c));
    first += x;
    second += y;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(c);
  return {first / iters * 1e3, second / iters * 1e3};
}

/// Mean microseconds per call of `call` replayed from a CUDA graph, as a decode loop runs it: kCallsPerGraph calls are
/// captured once, the graph is replayed once untimed (the ranks line up there, as timeMs's untimed calls do) and then
/// `replays` times between two events. The launches' host cost, which back-to-back calls pay, leaves the figure.
inline double graphCallUs(cudaStream_t s, int replays, const std::function<void()>& call) {
  constexpr int kCallsPerGraph = 10;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GDX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCallsPerGraph; ++i) call();
  GDX_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  GDX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  GDX_CUDA_CHECK(cudaEventCreate(&a));
  GDX_CUDA_CHECK(cudaEventCreate(&b));
  GDX_CUDA_CHECK(cudaGraphLaunch(exec, s));
  GDX_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < replays; ++i) GDX_CUDA_CHECK(cudaGraphLaunch(exec, s));
  GDX_CUDA_CHECK(cudaEventRecord(b, s));
  GDX_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  GDX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return double(ms) * 1e3 / (double(replays) * kCallsPerGraph);
}

/// The proxy's counters once its threads are done with what the kernels pushed (the last receive's release signals
/// may still be in a ring when the stream is done): nothing in flight and no change over 2 ms, at most a second.
inline ProxyCounters settledCounters(const Context& ctx) {
  ProxyCounters a = ctx.stats();
  for (int i = 0; i < 500; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const ProxyCounters b = ctx.stats();
    if (b.inFlight == 0 && b.commands == a.commands && b.inFlightNs == a.inFlightNs && b.handlingNs == a.handlingNs)
      return b;
    a = b;
  }
  return a;
}

/// Per call: ring slots the proxy took, its threads' handling and the transport's in-flight time (us), over `calls`.
struct ProxyShare {
  double commands = 0, handlingUs = 0, inFlightUs = 0;
  static ProxyShare between(const ProxyCounters& a, const ProxyCounters& b, int calls) {
    const double n = calls > 0 ? calls : 1;
    return {double(b.commands - a.commands) / n, double(b.handlingNs - a.handlingNs) / n / 1e3,
            double(b.inFlightNs - a.inFlightNs) / n / 1e3};
  }
};

/// Every token count of `tokens` on this rank; returns rank 0's result lines (means over the ranks).
inline std::string runLowLatency(Context& ctx, const LowLatencyShape& sh, const std::vector<int>& tokens, const void* x,
                                 const int64_t* topk, const float* weights, const std::vector<int64_t>& hostTopk,
                                 cudaStream_t stream,
                                 const std::function<float(cudaStream_t, int, const std::function<void()>&)>& timeMs) {
  const int R = ctx.worldSize(), me = ctx.rank(), L = sh.experts / R;
  int maxT = 1;
  for (int n : tokens) maxT = std::max(maxT, n);
  ep::LowLatencyConfig cfg{
      maxT, sh.hidden, sh.experts, sh.topk, sh.sms, sh.threads, sh.programmaticLaunch, sh.nextKernelEarly};
  ep::LowLatencyBuffer buf(ctx, cfg);
  const size_t rows = size_t(L) * maxT * R;
  void *recvX, *recvScales, *recvCount, *y, *combined;
  GDX_CUDA_CHECK(cudaMalloc(&recvX, rows * sh.hidden));
  GDX_CUDA_CHECK(cudaMalloc(&recvScales, rows * sh.hidden / 128 * 4));
  GDX_CUDA_CHECK(cudaMalloc(&recvCount, size_t(L) * 4));
  GDX_CUDA_CHECK(cudaMalloc(&y, rows * sh.hidden * 2));
  GDX_CUDA_CHECK(cudaMemset(y, 0, rows * sh.hidden * 2));
  GDX_CUDA_CHECK(cudaMalloc(&combined, size_t(maxT) * sh.hidden * 2));
  ep::LowLatencyDispatchOutputs out{recvX, recvScales, static_cast<int32_t*>(recvCount)};
  ep::LowLatencyHandle h = buf.newHandle();
  std::ostringstream lines;
  for (int n : tokens) {
    ep::LowLatencyDispatchInputs in{x, topk, n, sh.topk, true, false};
    ep::LowLatencyCombineInputs cin{y, topk, weights};
    // Selections and the commands they become: a dispatch puts each token once to each rank on another host that one
    // of its experts lives on, and a combine puts one row back for each of those.
    double valid = 0, remoteMessages = 0;
    for (int t = 0; t < n; ++t) {
      uint32_t ranks = 0;
      for (int k = 0; k < sh.topk; ++k) {
        const int64_t e = hostTopk[size_t(t) * sh.topk + k];
        if (e < 0) continue;
        valid += 1;
        if (int(e / L) != me && !ctx.isDirect(int(e / L))) ranks |= 1u << int(e / L);
      }
      remoteMessages += __builtin_popcount(ranks);
    }
    int remoteRanks = 0;
    for (int p = 0; p < R; ++p) remoteRanks += p != me && !ctx.isDirect(p);
    // Ring slots per call (see the header): this rank's dispatch exactly; combine sends back the rows other ranks'
    // dispatches put here, so only the sum over the ranks is known (each rank's messages go out and come back once).
    const double dispExpected = remoteMessages + 3.0 * remoteRanks;
    const double combExpectedShare = remoteMessages + 4.0 * remoteRanks;
    int calls = 0;
    auto dispatch = [&] {
      ++calls;
      buf.lowLatencyDispatch(in, out, h, stream);
    };
    auto combine = [&] {
      ++calls;
      buf.lowLatencyCombine(cin, h, combined, stream);
    };
    for (int i = 0; i < 20; ++i) {
      dispatch();
      combine();
    }
    GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
    ctx.barrier();
    const ProxyCounters p0 = settledCounters(ctx);
    calls = 0;
    const double dispUs = timeMs(stream, sh.iters, dispatch) * 1e3;
    ctx.barrier();
    const ProxyCounters p1 = settledCounters(ctx);
    const ProxyShare dispProxy = ProxyShare::between(p0, p1, calls);
    calls = 0;
    const double combUs = timeMs(stream, sh.iters, combine) * 1e3;
    ctx.barrier();
    const ProxyCounters p2 = settledCounters(ctx);
    const ProxyShare combProxy = ProxyShare::between(p1, p2, calls);
    ctx.barrier();
    ep::LowLatencyHook hook;
    const auto dh = timeHalves(
        stream, sh.iters, [&] { buf.lowLatencyDispatch(in, out, h, stream, &hook); }, [&] { hook.run(stream); });
    ctx.barrier();
    const auto ch = timeHalves(
        stream, sh.iters, [&] { buf.lowLatencyCombine(cin, h, combined, stream, &hook); }, [&] { hook.run(stream); });
    ctx.barrier();
    const double dispGraphUs = graphCallUs(stream, std::max(1, sh.iters / 10), dispatch);
    ctx.barrier();
    const double combGraphUs = graphCallUs(stream, std::max(1, sh.iters / 10), combine);
    buf.checkErrors();
    std::ostringstream mine;
    const bool timed = ctx.options().proxy.timing;
    mine << dispUs << " " << combUs << " " << dh.first << " " << dh.second << " " << ch.first << " " << ch.second << " "
         << valid << " " << dispProxy.commands << " " << dispExpected << " " << combProxy.commands << " "
         << combExpectedShare << " " << (dispProxy.commands != dispExpected ? 1 : 0) << " "
         << (timed ? dispProxy.handlingUs : -1) << " " << (timed ? dispProxy.inFlightUs : -1) << " "
         << (timed ? combProxy.handlingUs : -1) << " " << (timed ? combProxy.inFlightUs : -1) << " " << dispGraphUs
         << " " << combGraphUs;
    const std::vector<std::string> all = ctx.allGather(mine.str());
    double sums[18] = {};
    for (const std::string& a : all) {
      std::istringstream is(a);
      for (double& s : sums) {
        double v;
        is >> v;
        s += v;
      }
    }
    const double sel = sums[6] / R;
    const double dispBytes = sel * (sh.hidden + 4.0 * sh.hidden / 128 + 16), combBytes = sel * 2.0 * sh.hidden;
    const char* ops[6] = {"dispatch", "combine", "dispatch-send", "dispatch-recv", "combine-send", "combine-recv"};
    for (int i = 0; i < 6; ++i)
      lines << "moe " << n << " ll-fp8 " << ops[i] << " " << sums[i] / R << " "
            << (i == 0 || i == 2 || i == 3 ? dispBytes : combBytes) << "\n";
    lines << "moe " << n << " ll-fp8 dispatch-graph " << sums[16] / R << " " << dispBytes << "\n";
    lines << "moe " << n << " ll-fp8 combine-graph " << sums[17] / R << " " << combBytes << "\n";
    // "split TOKENS OP CALL SEND-HALF RECV-HALF PROXY-US IN-FLIGHT-US TAKEN EXPECTED RANKS-OFF" (means over the ranks;
    // TAKEN and EXPECTED per rank and call; RANKS-OFF: ranks whose own count differs, dispatch only).
    lines << "split " << n << " dispatch " << sums[0] / R << " " << sums[2] / R << " " << sums[3] / R << " "
          << sums[12] / R << " " << sums[13] / R << " " << sums[7] / R << " " << sums[8] / R << " " << sums[11] << "\n";
    lines << "split " << n << " combine " << sums[1] / R << " " << sums[4] / R << " " << sums[5] / R << " "
          << sums[14] / R << " " << sums[15] / R << " " << sums[9] / R << " " << sums[10] / R << " 0\n";
  }
  GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (void* p : {recvX, recvScales, recvCount, y, combined}) cudaFree(p);
  return lines.str();
}

}  // namespace gdx::bench
