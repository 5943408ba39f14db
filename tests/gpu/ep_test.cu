// gdx::ep::Buffer on two and on four ranks of one host (one GPU each where there are enough, else ranks share GPUs)
// over the direct path, and on four ranks as two emulated hosts of two (GDX_HOSTS=2: ranks on the other host through
// the proxy and TCP): layout, dispatch (prepare + send, the cached form, the numWorstTokens form) and combine, checked
// against a reference built from every rank's all-gathered top-k (tokens naming one expert in several slots
// included; calls of more rows than warps, whose rows are taken by their stamps); bad inputs; a peer that dies
// mid-dispatch. The test re-executes itself once per rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ep_reference.hpp"
#include "ep_test_support.hpp"
#include "gdx/context.hpp"
#include "gdx/ep/buffer.hpp"
#include "gpu_test_support.hpp"
#include "spawn_ranks.hpp"

namespace gdx {
namespace {

using namespace test::ep;
int kRanks = 2;  // the job's ranks (set from the Context in a child)

// The outputs of a dispatch of at most `rows` rows.
struct Received : DispatchBuffers {
  Received(const Case& c, int rows, int localExperts) : DispatchBuffers(c.hidden, c.fp8, rows, localExperts, c.topk) {}
};

// Every received row against the source token, byte for byte; top-k, weights and source index too.
void checkRows(const Case& c, int me, const std::vector<ExpectedRow>& rows, const Received& r, const char* form) {
  const size_t xb = size_t(c.hidden) * (c.fp8 ? 1 : 2);
  const int n = int(rows.size()), ns = c.hidden / 128, K = c.topk, epr = c.experts / kRanks;
  auto x = r.x->get<unsigned char>(n * xb);
  auto sc = r.scales->get<float>(c.fp8 ? size_t(n) * ns : 0);
  auto idx = r.idx->get<int64_t>(size_t(n) * K);
  auto w = r.weights->get<float>(size_t(n) * K);
  auto src = r.src->get<int32_t>(n);
  std::vector<unsigned char> expect(xb);
  int bad = 0;
  for (int i = 0; i < n && bad < 5; ++i) {
    const ExpectedRow& e = rows[i];
    tokenBytes(c, e.source, e.token, expect.data());
    const bool ok = std::memcmp(&x[i * xb], expect.data(), xb) == 0;
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << form << ": row " << i << " (rank " << e.source << " token " << e.token << ") differs";
    if (c.values == Values::kRankValued && !c.fp8)
      EXPECT_EQ(floatOfBf16(uint16_t(x[i * xb] | x[i * xb + 1] << 8)), float(e.source)) << "row " << i;
    EXPECT_EQ(src[i], e.token) << form << ": source index of row " << i;
    for (int j = 0; j < (c.fp8 ? ns : 0); ++j)
      EXPECT_EQ(sc[size_t(i) * ns + j], scaleOf(c, e.source, e.token, j)) << form << ": scale " << j << " row " << i;
    std::vector<int64_t> sIdx;
    std::vector<float> sW;
    routing(c, e.source, sIdx, sW);
    for (int k = 0; k < K; ++k) {
      const int64_t g = sIdx[size_t(e.token) * K + k];
      const bool local = g >= 0 && g / epr == me;
      EXPECT_EQ(idx[size_t(i) * K + k], local ? g - me * epr : -1) << form << ": top-k " << k << " of row " << i;
      EXPECT_EQ(w[size_t(i) * K + k], local ? sW[size_t(e.token) * K + k] : 0.f) << form << ": weight, row " << i;
    }
  }
}

void runCase(Context& ctx, ep::Buffer& buf, const Case& c, cudaStream_t stream) {
  const int me = ctx.rank(), n = c.tokensOf(me), K = c.topk, H = c.hidden, epr = c.experts / kRanks;
  SCOPED_TRACE(c.name + ", rank " + std::to_string(me));
  const size_t xb = size_t(H) * (c.fp8 ? 1 : 2);
  std::vector<unsigned char> hx(n * xb);
  std::vector<float> hs(size_t(n) * (H / 128));
  for (int t = 0; t < n; ++t) {
    tokenBytes(c, me, t, &hx[t * xb]);
    for (int j = 0; j < H / 128; ++j) hs[size_t(t) * (H / 128) + j] = scaleOf(c, me, t, j);
  }
  std::vector<int64_t> idx;
  std::vector<float> w;
  routing(c, me, idx, w);
  Dev x(hx.size()), s(hs.size() * 4), di(idx.size() * 8), dw(w.size() * 4);
  x.put(hx.data(), hx.size());
  s.put(hs.data(), hs.size() * 4);
  di.put(idx.data(), idx.size() * 8);
  dw.put(w.data(), w.size() * 4);
  const auto allIdx = allGather(ctx, idx);

  // Layout against the host's count of this rank's top-k.
  Dev perRank(kRanks * 4), perExpert(c.experts * 4), inRank(size_t(n) * kRanks);
  buf.getDispatchLayout(di.as<int64_t>(), n, K, c.experts, perRank.as<int32_t>(), perExpert.as<int32_t>(),
                        inRank.as<bool>(), stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<int> wantRank(kRanks, 0), wantExpert(c.experts, 0);
  std::vector<unsigned char> wantIn(size_t(n) * kRanks, 0);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k)
      if (idx[size_t(t) * K + k] >= 0) {
        const int64_t e = idx[size_t(t) * K + k];
        ++wantExpert[e];
        wantIn[size_t(t) * kRanks + e / epr] = 1;
      }
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < kRanks; ++d) wantRank[d] += wantIn[size_t(t) * kRanks + d];
  EXPECT_EQ(perRank.get<int32_t>(kRanks), std::vector<int32_t>(wantRank.begin(), wantRank.end()));
  EXPECT_EQ(perExpert.get<int32_t>(c.experts), std::vector<int32_t>(wantExpert.begin(), wantExpert.end()));
  EXPECT_EQ(inRank.get<unsigned char>(size_t(n) * kRanks), wantIn);

  // Prepare: counts against the all-gathered reference.
  ep::DispatchInputs in{x.p,
                        c.fp8 ? s.as<float>() : nullptr,
                        di.as<int64_t>(),
                        dw.as<float>(),
                        n,
                        H,
                        K,
                        c.experts,
                        c.fp8 ? ep::DType::kFloat8E4M3 : ep::DType::kBFloat16};
  ep::DispatchHandle h = buf.newHandle(n);
  ep::DispatchCounts counts = buf.dispatchPrepare(in, h, c.alignment, stream);
  const std::vector<ExpectedRow> rows = expectedRows(c, me, kRanks, allIdx);
  const int numRecv = int(rows.size());
  ASSERT_EQ(counts.numRecvTokens, numRecv);
  std::vector<int> wantPerExpert(epr, 0);
  for (int src = 0; src < kRanks; ++src)
    for (int64_t e : allIdx[src])
      if (e >= 0 && e / epr == me) ++wantPerExpert[e - me * epr];
  for (int& v : wantPerExpert) v = (v + c.alignment - 1) / c.alignment * c.alignment;
  EXPECT_EQ(counts.numRecvTokensPerExpert, wantPerExpert);

  // The counts matrix (DeepEP's rank_prefix_matrix before its prefix sum): [s][d] = rows rank s sends to rank d.
  std::vector<int32_t> matrix(size_t(kRanks) * kRanks, -1), wantMatrix(matrix.size(), 0);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  GDX_TEST_CUDA(
      cudaMemcpy(matrix.data(), buf.countsMatrix(h), matrix.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (int d = 0; d < kRanks; ++d)
    for (const ExpectedRow& r : expectedRows(c, d, kRanks, allIdx)) ++wantMatrix[size_t(r.source) * kRanks + d];
  EXPECT_EQ(matrix, wantMatrix) << "countsMatrix";

  Received first(c, numRecv, epr);
  buf.dispatch(in, h, first.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  checkRows(c, me, rows, first, "dispatch");

  // Cached form (no top-k): the same rows.
  Received cached(c, numRecv, epr);
  ep::DispatchInputs cin = in;
  cin.topkIdx = nullptr;
  cin.topkWeights = nullptr;
  buf.dispatch(cin, h, cached.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(cached.x->get<unsigned char>(numRecv * xb), first.x->get<unsigned char>(numRecv * xb)) << "cached form";
  EXPECT_EQ(cached.src->get<int32_t>(numRecv), first.src->get<int32_t>(numRecv)) << "cached form";

  // numWorstTokens form: no host sync, outputs sized for the worst case; same rows, counts on the device.
  int worst = 0;
  for (int r = 0; r < kRanks; ++r) worst += c.tokensOf(r);
  ep::DispatchHandle hw = buf.newHandle(worst);  // with relays: as many tokens as any rank sends (buffer.hpp)
  Received wr(c, worst, epr);
  buf.dispatchWorst(in, hw, wr.out, worst, c.alignment, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  EXPECT_EQ(wr.numRecv->get<int32_t>(1)[0], numRecv);
  EXPECT_EQ(wr.perExpert->get<int32_t>(epr), std::vector<int32_t>(wantPerExpert.begin(), wantPerExpert.end()));
  checkRows(c, me, rows, wr, "worst form");

  // Combine: the experts' outputs (BF16, a value per source token and column) back to their tokens, summed.
  std::vector<uint16_t> y(size_t(numRecv) * H);
  for (int i = 0; i < numRecv; ++i)
    for (int j = 0; j < H; ++j) y[size_t(i) * H + j] = bf16Of(expertValue(c, rows[i].source, rows[i].token, j));
  Dev dy(y.size() * 2), bias(size_t(n) * H * 2), outA(size_t(n) * H * 2), outB(size_t(n) * H * 2),
      outW(size_t(n) * K * 4);
  dy.put(y.data(), y.size() * 2);
  std::vector<uint16_t> hb(size_t(n) * H);
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = bf16Of(float(i % 7) - 3.0f);
  bias.put(hb.data(), hb.size() * 2);
  const bool withBias = c.seed % 2 == 1;
  ep::CombineInputs ci{dy.p, first.weights->as<float>(), withBias ? bias.p : nullptr, nullptr};
  // A bias the kernel could not read with 16-byte loads is refused on the host (every rank alike), not trapped on.
  ep::CombineInputs misaligned = ci;
  misaligned.bias1 = static_cast<char*>(bias.p) + 2;
  expectThrowContaining(
      [&] {
        buf.combine(misaligned, h, ep::CombineOutputs{outA.p, nullptr}, stream);
      },
      "16-byte aligned", "misaligned bias");
  buf.combine(ci, h, ep::CombineOutputs{outA.p, outW.as<float>()}, stream);
  buf.combine(ci, hw, ep::CombineOutputs{outB.p, nullptr}, stream);  // the worst form's handle: the same sums
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  auto gotA = outA.get<uint16_t>(size_t(n) * H), gotB = outB.get<uint16_t>(size_t(n) * H);
  EXPECT_EQ(gotA, gotB) << "combine along the worst form's handle";
  std::vector<double> ref(size_t(n) * H), got(size_t(n) * H);
  for (int t = 0; t < n; ++t) {
    int dests = 0;
    for (int d = 0; d < kRanks; ++d) dests += wantIn[size_t(t) * kRanks + d];
    for (int j = 0; j < H; ++j) {
      const size_t i = size_t(t) * H + j;
      ref[i] = dests * double(floatOfBf16(bf16Of(expertValue(c, me, t, j)))) + (withBias ? floatOfBf16(hb[i]) : 0.0);
      got[i] = floatOfBf16(gotA[i]);
    }
  }
  const double diff = calcDiff(ref, got);
  EXPECT_LT(diff, 5e-6) << "combine calc_diff";
  auto gotW = outW.get<float>(size_t(n) * K);
  for (size_t i = 0; i < gotW.size(); ++i)
    EXPECT_NEAR(gotW[i], idx[i] >= 0 ? w[i] : 0.f, 1e-6) << "combined weight " << i;
  ctx.barrier();
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"bf16 random H7168 K8 E256", 256, 7168, 8, 256, false});
  v.push_back({"bf16 rank-valued H2048 K1 E8", 128, 2048, 1, 8, false, Values::kRankValued});
  v.push_back({"fp8 H4096 K4 E64", 300, 4096, 4, 64, true, Values::kRandom, Routing::kRandom, -1, 1, 3});
  v.push_back(
      {"bf16 holes H2048 K2 E288 align 4", 513, 2048, 2, 288, false, Values::kRandom, Routing::kWithHoles, -1, 4, 5});
  v.push_back(
      {"bf16 rank 1 sends nothing H2048 K8 E16", 200, 2048, 8, 16, false, Values::kRandom, Routing::kRandom, 1, 1, 7});
  v.push_back(
      {"bf16 one expert H7168 K8 E32", 100, 7168, 8, 32, false, Values::kRandom, Routing::kOneExpert, -1, 1, 9});
  v.push_back({"fp8 holes H7168 K3 E8", 64, 7168, 3, 8, true, Values::kRandom, Routing::kWithHoles, -1, 1, 11});
  v.push_back({"bf16 H5120 K5 E40", 96, 5120, 5, 40, false, Values::kRandom, Routing::kRandom, -1, 1, 13});
  v.push_back(
      {"bf16 rank-valued H3072 K6 E96", 77, 3072, 6, 96, false, Values::kRankValued, Routing::kRandom, -1, 1, 15});
  v.push_back({"fp8 H6144 K7 E128", 150, 6144, 7, 128, true, Values::kRandom, Routing::kRandom, -1, 1, 17});
  // Tokens naming one expert in two or three slots: sent once per rank, each slot listed with its weight, counted
  // once per slot (DeepEP's num_tokens_per_expert), summed once per rank in combine.
  v.push_back(
      {"bf16 duplicates H2048 K8 E16", 90, 2048, 8, 16, false, Values::kRandom, Routing::kDuplicates, -1, 1, 19});
  // More rows than the kernels have warps, so that whole rows are stamped and taken as they arrive (protocol.hpp,
  // "Row stamps") on two ranks and on four, in dispatch and in combine.
  v.push_back(
      {"bf16 many tokens H2048 K8 E64", 2048, 2048, 8, 64, false, Values::kRandom, Routing::kRandom, -1, 1, 21});
  v.push_back({"fp8 many tokens H4096 K4 E64", 1536, 4096, 4, 64, true, Values::kRandom, Routing::kRandom, -1, 1, 23});
  return v;
}

// Ranks this one reaches through the proxy (on another emulated host).
int remoteRanks(const Context& ctx) {
  int remote = 0;
  for (int p = 0; p < ctx.worldSize(); ++p) remote += p != ctx.rank() && !ctx.isDirect(p);
  if (std::getenv("GDX_HOSTS")) EXPECT_GT(remote, 0) << "emulated hosts, yet every rank is on the direct path";
  return remote;
}

// Bad inputs: refused with a clear error before anything is sent; the Buffer goes on working afterwards.
void badInputs(Context& ctx, ep::Buffer& buf, cudaStream_t stream) {
  const int me = ctx.rank();
  Case c{"bad", 32, 2048, 4, 16, false};
  std::vector<int64_t> idx;
  std::vector<float> w;
  routing(c, me, idx, w);
  const int n = c.tokensOf(me);
  Dev x(size_t(n) * 4096), di(idx.size() * 8), dw(w.size() * 4);
  dw.put(w.data(), w.size() * 4);
  ep::DispatchHandle h = buf.newHandle(1 << 16);
  auto input = [&](int experts, int hidden, int dtype) {
    return ep::DispatchInputs{
        x.p, nullptr, di.as<int64_t>(), dw.as<float>(), n, hidden, c.topk, experts, static_cast<ep::DType>(dtype)};
  };
  di.put(idx.data(), idx.size() * 8);
  expectThrowContaining([&] { buf.dispatchPrepare(input(17, 2048, 0), h, 1, stream); }, "17 experts", "E % R != 0");
  expectThrowContaining([&] { buf.dispatchPrepare(input(16, 100, 0), h, 1, stream); }, "hidden size 100", "hidden");
  expectThrowContaining([&] { buf.dispatchPrepare(input(16, 2048, 7), h, 1, stream); }, "dtype 7", "dtype");
  const int tooMany = buf.maxTokensPerRank(2048, c.topk, ep::DType::kBFloat16) + 1;
  ep::DispatchHandle big = buf.newHandle(tooMany);
  ep::DispatchInputs many = input(16, 2048, 0);
  many.numTokens = tooMany;
  expectThrowContaining([&] { buf.dispatchPrepare(many, big, 1, stream); }, "more than the buffer holds", "capacity");

  // An expert id out of range on one rank: every rank throws, naming the rank and the value.
  for (int culprit = 0; culprit < kRanks; ++culprit) {
    std::vector<int64_t> badIdx = idx;
    const int64_t value = culprit == 0 ? 300 : -5;
    if (me == culprit && n > 3) badIdx[3 * c.topk + 1] = value;
    di.put(badIdx.data(), badIdx.size() * 8);
    const std::string text =
        me == culprit ? "expert id " + std::to_string(value) : "rank " + std::to_string(culprit) + " found bad input";
    expectThrowContaining([&] { buf.dispatchPrepare(input(16, 2048, 0), h, 1, stream); }, text, "bad expert id");
    // The same through the worst form: nothing is written to the outputs, the error comes with checkErrors().
    Received r(c, 2 * 64, c.experts / kRanks);
    buf.dispatchWorst(input(16, 2048, 0), h, r.out, 2 * 64, 1, stream);
    GDX_TEST_CUDA(cudaStreamSynchronize(stream));
    expectThrowContaining([&] { buf.checkErrors(); }, text, "bad expert id, worst form");
    auto bytes = r.x->get<unsigned char>(2 * 64 * 4096);
    EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0xEE; }))
        << "rows were written although the input was refused";
  }
  di.put(idx.data(), idx.size() * 8);
  // An expert id out of range in the last rank's getDispatchLayout, a call of its own: it hears of it from its next
  // call, a prepare, once that was made like everyone's; so no rank waits for it, and the Buffer goes on for all.
  {
    std::vector<int64_t> badIdx = idx;
    if (me == kRanks - 1 && n > 0) badIdx[0] = 999;
    Dev bi(badIdx.size() * 8), perRank(kRanks * 4), perExpert(16 * 4), inRank(size_t(n) * kRanks + 16);
    bi.put(badIdx.data(), badIdx.size() * 8);
    buf.getDispatchLayout(bi.as<int64_t>(), n, c.topk, 16, perRank.as<int32_t>(), perExpert.as<int32_t>(),
                          inRank.as<bool>(), stream);
    GDX_TEST_CUDA(cudaStreamSynchronize(stream));
    ep::DispatchHandle after = buf.newHandle(n);
    if (me == kRanks - 1 && n > 0)
      expectThrowContaining([&] { buf.dispatchPrepare(input(16, 2048, 0), after, 1, stream); }, "expert id 999",
                            "getDispatchLayout's bad id, thrown after the prepare");
    else
      EXPECT_GE(buf.dispatchPrepare(input(16, 2048, 0), after, 1, stream).numRecvTokens, 0);
    buf.checkErrors();  // nothing left on any rank
  }
  if (remoteRanks(ctx) > 0) {
    // The worst form with handles made for this rank's own tokens only: rank 0 relays the tokens of the first rank of
    // the next host (rank 2 of 2 x 2, rank 4 of 2 x 4), more than its handle holds, and every rank refuses the call
    // alike, naming the relay (dispatchPrepare would have grown it).
    const int relayedByRankZero = static_cast<int>(ctx.hostRanks().size());
    ep::DispatchHandle small = buf.newHandle(n);
    Received r(c, 2 * 64, c.experts / kRanks);
    buf.dispatchWorst(input(16, 2048, 0), small, r.out, 2 * 64, 1, stream);
    GDX_TEST_CUDA(cudaStreamSynchronize(stream));
    expectThrowContaining([&] { buf.checkErrors(); },
                          "rank 0 relays a rank's " + std::to_string(c.tokensOf(relayedByRankZero)),
                          "relay capacity, worst form");
    auto bytes = r.x->get<unsigned char>(2 * 64 * 4096);
    EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0xEE; }))
        << "rows were written although the call was refused";
    ep::DispatchCounts grown = buf.dispatchPrepare(input(16, 2048, 0), small, 1, stream);  // grows it on the host
    EXPECT_GT(grown.numRecvTokens, 0);
  }
  ctx.barrier();
}

void childMain() {
  Context ctx;
  kRanks = ctx.worldSize();
  const int remote = remoteRanks(ctx);
  if (remote)  // every rank refuses alike, and a Buffer made afterwards works
    expectThrowContaining([&] { ep::Buffer tooSmall(ctx, size_t(16) << 20, 4096); }, "rdmaBytes 4096", "staging");
  // Ranks of different kernel shapes are refused alike (a receiver works out from the shape whether a sender stamps
  // its rows), and a Buffer made afterwards works.
  expectThrowContaining(
      [&] {
        ep::Buffer mixed(ctx, size_t(16) << 20, size_t(remote) * (64 << 20),
                         ctx.rank() == 0 ? ep::Config{16, 512} : ep::Config{});
      },
      "every rank must use the same", "mixed configs");
  // More blocks than the GPU runs at once would wait for blocks that never start: refused alike on every rank.
  expectThrowContaining(
      [&] {
        ep::Buffer tooWide(ctx, size_t(16) << 20, size_t(remote) * (64 << 20), {100000, 768});
      },
      "at once", "numSms beyond what runs at once");
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    ep::Buffer buf(ctx, size_t(256) << 20, size_t(remote) * (64 << 20));
    for (const Case& c : cases()) runCase(ctx, buf, c, stream);
    badInputs(ctx, buf, stream);
    runCase(ctx, buf, cases()[0], stream);  // still works after the refused calls
  }
  cudaStreamDestroy(stream);
}

// Rank 1 leaves right after the Buffer is set up; rank 0's dispatch must end with an error naming the wait, within
// GDX_TIMEOUT_MS, not hang.
void peerDiesMain() {
  Context ctx;
  cudaStream_t stream;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ep::Buffer buf(ctx, size_t(64) << 20, size_t(remoteRanks(ctx)) * (16 << 20));
  ctx.barrier();
  if (ctx.rank() == 1) std::_Exit(0);
  Case c{"peer dies", 64, 2048, 4, 16, false};
  std::vector<int64_t> idx;
  std::vector<float> w;
  routing(c, 0, idx, w);
  Dev x(size_t(64) * 4096), di(idx.size() * 8);
  di.put(idx.data(), idx.size() * 8);
  ep::DispatchHandle h = buf.newHandle(64);
  ep::DispatchInputs in{x.p, nullptr, di.as<int64_t>(), nullptr, 64, 2048, 4, 16, ep::DType::kBFloat16};
  const auto t0 = std::chrono::steady_clock::now();
  expectThrowContaining([&] { buf.dispatchPrepare(in, h, 1, stream); }, "rank 1", "peer died");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0) << "the error came after " << s << " s";
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);  // the peer is gone: no collective teardown
}

TEST(EpChild, Run) {
  const char* child = std::getenv("GDX_EP_CHILD");
  if (!child) GTEST_SKIP() << "runs only as a child of Ep.* (GDX_EP_CHILD)";
  if (std::string(child) == "peer-dies")
    peerDiesMain();
  else
    childMain();
}

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  return n;
}

void runRanks(const std::string& mode, const std::string& timeoutMs, int ranks = 2, int hosts = 0) {
  const int gpus = gpuCount();
  test::spawnRanks(ranks, "EpChild.Run", "ep-test", [&](int r) {
    std::vector<std::string> env{"GDX_CUDA_DEVICE=" + std::to_string(r % gpus), "GDX_EP_CHILD=" + mode,
                                 "GDX_TIMEOUT_MS=" + timeoutMs, "GDX_LOG_LEVEL=WARN"};
    if (hosts) env.push_back("GDX_HOSTS=" + std::to_string(hosts));
    return env;
  });
}

TEST(Ep, TwoRanksDispatchAndCombineMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000");
}

TEST(Ep, PeerThatDiesEndsTheDispatchWithAnError) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("peer-dies", "5000");
}

// Four ranks on one host, every peer on the direct path: on four GPUs where there are four, else ranks share them.
TEST(Ep, FourRanksOnOneHostDispatchAndCombineMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000", 4);
}

// Eight ranks, the most a Buffer takes (kMaxRanks) and the shape of an 8-GPU host: every peer on the direct path, on
// eight GPUs where there are eight, else ranks share them.
TEST(Ep, EightRanksOnOneHostDispatchAndCombineMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "120000", 8);
}

// Two emulated hosts of four ranks: three peers on the direct path, four through the proxy (TCP) and the relays.
TEST(Ep, EightRanksOnTwoEmulatedHostsDispatchAndCombineMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "120000", 8, 2);
}

// Two emulated hosts of two ranks: each rank reaches one rank on the direct path and two through the proxy (TCP).
TEST(Ep, TwoEmulatedHostsDispatchAndCombineMatchTheReference) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("cases", "60000", 4, 2);
}

TEST(Ep, PeerOnAnotherHostThatDiesEndsTheDispatchWithAnError) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks("peer-dies", "5000", 4, 2);
}

}  // namespace
}  // namespace gdx
