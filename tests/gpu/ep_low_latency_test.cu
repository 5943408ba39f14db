// gdx::ep::LowLatencyBuffer on two and on four ranks of one host (a GPU each where there are enough, else ranks share
// them; direct path) and on four ranks as two emulated hosts of two (GDX_HOSTS=2: ranks on the other host through the
// proxy and TCP): dispatch (BF16, FP8, FP8 with UE8M0 scales) checked row by row against the source token and top-k
// slot, counts and ranges against the all-gathered top-k, combine against the weighted sum over slots (tokens that name
// one expert in several slots included), the hook form with two calls in flight and the error of a third, a top-k
// refused before anything is sent, 100 replays of a CUDA graph, and a rank killed mid-job. The test re-executes itself
// once per rank.
#include <cxxabi.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ep_reference.hpp"
#include "ep_test_support.hpp"
#include "gdx/context.hpp"
#include "gdx/ep/low_latency.hpp"
#include "gpu_test_support.hpp"
#include "spawn_ranks.hpp"

namespace gdx {
namespace {

using namespace test::ep;

// A CUDA call checked where a fatal assertion cannot return (a constructor, a function returning a value).
#define EXPECT_CUDA_OK(call) EXPECT_EQ((call), cudaSuccess) << #call

// Token t of rank s: column 0 holds s, column 1 holds t (exact in BF16 below 256), the rest values in [-4, 4).
float tokenValue(const Case& c, int s, int t, int i) {
  if (i == 0) return float(s);
  if (i == 1) return float(t);
  return floatOfBf16(bf16Of(expertValue(c, s, t, i)));
}

// The "experts" return the received token scaled by a factor of the top-k slot the row fills: a row summed in the
// place of another slot (two slots naming one expert carry the same token) shows in the combined values.
float slotFactor(int k) {
  return k < 0 ? 0.f : 0.5f + 0.25f * float(k);
}

// The scale of a 128-element block as the kernel computes it, bit for bit: amax / 448 in f32, with roundScale rounded
// up to a power of two from its bits.
float refScale(float amax, bool round) {
  float s = std::max(amax, 1e-4f) / 448.f;
  if (!round) return s;
  uint32_t u;
  std::memcpy(&u, &s, 4);
  u = ((u >> 23) + ((u & 0x7fffffu) != 0)) << 23;
  std::memcpy(&s, &u, 4);
  return s;
}

float fp8e4m3ToFloat(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

struct Job {
  Context& ctx;
  ep::LowLatencyBuffer& buf;
  cudaStream_t stream;
  int R, L;
};

// One dispatch case: inputs, the call (plain or through a hook), the check of every row, then combine.
struct LlCase {
  Case c;  // tokens per rank (tokensOf), hidden, topk, experts, routing, seed, zeroTokenRank
  bool fp8 = false;
  bool roundScale = false;
  int maxTopk = 8;       // of the buffer
  int numThreads = 512;  // per block of every kernel
  int numSms = 128;      // blocks of every kernel (few: each block sends several tokens)
  bool ue8m0 = false;    // with roundScale: the scales as UE8M0 bytes
};

struct Inputs {
  std::unique_ptr<Dev> x, idx, w;
  std::vector<int64_t> hidx;
  std::vector<float> hw;
  int n = 0;
};

Inputs makeInputs(const Job& j, const Case& c) {
  Inputs in;
  const int me = j.ctx.rank(), H = c.hidden;
  in.n = c.tokensOf(me);
  std::vector<uint16_t> hx(size_t(in.n) * H);
  for (int t = 0; t < in.n; ++t)
    for (int i = 0; i < H; ++i) hx[size_t(t) * H + i] = bf16Of(tokenValue(c, me, t, i));
  routing(c, me, in.hidx, in.hw);
  in.x = std::make_unique<Dev>(hx.size() * 2);
  in.idx = std::make_unique<Dev>(in.hidx.size() * 8);
  in.w = std::make_unique<Dev>(in.hw.size() * 4);
  in.x->put(hx.data(), hx.size() * 2);
  in.idx->put(in.hidx.data(), in.hidx.size() * 8);
  in.w->put(in.hw.data(), in.hw.size() * 4);
  return in;
}

// The outputs of a dispatch (poisoned with 0xEE by Dev: bytes no row owns must stay so), and its statistics (zeroed).
struct Outputs {
  std::unique_ptr<Dev> x, scales, count, recvStats, waitCost;
  ep::LowLatencyDispatchOutputs out;
  Outputs(const Job& j, const Case& c, bool fp8) {
    const size_t rows = size_t(j.L) * j.buf.config().maxTokensPerRank * j.R;  // [L, T * R]
    x = std::make_unique<Dev>(rows * c.hidden * (fp8 ? 1 : 2));
    scales = std::make_unique<Dev>(rows * (c.hidden / 128) * 4);  // f32 [L, H / 128, T * R], or UE8M0 (a quarter)
    count = std::make_unique<Dev>(size_t(j.L) * 4);
    recvStats = std::make_unique<Dev>(size_t(j.L) * 4);
    waitCost = std::make_unique<Dev>(size_t(j.R) * 8);
    EXPECT_CUDA_OK(cudaMemset(recvStats->p, 0, recvStats->bytes));
    EXPECT_CUDA_OK(cudaMemset(waitCost->p, 0, waitCost->bytes));
    EXPECT_CUDA_OK(cudaDeviceSynchronize());
    out.recvX = x->p;
    out.recvXScales = fp8 ? scales->p : nullptr;
    out.recvCount = count->as<int32_t>();
    out.cumulativeRecvStats = recvStats->as<int32_t>();
    out.waitRecvCostStats = waitCost->as<int64_t>();
  }
};

std::vector<bool> maskOf(const Job& j) {
  std::vector<bool> m(j.R, false);
  for (int r : j.buf.maskedRanks()) m[r] = true;
  return m;
}

// Every received row against its source token and slot (a token naming the expert in two slots is two rows); counts
// and layout ranges against the all-gathered top-k of the ranks not masked. Returns the experts' outputs (BF16 of
// the received values times slotFactor) for combine.
std::vector<uint16_t> checkDispatch(const Job& j, const LlCase& lc, const Outputs& o, const ep::LowLatencyHandle& h,
                                    const std::vector<std::vector<int64_t>>& allIdx, const std::string& form) {
  const Case& c = lc.c;
  const int me = j.ctx.rank(), H = c.hidden, T = j.buf.config().maxTokensPerRank, K = c.topk, ns = H / 128;
  const size_t rowsPerExpert = size_t(T) * j.R, xb = size_t(H) * (lc.fp8 ? 1 : 2);
  const std::vector<bool> masked = maskOf(j);
  auto counts = o.count->get<int32_t>(j.L);
  auto ranges = Dev::getFrom<int64_t>(h.layoutRange(), size_t(j.L) * j.R);
  auto src = Dev::getFrom<int32_t>(h.srcInfo(), size_t(j.L) * rowsPerExpert);
  auto slot = Dev::getFrom<int32_t>(h.srcSlot(), size_t(j.L) * rowsPerExpert);
  auto x = o.x->get<uint8_t>(size_t(j.L) * rowsPerExpert * xb);
  // The scales in DeepEP's layouts (LowLatencyDispatchOutputs::recvXScales): f32 [L, ns, rows], UE8M0 [L, G, rows, 4].
  const int G = (ns + 3) / 4;
  const size_t scaleBytes = lc.fp8 ? size_t(j.L) * rowsPerExpert * (lc.ue8m0 ? G * 4 : ns * 4) : 0;
  auto sc = o.scales->get<uint8_t>(scaleBytes);
  const auto scaleAt = [&](int e, size_t i, int blk) -> size_t {  // byte offset of scale blk of row i of expert e
    return lc.ue8m0 ? ((size_t(e) * G + blk / 4) * rowsPerExpert + i) * 4 + blk % 4
                    : ((size_t(e) * ns + blk) * rowsPerExpert + i) * 4;
  };
  const auto scaleOf = [&](int e, size_t i, int blk) {
    if (lc.ue8m0) return std::ldexp(1.0f, int(sc[scaleAt(e, i, blk)]) - 127);
    float f;
    std::memcpy(&f, &sc[scaleAt(e, i, blk)], 4);
    return f;
  };
  std::vector<uint16_t> y(size_t(j.L) * rowsPerExpert * H, 0);
  int bad = 0;
  for (int e = 0; e < j.L && bad < 5; ++e) {
    const int64_t global = int64_t(me) * j.L + e;
    int run = 0;
    for (int s = 0; s < j.R; ++s) {
      std::vector<std::pair<int, int>> want;  // (token, slot), one row each
      if (!masked[s])
        for (int t = 0; t < c.tokensOf(s); ++t)
          for (int k = 0; k < K; ++k)
            if (allIdx[s][size_t(t) * K + k] == global) want.push_back({t, k});
      const int64_t r = ranges[size_t(e) * j.R + s];
      EXPECT_EQ(r >> 32, run) << form << ": first row of rank " << s << " at expert " << e;
      EXPECT_EQ(r & 0xffffffff, int64_t(want.size())) << form << ": rows from rank " << s << " at expert " << e;
      std::vector<std::pair<int, int>> got;
      for (int i = int(r >> 32); i < int(r >> 32) + int(r & 0xffffffff) && i < int(rowsPerExpert); ++i) {
        const size_t row = size_t(e) * rowsPerExpert + i;
        const int t = src[row];
        got.push_back({t, slot[row]});
        for (int col = 0; col < H; ++col) {
          const float v = tokenValue(c, s, t, col);
          float g;
          if (lc.fp8) {
            const float scale = scaleOf(e, size_t(i), col / 128);
            g = fp8e4m3ToFloat(x[row * xb + col]) * scale;
            if (std::fabs(g - v) > std::fabs(v) / 16 + scale / 512 + 1e-6f) {
              ADD_FAILURE() << form << ": expert " << e << " row " << i << " (rank " << s << " token " << t
                            << ") column " << col << ": " << g << ", sent " << v;
              ++bad;
              break;
            }
          } else {
            g = floatOfBf16(uint16_t(x[row * xb + 2 * col] | x[row * xb + 2 * col + 1] << 8));
            if (g != v) {
              ADD_FAILURE() << form << ": expert " << e << " row " << i << " (rank " << s << " token " << t
                            << ") column " << col << ": " << g << ", sent " << v;
              ++bad;
              break;
            }
          }
          y[row * H + col] = bf16Of(g * slotFactor(slot[row]));
        }
      }
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << form << ": (token, slot) of the rows from rank " << s << " at expert " << e;
      run += int(want.size());
    }
    EXPECT_EQ(counts[e], run) << form << ": count of expert " << e;
  }
  if (lc.fp8) {
    // Every byte of the scales against the host's image: each received row's scales (amax / 448 of each 128 elements,
    // bit for bit, rounded up to a power of two with roundScale, its exponent byte with UE8M0), and 0xEE elsewhere.
    std::vector<uint8_t> want(scaleBytes, 0xEE);
    for (int e = 0; e < j.L; ++e)
      for (int i = 0; i < std::min<int>(counts[e], int(rowsPerExpert)); ++i) {
        const size_t row = size_t(e) * rowsPerExpert + i;
        int s = 0;
        while (s + 1 < j.R && i >= int(ranges[size_t(e) * j.R + s + 1] >> 32)) ++s;
        for (int blk = 0; blk < ns; ++blk) {
          float amax = 0;
          for (int col = blk * 128; col < blk * 128 + 128; ++col)
            amax = std::max(amax, std::fabs(tokenValue(c, s, src[row], col)));
          const float f = refScale(amax, lc.roundScale);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          if (lc.ue8m0)
            want[scaleAt(e, size_t(i), blk)] = uint8_t(bits >> 23);
          else
            std::memcpy(&want[scaleAt(e, size_t(i), blk)], &bits, 4);
        }
      }
    int wrong = 0;
    for (size_t b = 0; b < scaleBytes && wrong < 5; ++b)
      if (sc[b] != want[b]) {
        ADD_FAILURE() << form << ": scale byte " << b << " is " << int(sc[b]) << ", want " << int(want[b])
                      << (lc.ue8m0 ? " (UE8M0)" : " (f32)");
        ++wrong;
      }
  }
  return y;
}

// Combine of `y` (the experts' outputs) against sum_k w_k slotFactor(k) x_t over the slots whose expert's rank is
// not masked.
// `earlierError`: the combine is to throw an earlier call's error naming all of these texts, once it was launched.
void checkCombine(const Job& j, const LlCase& lc, const Inputs& in, const ep::LowLatencyHandle& h,
                  const std::vector<uint16_t>& y, const std::string& form, ep::LowLatencyHook* hook = nullptr,
                  const std::vector<std::string>* earlierError = nullptr) {
  const Case& c = lc.c;
  const int me = j.ctx.rank(), H = c.hidden, K = c.topk;
  Dev dy(y.size() * 2), out(size_t(in.n) * H * 2), cost(size_t(j.R) * 8);
  dy.put(y.data(), y.size() * 2);
  GDX_TEST_CUDA(cudaMemset(cost.p, 0, cost.bytes));
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  ep::LowLatencyCombineInputs ci{dy.p, in.idx->as<int64_t>(), in.w->as<float>(), cost.as<int64_t>()};
  try {
    j.buf.lowLatencyCombine(ci, h, out.p, j.stream, hook);
    if (earlierError) ADD_FAILURE() << form << ": the earlier call's error was not thrown";
  } catch (const Error& e) {
    if (!earlierError) throw;
    for (const std::string& text : *earlierError)
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << form << ": " << e.what();
  }
  if (hook) hook->run(j.stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(j.stream));
  j.buf.checkErrors();
  const std::vector<bool> masked = maskOf(j);
  auto got = out.get<uint16_t>(size_t(in.n) * H);
  std::vector<double> ref(got.size()), g(got.size());
  for (int t = 0; t < in.n; ++t) {
    for (int k = 0; k < K; ++k) {
      const int64_t e = in.hidx[size_t(t) * K + k];
      if (e < 0 || masked[e / j.L]) continue;
      const double w = in.hw[size_t(t) * K + k];
      for (int i = 0; i < H; ++i)
        ref[size_t(t) * H + i] += w * floatOfBf16(bf16Of(slotFactor(k) * tokenValue(c, me, t, i)));
    }
    for (int i = 0; i < H; ++i) g[size_t(t) * H + i] = floatOfBf16(got[size_t(t) * H + i]);
  }
  EXPECT_LT(calcDiff(ref, g), lc.fp8 ? 9e-4 : 1e-5) << form << ": combine calc_diff";
  // The wait statistics: cycles for each rank a token of this rank went to (not masked), none for a rank of this host
  // no token went to (a rank of another host is waited for, by its signal, either way).
  const auto cycles = cost.get<int64_t>(j.R);
  std::vector<bool> sentTo(j.R, false);
  for (int64_t e : in.hidx)
    if (e >= 0) sentTo[e / j.L] = true;
  for (int r = 0; r < j.R; ++r) {
    if (masked[r]) continue;
    if (sentTo[r])
      EXPECT_GT(cycles[r], 0) << form << ": combine wait cycles for rank " << r;
    else if (r == me || j.ctx.isDirect(r))
      EXPECT_EQ(cycles[r], 0) << form << ": combine wait cycles for rank " << r << ", which no token went to";
    EXPECT_LT(cycles[r], int64_t(1) << 50) << form << ": combine wait cycles for rank " << r;
  }
}

// A dispatch's statistics after `calls` dispatches into the same outputs: cumulative_local_expert_recv_stats is the sum
// of the counts, exactly; every rank not masked was waited for (its counts), none past all plausibility.
void checkDispatchStats(const Job& j, const Outputs& o, int calls, const std::string& form) {
  const auto counts = o.count->get<int32_t>(j.L), stats = o.recvStats->get<int32_t>(j.L);
  for (int e = 0; e < j.L; ++e)
    EXPECT_EQ(stats[e], calls * counts[e]) << form << ": received-rows stats of expert " << e;
  const auto cycles = o.waitCost->get<int64_t>(j.R);
  const std::vector<bool> masked = maskOf(j);
  for (int r = 0; r < j.R; ++r) {
    if (!masked[r]) EXPECT_GT(cycles[r], 0) << form << ": dispatch wait cycles for rank " << r;
    EXPECT_LT(cycles[r], int64_t(1) << 50) << form << ": dispatch wait cycles for rank " << r;
  }
}

void runCase(const Job& j, const LlCase& lc, bool withHook) {
  const Case& c = lc.c;
  SCOPED_TRACE(c.name + (withHook ? " (hook)" : "") + ", rank " + std::to_string(j.ctx.rank()));
  Inputs in = makeInputs(j, c);
  const auto allIdx = allGather(j.ctx, in.hidx);
  Outputs o(j, c, lc.fp8);
  ep::LowLatencyHandle h = j.buf.newHandle();
  ep::LowLatencyHook hook;
  ep::LowLatencyDispatchInputs di{in.x->p, in.idx->as<int64_t>(), in.n, c.topk, lc.fp8, lc.roundScale, lc.ue8m0};
  j.buf.lowLatencyDispatch(di, o.out, h, j.stream, withHook ? &hook : nullptr);
  if (withHook) {
    EXPECT_TRUE(hook.pending());
    hook.run(j.stream);
  }
  GDX_TEST_CUDA(cudaStreamSynchronize(j.stream));
  j.buf.checkErrors();
  const auto y = checkDispatch(j, lc, o, h, allIdx, "dispatch");
  checkDispatchStats(j, o, 1, "dispatch");
  checkCombine(j, lc, in, h, y, "combine", withHook ? &hook : nullptr);
  j.ctx.barrier();
}

// Rank 0's tokens in a case on R ranks that leaves `spare` (21 or more) of the buffer's T tokens a rank free on rank 3:
// rank r sends n + 7 r (tokensOf), so past four ranks n gives back what the later ranks add, and rank R - 1 still
// sends at most T - spare + 21. On two and four ranks it is T - spare.
int firstRankTokens(int T, int R, int spare = 24) {
  return T - spare - 7 * std::max(0, R - 4);
}

std::vector<LlCase> cases(int T, int R) {
  const int n = firstRankTokens(T, R);
  std::vector<LlCase> v;
  auto add = [&](Case c, bool fp8, bool round = false, bool ue8m0 = false) {
    v.push_back({c, fp8, round, 8, 512, 128, ue8m0});
  };
  add({"bf16 H2048 K4 E16", n, 2048, 4, 16, false}, false);
  add({"bf16 holes H2048 K8 E32", n, 2048, 8, 32, false, Values::kRandom, Routing::kWithHoles, -1, 1, 3}, false);
  add({"fp8 H7168 K8 E288", n, 7168, 8, 288, true, Values::kRandom, Routing::kRandom, -1, 1, 5}, true);
  add({"fp8 ue8m0 holes H4096 K6 E64", n, 4096, 6, 64, true, Values::kRandom, Routing::kWithHoles, -1, 1, 7}, true,
      true, true);
  add({"fp8 round scales H2048 K8 E32", n, 2048, 8, 32, true, Values::kRandom, Routing::kRandom, -1, 1, 8}, true, true);
  // UE8M0 where the last group of four scales is partial (nine blocks: two groups and one byte).
  add({"fp8 ue8m0 odd blocks H1152 K8 E16", n, 1152, 8, 16, true, Values::kRandom, Routing::kRandom, -1, 1, 10}, true,
      true, true);
  add({"bf16 rank 1 sends nothing H2048 K8 E16", n, 2048, 8, 16, false, Values::kRandom, Routing::kRandom, 1, 1, 9},
      false);
  add({"fp8 one expert H2048 K8 E16", n, 2048, 8, 16, true, Values::kRandom, Routing::kOneExpert, -1, 1, 11}, true);
  add({"bf16 duplicates H2048 K8 E16", n, 2048, 8, 16, false, Values::kRandom, Routing::kDuplicates, -1, 1, 13}, false);
  add({"fp8 duplicates H4096 K6 E32", n, 4096, 6, 32, true, Values::kRandom, Routing::kDuplicates, -1, 1, 15}, true);
  // The shapes at the edges: an odd number of 128-element blocks (the last FP8 step half empty), the largest top-k,
  // the smallest and the largest blocks, and few blocks (each sends and receives many tokens).
  v.push_back({{"fp8 odd blocks H1152 K16 E32, 3 blocks x 64 threads", n, 1152, 16, 32, true, Values::kRandom,
                Routing::kRandom, -1, 1, 17},
               true,
               false,
               16,
               64,
               3});
  v.push_back({{"bf16 odd blocks H384 K3 E16, 1024 threads", n, 384, 3, 16, false, Values::kRandom, Routing::kWithHoles,
                -1, 1, 19},
               false,
               false,
               8,
               1024,
               128});
  return v;
}

// A buffer per case (its hidden size and experts); each case runs plain and through a hook.
void runCases(Context& ctx, cudaStream_t stream, int T) {
  for (const LlCase& lc : cases(T, ctx.worldSize())) {
    ep::LowLatencyConfig cfg{T, lc.c.hidden, lc.c.experts, lc.maxTopk, lc.numSms, lc.numThreads};
    ep::LowLatencyBuffer buf(ctx, cfg);
    Job j{ctx, buf, stream, ctx.worldSize(), lc.c.experts / ctx.worldSize()};
    runCase(j, lc, false);
    runCase(j, lc, true);
  }
}

// Two dispatches in flight through hooks (two micro-batches), the error of a third, then both hooks and both
// results checked; bad arguments refused before anything is sent.
void doubleBuffering(Context& ctx, cudaStream_t stream, int T) {
  LlCase a{{"micro-batch a H2048 K4 E16", firstRankTokens(T, ctx.worldSize()), 2048, 4, 16, false, Values::kRandom,
            Routing::kRandom, -1, 1, 21}};
  LlCase b{{"micro-batch b H2048 K4 E16", firstRankTokens(T, ctx.worldSize(), 30), 2048, 4, 16, false, Values::kRandom,
            Routing::kWithHoles, -1, 1, 23}};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 2048, 16, 4});
  Job j{ctx, buf, stream, ctx.worldSize(), 16 / ctx.worldSize()};
  Inputs ia = makeInputs(j, a.c), ib = makeInputs(j, b.c);
  const auto allA = allGather(ctx, ia.hidx), allB = allGather(ctx, ib.hidx);
  Outputs oa(j, a.c, false), ob(j, b.c, false), oc(j, a.c, false);
  ep::LowLatencyHandle ha = buf.newHandle(), hc = buf.newHandle();
  auto filled = std::make_unique<ep::LowLatencyHandle>(buf.newHandle());
  ep::LowLatencyHook hookA, hookB, hookC;
  buf.lowLatencyDispatch({ia.x->p, ia.idx->as<int64_t>(), ia.n, 4, false}, oa.out, ha, stream, &hookA);
  buf.lowLatencyDispatch({ib.x->p, ib.idx->as<int64_t>(), ib.n, 4, false}, ob.out, *filled, stream, &hookB);
  // The handle micro-batch b filled is copied and destroyed before its hook runs: the hook keeps the memory it
  // receives into, and the copy sees the receive (combine takes it).
  const ep::LowLatencyHandle hb = *filled;
  filled.reset();
  expectThrowContaining(
      [&] {
        buf.lowLatencyDispatch({ia.x->p, ia.idx->as<int64_t>(), ia.n, 4, false}, oc.out, hc, stream, &hookC);
      },
      "two calls are in flight", "third call");
  expectThrowContaining([&] { hookB.run(stream); }, "hooks run in the order", "hook out of order");
  hookA.run(stream);
  hookB.run(stream);
  expectThrowContaining([&] { hookB.run(stream); }, "nothing to receive", "hook run twice");
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  const auto ya = checkDispatch(j, a, oa, ha, allA, "micro-batch a");
  const auto yb = checkDispatch(j, b, ob, hb, allB, "micro-batch b");
  checkCombine(j, a, ia, ha, ya, "micro-batch a combine");
  checkCombine(j, b, ib, hb, yb, "micro-batch b combine");
  ep::LowLatencyDispatchInputs tooMany{ia.x->p, ia.idx->as<int64_t>(), T + 1, 4, false};
  expectThrowContaining([&] { buf.lowLatencyDispatch(tooMany, oa.out, ha, stream); }, "at most", "too many tokens");
  ep::LowLatencyDispatchInputs topk{ia.x->p, ia.idx->as<int64_t>(), ia.n, 5, false};
  expectThrowContaining([&] { buf.lowLatencyDispatch(topk, oa.out, ha, stream); }, "numTopk 5", "top-k");
  expectThrowContaining(
      [&] {
        buf.lowLatencyCombine({nullptr, nullptr, nullptr}, hc, nullptr, stream);
      },
      "not one a dispatch", "unfilled handle");
  ctx.barrier();
}

// The last rank's tokens name one expert in every slot: more rows than maxTokensPerRank for that expert. Its dispatch
// is refused before anything is sent, with an error naming the rank, a token and the expert; the others receive no
// row from it, its combine sums nothing, and the buffer works afterwards.
void refusedTopk(Context& ctx, cudaStream_t stream, int T) {
  const int R = ctx.worldSize(), me = ctx.rank(), culprit = R - 1, expert = 3;
  LlCase lc{{"refused top-k H2048 K4 E16", firstRankTokens(T, R), 2048, 4, 16, false, Values::kRandom, Routing::kRandom,
             -1, 1, 41}};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 2048, 16, 4});
  Job j{ctx, buf, stream, R, 16 / R};
  Inputs in = makeInputs(j, lc.c);
  if (me == culprit) {
    std::fill(in.hidx.begin(), in.hidx.end(), expert);
    in.idx->put(in.hidx.data(), in.hidx.size() * 8);
  }
  auto received = allGather(ctx, in.hidx);
  std::fill(received[culprit].begin(), received[culprit].end(), -1);  // what the others get from it: nothing
  Outputs o(j, lc.c, false);
  ep::LowLatencyHandle h = buf.newHandle();
  buf.lowLatencyDispatch({in.x->p, in.idx->as<int64_t>(), in.n, 4, false}, o.out, h, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  const auto y = checkDispatch(j, lc, o, h, received, "dispatch with a refused top-k");
  if (me == culprit) std::fill(in.hidx.begin(), in.hidx.end(), -1);  // its reference: every sum zero
  // The culprit hears of the refusal from its next call, the combine, which is thrown only once that call was
  // launched: its results are checked like everyone's, and no rank waits for a call the culprit skipped.
  const std::vector<std::string> texts{"rank " + std::to_string(culprit) + ": low_latency_dispatch refused",
                                       "token 0 names expert 3", "naming expert 3 (" + std::to_string(in.n * 4) + ")"};
  checkCombine(j, lc, in, h, y, "combine after a refused top-k", nullptr, me == culprit ? &texts : nullptr);
  EXPECT_TRUE(buf.maskedRanks().empty()) << "a rank was masked after the refused top-k";
  runCase(j,
          {{"after a refused top-k: duplicates H2048 K4 E16", firstRankTokens(T, R), 2048, 4, 16, false,
            Values::kRandom, Routing::kDuplicates, -1, 1, 43}},
          true);
}

// Dispatch + combine captured in a CUDA graph and replayed 100 times: the same rows and sums every time.
// `firstEpoch`: where the buffer's epochs start (ep::detail::startEpochsAt; 0: at the start).
void graphReplays(Context& ctx, cudaStream_t stream, int T, uint64_t firstEpoch = 0) {
  LlCase lc{{"graph fp8 H2048 K8 E32", firstRankTokens(T, ctx.worldSize()), 2048, 8, 32, true, Values::kRandom,
             Routing::kWithHoles, -1, 1, 31},
            true};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 2048, 32, 8});
  if (firstEpoch) {
    ep::detail::startEpochsAt(buf, firstEpoch);
    ctx.barrier();  // every rank's epochs set before any call writes into another's window
  }
  Job j{ctx, buf, stream, ctx.worldSize(), 32 / ctx.worldSize()};
  Inputs in = makeInputs(j, lc.c);
  const auto allIdx = allGather(ctx, in.hidx);
  Outputs o(j, lc.c, true);
  ep::LowLatencyHandle h = buf.newHandle();
  const size_t rows = size_t(j.L) * T * j.R;
  Dev ones(rows * 2048 * 2), out(size_t(in.n) * 2048 * 2);
  std::vector<uint16_t> one(rows * 2048, bf16Of(1.0f));
  ones.put(one.data(), one.size() * 2);
  // Warm-up outside the graph fills the handle's host-side shape (the combine's checks need a received dispatch).
  ep::LowLatencyDispatchInputs di{in.x->p, in.idx->as<int64_t>(), in.n, 8, true};
  buf.lowLatencyDispatch(di, o.out, h, stream);
  buf.lowLatencyCombine({ones.p, in.idx->as<int64_t>(), in.w->as<float>()}, h, out.p, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // Global mode, CUDA's and torch's default: the capture is invalidated by any thread of the process making an unsafe
  // CUDA call meanwhile, so this also shows that gdx's own threads (proxy, transports) make none.
  GDX_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  buf.lowLatencyDispatch(di, o.out, h, stream);
  buf.lowLatencyCombine({ones.p, in.idx->as<int64_t>(), in.w->as<float>()}, h, out.p, stream);
  GDX_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  GDX_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 100; ++i) {
    GDX_TEST_CUDA(cudaMemsetAsync(o.out.recvCount, 0xEE, size_t(j.L) * 4, stream));
    GDX_TEST_CUDA(cudaMemsetAsync(out.p, 0xEE, size_t(in.n) * 2048 * 2, stream));
    GDX_TEST_CUDA(cudaGraphLaunch(exec, stream));
    if (i % 33 != 0 && i != 99) continue;
    GDX_TEST_CUDA(cudaStreamSynchronize(stream));
    buf.checkErrors();
    checkDispatch(j, lc, o, h, allIdx, "graph replay " + std::to_string(i));
    checkDispatchStats(j, o, i + 2, "graph replay " + std::to_string(i));  // the warm-up's dispatch and i + 1 replays
    // Every expert returns ones: each token's sum is the sum of its weights.
    auto got = out.get<uint16_t>(size_t(in.n) * 2048);
    for (int t = 0; t < in.n; ++t) {
      float wsum = 0;
      for (int k = 0; k < 8; ++k)
        if (in.hidx[size_t(t) * 8 + k] >= 0) wsum += in.hw[size_t(t) * 8 + k];
      EXPECT_NEAR(floatOfBf16(got[size_t(t) * 2048 + 5]), wsum, wsum / 128 + 1e-6) << "replay " << i << " token " << t;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ctx.barrier();
}

constexpr int kT = 64;

// A plain dispatch of `in` (top-k `topk`) into `o`, waited for: the seconds it took.
double timedDispatch(const Job& j, const Inputs& in, int topk, bool fp8, const Outputs& o, ep::LowLatencyHandle& h) {
  const auto t0 = std::chrono::steady_clock::now();
  j.buf.lowLatencyDispatch({in.x->p, in.idx->as<int64_t>(), in.n, topk, fp8}, o.out, h, j.stream);
  EXPECT_CUDA_OK(cudaStreamSynchronize(j.stream));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The kernels of a stream's capture: (demangled name, function) per kernel node, in no particular order.
std::vector<std::pair<std::string, const void*>> capturedKernels(cudaStream_t stream,
                                                                 const std::function<void()>& calls) {
  cudaGraph_t graph;
  EXPECT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  calls();
  EXPECT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  size_t n = 0;
  EXPECT_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<std::pair<std::string, const void*>> kernels;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    EXPECT_CUDA_OK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams p{};
    EXPECT_CUDA_OK(cudaGraphKernelNodeGetParams(node, &p));
    const char* name = nullptr;
    EXPECT_CUDA_OK(cudaFuncGetName(&name, p.func));
    int status = 0;
    char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    kernels.push_back({status == 0 && demangled ? std::string(demangled) : std::string(name), p.func});
    std::free(demangled);
  }
  // Run it once (every rank captured the same calls; the buffer's epochs advance on every rank alike).
  cudaGraphExec_t exec;
  EXPECT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_CUDA_OK(cudaGraphLaunch(exec, stream));
  EXPECT_CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return kernels;
}

int namesContaining(const std::vector<std::pair<std::string, const void*>>& kernels, const std::string& word) {
  int n = 0;
  for (const auto& k : kernels) n += k.first.find(word) != std::string::npos;
  return n;
}

// What a profiler shows (DeepEP's tests/utils.py bench_kineto): a call without a hook is one kernel, named
// "...::dispatch(...)" or "...::combine(...)"; with a hook, the send and the hook's receive are two launches of that
// same kernel. No other kernel of a call (nor the mask accessors') has "dispatch" or "combine" in its name.
void oneKernelPerCall(Context& ctx, cudaStream_t stream, int T) {
  LlCase lc{{"kernels fp8 H2048 K8 E16", firstRankTokens(T, ctx.worldSize()), 2048, 8, 16, true}, true};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 2048, 16, 8});
  Job j{ctx, buf, stream, ctx.worldSize(), 16 / ctx.worldSize()};
  Inputs in = makeInputs(j, lc.c);
  Outputs o(j, lc.c, true);
  ep::LowLatencyHandle h = buf.newHandle();
  Dev out(size_t(in.n) * 2048 * 2), y(size_t(j.L) * T * j.R * 2048 * 2), mask(size_t(j.R) * 4);
  ep::LowLatencyDispatchInputs di{in.x->p, in.idx->as<int64_t>(), in.n, 8, true};
  ep::LowLatencyCombineInputs ci{y.p, in.idx->as<int64_t>(), in.w->as<float>()};
  buf.lowLatencyDispatch(di, o.out, h, stream);  // the combine's checks need a received dispatch
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  const auto plain = capturedKernels(stream, [&] {
    buf.lowLatencyDispatch(di, o.out, h, stream);
    buf.lowLatencyCombine(ci, h, out.p, stream);
  });
  ASSERT_EQ(plain.size(), 2u) << "a dispatch and a combine without hooks are one kernel each";
  EXPECT_EQ(namesContaining(plain, "::dispatch("), 1) << plain[0].first << " / " << plain[1].first;
  EXPECT_EQ(namesContaining(plain, "::combine("), 1) << plain[0].first << " / " << plain[1].first;
  EXPECT_EQ(namesContaining(plain, "dispatch"), 1) << plain[0].first << " / " << plain[1].first;
  EXPECT_EQ(namesContaining(plain, "combine"), 1) << plain[0].first << " / " << plain[1].first;
  ep::LowLatencyHook hook;
  const auto hooked = capturedKernels(stream, [&] {
    buf.lowLatencyDispatch(di, o.out, h, stream, &hook);
    hook.run(stream);
    buf.lowLatencyCombine(ci, h, out.p, stream, &hook);
    hook.run(stream);
  });
  ASSERT_EQ(hooked.size(), 4u) << "send and hook: two launches per call";
  EXPECT_EQ(namesContaining(hooked, "dispatch"), 2);
  EXPECT_EQ(namesContaining(hooked, "combine"), 2);
  std::vector<const void*> funcs;
  for (const auto& k : hooked) funcs.push_back(k.second);
  std::sort(funcs.begin(), funcs.end());
  EXPECT_EQ(std::unique(funcs.begin(), funcs.end()) - funcs.begin(), 2) << "send and receive are one kernel each";
  const auto accessors = capturedKernels(stream, [&] {
    buf.queryMask(mask.as<int32_t>(), stream);
    buf.updateMask((ctx.rank() + 1) % j.R, true, stream);
    buf.updateMask((ctx.rank() + 1) % j.R, false, stream);
    buf.cleanMask(stream);
  });
  EXPECT_EQ(accessors.size(), 4u);
  EXPECT_EQ(namesContaining(accessors, "dispatch") + namesContaining(accessors, "combine"), 0);
  ctx.barrier();
}

// The mask accessors (DeepEP's shrink mode): every rank but the last masks the last, which then makes no call; their
// calls skip it (no wait, no timeout) and its tokens count as not sent; a rank masked before a call cannot come back
// after it; masked and unmasked before any call, a rank is back.
void maskAccessors(Context& ctx, cudaStream_t stream, int T) {
  const int R = ctx.worldSize(), me = ctx.rank(), last = R - 1;
  LlCase lc{{"masks bf16 H2048 K4 E16", firstRankTokens(T, R), 2048, 4, 16, false, Values::kRandom, Routing::kRandom,
             -1, 1, 51}};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 2048, 16, 4});
  Job j{ctx, buf, stream, R, 16 / R};
  Dev mask(size_t(R) * 4);
  const auto query = [&]() -> std::vector<int32_t> {
    buf.queryMask(mask.as<int32_t>(), stream);
    EXPECT_CUDA_OK(cudaStreamSynchronize(stream));
    return mask.get<int32_t>(R);
  };
  EXPECT_EQ(query(), std::vector<int32_t>(R, 0));
  expectThrowContaining([&] { buf.updateMask(me, true, stream); }, "cannot mask itself", "masking itself");
  expectThrowContaining([&] { buf.updateMask(R, true, stream); }, "outside", "masking a rank out of range");
  // Masked and unmasked before any call: back at once (updateMask, then cleanMask).
  const int other = (me + 1) % R;
  buf.updateMask(other, true, stream);
  std::vector<int32_t> want(R, 0);
  want[other] = 1;
  EXPECT_EQ(query(), want);
  EXPECT_EQ(buf.maskedRanks(), std::vector<int>{other});
  buf.updateMask(other, false, stream);
  EXPECT_EQ(query(), std::vector<int32_t>(R, 0));
  buf.updateMask(other, true, stream);
  buf.cleanMask(stream);
  EXPECT_EQ(query(), std::vector<int32_t>(R, 0));
  EXPECT_TRUE(buf.maskedRanks().empty());
  ctx.barrier();
  Inputs in = makeInputs(j, lc.c);
  const auto allIdx = allGather(ctx, in.hidx);
  if (me != last) {
    buf.updateMask(last, true, stream);
    want.assign(R, 0);
    want[last] = 1;
    for (int round = 0; round < 2; ++round) {
      Outputs o(j, lc.c, false);
      ep::LowLatencyHandle h = buf.newHandle();
      EXPECT_LT(timedDispatch(j, in, 4, false, o, h), 1.0) << "a masked rank is not waited for";
      EXPECT_EQ(query(), want);
      const auto y = checkDispatch(j, lc, o, h, allIdx, "dispatch with a rank masked by updateMask");
      checkDispatchStats(j, o, 1, "dispatch with a rank masked by updateMask");
      checkCombine(j, lc, in, h, y, "combine with a rank masked by updateMask");
    }
    expectThrowContaining([&] { buf.updateMask(last, false, stream); }, "cannot come back", "unmask after calls");
    expectThrowContaining([&] { buf.cleanMask(stream); }, "cannot come back", "clean after calls");
    EXPECT_EQ(query(), want);
  }
  ctx.barrier();
}

// DeepEP's --shrink-test: a rank stops calling (alive, it only skips its calls). The last rank skips the dispatch of
// the second round and everything after; with four ranks or more, rank 1 makes that dispatch and skips the combine
// after it. The others mask each within about GDX_TIMEOUT_MS, complete their calls without its tokens, and the next
// round skips both at once.
void rankSkipsMain() {
  Context ctx;
  const int R = ctx.worldSize(), me = ctx.rank(), skipsDispatch = R - 1, skipsCombine = R >= 4 ? 1 : -1;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LlCase lc{{"rank skips fp8 H2048 K8 E32", firstRankTokens(kT, R), 2048, 8, 32, true, Values::kRandom,
             Routing::kRandom, -1, 1, 61},
            true};
  {
    ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{kT, 2048, 32, 8});
    Job j{ctx, buf, stream, R, 32 / R};
    Inputs in = makeInputs(j, lc.c);
    const auto allIdx = allGather(ctx, in.hidx);
    Dev mask(size_t(R) * 4);
    for (int round = 0; round < 3; ++round) {
      if (round >= 1 && me == skipsDispatch) break;
      Outputs o(j, lc.c, true);
      ep::LowLatencyHandle h = buf.newHandle();
      const double sec = timedDispatch(j, in, 8, true, o, h);
      EXPECT_LT(sec, round == 1 ? 30.0 : 1.0) << "round " << round << ": the dispatch took " << sec << " s";
      buf.queryMask(mask.as<int32_t>(), stream);
      GDX_TEST_CUDA(cudaStreamSynchronize(stream));
      const auto m = mask.get<int32_t>(R);
      for (int r = 0; r < R; ++r)
        EXPECT_EQ(m[r], (round >= 1 && r == skipsDispatch) || (round >= 2 && r == skipsCombine) ? 1 : 0)
            << "round " << round << ": mask of rank " << r << " after the dispatch";
      const auto y = checkDispatch(j, lc, o, h, allIdx, "dispatch, round " + std::to_string(round));
      if (round >= 1 && me == skipsCombine) break;
      checkCombine(j, lc, in, h, y, "combine, round " + std::to_string(round));
      if (round >= 1 && skipsCombine >= 0) EXPECT_TRUE(maskOf(j)[skipsCombine]) << "round " << round;
    }
    ctx.barrier();  // the ranks that skipped wait here (GDX_BOOTSTRAP_TIMEOUT_MS is long in this test)
  }
  cudaStreamDestroy(stream);
}

// DeepEP's default shape: 288 experts on two ranks (144 local experts), hidden 7168, 128 tokens a rank, top-8: FP8
// with UE8M0 scales and plain FP8, each plain and through a hook, checked row by row and byte by byte.
void deepSeekShapeMain() {
  Context ctx;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int T = 128;
  const int R = ctx.worldSize();
  {
    ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{T, 7168, 288, 8});
    Job j{ctx, buf, stream, R, 288 / R};
    for (bool ue8m0 : {true, false}) {
      LlCase lc{{ue8m0 ? "deepseek fp8 ue8m0 H7168 K8 E288 T128" : "deepseek fp8 H7168 K8 E288 T128", T - 7 * (R - 1),
                 7168, 8, 288, true, Values::kRandom, Routing::kRandom, -1, 1, 71},
                true,
                ue8m0,
                8,
                512,
                128,
                ue8m0};
      runCase(j, lc, false);
      runCase(j, lc, true);
    }
  }
  cudaStreamDestroy(stream);
}

void childMain() {
  Context ctx;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  runCases(ctx, stream, kT);
  doubleBuffering(ctx, stream, kT);
  refusedTopk(ctx, stream, kT);
  graphReplays(ctx, stream, kT);
  oneKernelPerCall(ctx, stream, kT);
  maskAccessors(ctx, stream, kT);
  cudaStreamDestroy(stream);
}

// The 202 calls of graphReplays cross epoch 2^32 (at its 50th replay): the tagged words (dispatch counts, combine
// weights) hold 32 bits of the epoch beside their value, and must still tell this call's from an earlier one's.
void epochsPast32BitsMain() {
  Context ctx;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  graphReplays(ctx, stream, kT, (uint64_t(1) << 32) - 101);
  cudaStreamDestroy(stream);
}

// The last rank leaves right after the buffer is set up: the others' dispatch and combine complete within about
// GDX_TIMEOUT_MS with that rank masked and its experts' contributions zero, and a second call skips it at once.
void rankDiesMain() {
  Context ctx;
  const int R = ctx.worldSize(), dead = R - 1;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LlCase lc{{"rank dies H2048 K4 E16", firstRankTokens(kT, R), 2048, 4, 16, false}};
  ep::LowLatencyBuffer buf(ctx, ep::LowLatencyConfig{kT, 2048, 16, 4});
  Job j{ctx, buf, stream, R, 16 / R};
  Inputs in = makeInputs(j, lc.c);
  const auto allIdx = allGather(ctx, in.hidx);
  ctx.barrier();
  if (ctx.rank() == dead) std::_Exit(0);
  for (int round = 0; round < 2; ++round) {
    Outputs o(j, lc.c, false);
    ep::LowLatencyHandle h = buf.newHandle();
    const double s = timedDispatch(j, in, 4, false, o, h);
    EXPECT_LT(s, round == 0 ? 20.0 : 1.0) << "round " << round << ": the dispatch took " << s << " s";
    const std::vector<bool> masked = maskOf(j);
    EXPECT_TRUE(masked[dead]) << "the dead rank is not masked";
    EXPECT_FALSE(masked[ctx.rank()]);
    const auto y = checkDispatch(j, lc, o, h, allIdx, "dispatch with a dead rank");
    checkCombine(j, lc, in, h, y, "combine with a dead rank");
  }
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);  // a rank is gone: no collective teardown
}

TEST(EpLowLatencyChild, Run) {
  const char* child = std::getenv("GDX_EP_LL_CHILD");
  if (!child) GTEST_SKIP() << "runs only as a child of EpLowLatency.* (GDX_EP_LL_CHILD)";
  if (std::string(child) == "rank-dies")
    rankDiesMain();
  else if (std::string(child) == "rank-skips")
    rankSkipsMain();
  else if (std::string(child) == "deepseek")
    deepSeekShapeMain();
  else if (std::string(child) == "epochs")
    epochsPast32BitsMain();
  else
    childMain();
}

void runRanks(const std::string& mode, const std::string& timeoutMs, int ranks, int hosts = 0,
              const std::string& bootstrapTimeoutMs = "") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) gpus = 1;
  test::spawnRanks(ranks, "EpLowLatencyChild.Run", "ep-ll-test", [&](int r) {
    std::vector<std::string> env{"GDX_CUDA_DEVICE=" + std::to_string(r % gpus), "GDX_EP_LL_CHILD=" + mode,
                                 "GDX_TIMEOUT_MS=" + timeoutMs, "GDX_LOG_LEVEL=WARN"};
    if (hosts) env.push_back("GDX_HOSTS=" + std::to_string(hosts));
    if (!bootstrapTimeoutMs.empty()) env.push_back("GDX_BOOTSTRAP_TIMEOUT_MS=" + bootstrapTimeoutMs);
    return env;
  });
}

TEST(EpLowLatency, TwoRanksMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000", 2);
}

// Every peer on the direct path: four GPUs where there are four, else ranks share them.
TEST(EpLowLatency, FourRanksOnOneHostMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000", 4);
}

TEST(EpLowLatency, TwoEmulatedHostsMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000", 4, 2);
}

// Eight ranks (kMaxRanks), the shape of an 8-GPU host; ranks share GPUs where there are fewer.
TEST(EpLowLatency, EightRanksOnOneHostMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "120000", 8);
}

TEST(EpLowLatency, EightRanksOnTwoEmulatedHostsMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "120000", 8, 2);
}

TEST(EpLowLatency, CallsPast32BitEpochsMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("epochs", "10000", 2);
}

// DeepEP's default shape (test_low_latency.py): 288 experts on two ranks, hidden 7168, 128 tokens, top-8.
TEST(EpLowLatency, DeepSeekShapeOnTwoRanksMatchesTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("deepseek", "60000", 2);
}

// A rank that stops calling but stays alive (DeepEP's --shrink-test) is masked by the others within GDX_TIMEOUT_MS.
TEST(EpLowLatency, RankThatStopsCallingIsMaskedOnTwoRanks) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-skips", "3000", 2, 0, "120000");
}

TEST(EpLowLatency, RankThatStopsCallingIsMaskedOnFourRanksOfOneHost) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-skips", "3000", 4, 0, "120000");
}

// Disabled: fails on 2 x H200 (3 of 3 runs, 2026-11-28). After rank 1 skips the combine of round 1, the live rank 2
// (the other host) still waits out that combine when the round-2 dispatch of rank 0 times out on it, and rank 0 masks
// rank 2 as well (its mask reads 1, the dispatch takes GDX_TIMEOUT_MS). A skipped call costs every later call of the
// ranks that waited for it a timeout, so a mask must wait for the slowest live rank's timeout, not its own.
TEST(EpLowLatency, DISABLED_RankThatStopsCallingIsMaskedOnTwoEmulatedHosts) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-skips", "3000", 4, 2, "120000");
}

TEST(EpLowLatency, DeadRankIsMaskedOnTwoRanks) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-dies", "5000", 2);
}

TEST(EpLowLatency, DeadRankIsMaskedOnFourRanksOfOneHost) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-dies", "5000", 4);
}

TEST(EpLowLatency, DeadRankIsMaskedOnTwoEmulatedHosts) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("rank-dies", "5000", 4, 2);
}

}  // namespace
}  // namespace gdx
