// gdx::ep::Buffer's dispatch without top-k (DeepEP's dispatch routed by is_token_in_rank alone, with the per-expert
// counts of get_dispatch_layout): for random top-k routings, the by-rank form fed with getDispatchLayout's
// isTokenInRank and numTokensPerExpert of that top-k must receive what the top-k form receives, byte for byte (rows,
// scales, source indices, counts matrix, received count), report per local expert the aligned sum over the sources of
// their numTokensPerExpert, give the same again in the cached form and in the worst form, write no top-k outputs, and
// combine each token to itself times the ranks it went to. On two ranks, four of one host, and two emulated hosts of
// two (ranks on the other host through the proxy and the relays). Bad input (a missing pointer, a negative count on
// one rank) fails on every rank alike, without a hang, and the Buffer goes on. The test re-executes itself per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
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
int kRanks = 2;                 // the job's ranks (set from the Context in a child)
constexpr int kSpareRows = 16;  // rows past the capacity of each output, which no call may write
constexpr unsigned char kPoison = 0xEE;

bool allPoison(const std::vector<unsigned char>& v) {
  return std::all_of(v.begin(), v.end(), [](unsigned char b) { return b == kPoison; });
}

// Outputs of `rows` rows (kSpareRows more allocated, poisoned like the rest).
struct Outputs : DispatchBuffers {
  Outputs(const Case& c, int rows_, int localExperts, int topk_)
      : DispatchBuffers(c.hidden, c.fp8, rows_, localExperts, topk_, kSpareRows) {}
  std::vector<unsigned char> xBytes(int n) const { return x->get<unsigned char>(size_t(n) * xb); }
  std::vector<float> scaleValues(int n) const { return scales->get<float>(out.recvXScales ? size_t(n) * ns : 0); }
  std::vector<int32_t> srcIdx(int n) const { return src->get<int32_t>(n); }
  // The bytes from row `from` to the end of the allocation: nobody wrote them.
  bool untouchedFrom(int from) const {
    const size_t all = size_t(rows) + kSpareRows;
    auto bytes = [&](const Dev& d, size_t perRow) {
      std::vector<unsigned char> v = d.get<unsigned char>(all * perRow);
      return std::vector<unsigned char>(v.begin() + size_t(from) * perRow, v.end());
    };
    return allPoison(bytes(*x, xb)) && allPoison(bytes(*scales, ns * 4)) && allPoison(bytes(*src, 4));
  }
  bool topkUntouched() const {
    const size_t all = size_t(rows) + kSpareRows;
    return allPoison(idx->get<unsigned char>(all * topk * 8)) && allPoison(weights->get<unsigned char>(all * topk * 4));
  }
};

// Rows (x, scales, source index) of `got` against the reference of every rank's tokens.
void checkAgainstReference(const Case& c, const std::vector<ExpectedRow>& rows, const Outputs& got, const char* form) {
  const int n = int(rows.size());
  const size_t xb = got.xb, ns = got.ns;
  auto x = got.xBytes(n);
  auto sc = got.scaleValues(n);
  auto src = got.srcIdx(n);
  std::vector<unsigned char> expect(xb);
  int bad = 0;
  for (int i = 0; i < n && bad < 5; ++i) {
    tokenBytes(c, rows[i].source, rows[i].token, expect.data());
    const bool ok = std::memcmp(&x[i * xb], expect.data(), xb) == 0 && src[i] == rows[i].token;
    bad += !ok;
    EXPECT_TRUE(ok) << form << ": row " << i << " (rank " << rows[i].source << " token " << rows[i].token
                    << ") differs";
    for (size_t j = 0; j < (c.fp8 ? ns : 0); ++j)
      EXPECT_EQ(sc[i * ns + j], scaleOf(c, rows[i].source, rows[i].token, int(j))) << form << ": scale of row " << i;
  }
}

std::vector<int32_t> matrixOf(ep::Buffer& buf, const ep::DispatchHandle& h) {
  return Dev::getFrom(buf.countsMatrix(h), size_t(kRanks) * kRanks);
}

void runCase(Context& ctx, ep::Buffer& buf, const Case& c, cudaStream_t stream) {
  const int me = ctx.rank(), n = c.tokensOf(me), K = c.topk, H = c.hidden, E = c.experts, epr = E / kRanks;
  SCOPED_TRACE(c.name + ", rank " + std::to_string(me));
  const ep::DType dtype = c.fp8 ? ep::DType::kFloat8E4M3 : ep::DType::kBFloat16;
  const size_t xb = size_t(H) * (c.fp8 ? 1 : 2), ns = size_t(H) / 128;
  std::vector<unsigned char> hx(n * xb);
  std::vector<float> hs(n * ns);
  for (int t = 0; t < n; ++t) {
    tokenBytes(c, me, t, &hx[t * xb]);
    for (size_t j = 0; j < ns; ++j) hs[t * ns + j] = scaleOf(c, me, t, int(j));
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
  const std::vector<ExpectedRow> rows = expectedRows(c, me, kRanks, allIdx);
  const int numRecv = int(rows.size());

  // The by-rank form's inputs: getDispatchLayout of the same top-k.
  Dev perRank(kRanks * 4), perExpert(size_t(E) * 4), inRank(size_t(n) * kRanks);
  buf.getDispatchLayout(di.as<int64_t>(), n, K, E, perRank.as<int32_t>(), perExpert.as<int32_t>(), inRank.as<bool>(),
                        stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  const std::vector<int32_t> myPerExpert = perExpert.get<int32_t>(E);
  std::vector<int64_t> mine(myPerExpert.begin(), myPerExpert.end());
  const auto allPerExpert = allGather(ctx, mine);
  std::vector<int> wantPerExpert(epr, 0);
  for (int r = 0; r < kRanks; ++r)
    for (int j = 0; j < epr; ++j) wantPerExpert[j] += int(allPerExpert[r][size_t(me) * epr + j]);
  for (int& v : wantPerExpert) v = (v + c.alignment - 1) / c.alignment * c.alignment;
  const std::vector<int32_t> wantPerExpert32(wantPerExpert.begin(), wantPerExpert.end());

  const void* scales = c.fp8 ? s.p : nullptr;
  const ep::DispatchInputs topkIn{x.p,  static_cast<const float*>(scales), di.as<int64_t>(), dw.as<float>(), n, H, K, E,
                                  dtype};
  ep::DispatchInputs rankIn{x.p, static_cast<const float*>(scales), nullptr, nullptr, n, H, 0, E, dtype};
  rankIn.isTokenInRank = n > 0 ? inRank.as<bool>() : nullptr;  // a rank without tokens may leave it null
  rankIn.numTokensPerExpert = perExpert.as<int32_t>();

  // The top-k form: what the by-rank form must match.
  ep::DispatchHandle ht = buf.newHandle(n);
  const ep::DispatchCounts ct = buf.dispatchPrepare(topkIn, ht, c.alignment, stream);
  ASSERT_EQ(ct.numRecvTokens, numRecv);
  Outputs byTopk(c, numRecv, epr, K);
  buf.dispatch(topkIn, ht, byTopk.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  checkAgainstReference(c, rows, byTopk, "top-k form");

  // Prepare by rank: the same counts; per local expert the aligned sum of the sources' numTokensPerExpert.
  ep::DispatchHandle hr = buf.newHandle(n);
  Dev prepPerExpert(size_t(epr) * 4);
  const ep::DispatchCounts cr = buf.dispatchPrepare(rankIn, hr, c.alignment, stream, prepPerExpert.as<int32_t>());
  EXPECT_EQ(cr.numRecvTokens, numRecv);
  EXPECT_EQ(hr.numRecvTokens(), numRecv);
  EXPECT_EQ(hr.numTopk(), 0);
  EXPECT_EQ(cr.numRecvTokensPerExpert, wantPerExpert);
  EXPECT_EQ(cr.numRecvTokensPerExpert, ct.numRecvTokensPerExpert) << "the top-k form counts the same slots";
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(prepPerExpert.get<int32_t>(epr), wantPerExpert32) << "dispatchPrepare's device per-expert counts";
  EXPECT_EQ(matrixOf(buf, hr), matrixOf(buf, ht)) << "countsMatrix";

  Outputs first(c, numRecv, epr, K);
  buf.dispatch(rankIn, hr, first.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  checkAgainstReference(c, rows, first, "by-rank form");
  EXPECT_EQ(first.xBytes(numRecv), byTopk.xBytes(numRecv)) << "by-rank rows against the top-k form's";
  EXPECT_EQ(first.scaleValues(numRecv), byTopk.scaleValues(numRecv));
  EXPECT_EQ(first.srcIdx(numRecv), byTopk.srcIdx(numRecv));
  EXPECT_TRUE(first.untouchedFrom(numRecv)) << "rows past the capacity were written";
  EXPECT_TRUE(first.topkUntouched()) << "top-k outputs written without top-k";

  // The cached form along the by-rank handle: the same rows again.
  Outputs cached(c, numRecv, epr, K);
  const ep::DispatchInputs cachedIn{x.p, static_cast<const float*>(scales), nullptr, nullptr, n, H, 0, E, dtype};
  buf.dispatch(cachedIn, hr, cached.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(cached.xBytes(numRecv), first.xBytes(numRecv)) << "cached form";
  EXPECT_EQ(cached.scaleValues(numRecv), first.scaleValues(numRecv)) << "cached form";
  EXPECT_EQ(cached.srcIdx(numRecv), first.srcIdx(numRecv)) << "cached form";
  EXPECT_TRUE(cached.untouchedFrom(numRecv) && cached.topkUntouched()) << "cached form wrote past its rows";

  // The worst form: no host sync, counts on the device, the same rows; rows past the received count untouched.
  int worst = 0;
  for (int r = 0; r < kRanks; ++r) worst += c.tokensOf(r);
  ep::DispatchHandle hw = buf.newHandle(worst);  // with relays: as many tokens as any rank sends (buffer.hpp)
  Outputs wr(c, worst, epr, K);
  buf.dispatchWorst(rankIn, hw, wr.out, worst, c.alignment, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  EXPECT_EQ(wr.numRecv->get<int32_t>(1)[0], numRecv) << "worst form";
  EXPECT_EQ(wr.perExpert->get<int32_t>(epr), wantPerExpert32) << "worst form";
  EXPECT_EQ(wr.xBytes(numRecv), first.xBytes(numRecv)) << "worst form";
  EXPECT_EQ(wr.scaleValues(numRecv), first.scaleValues(numRecv)) << "worst form";
  EXPECT_EQ(wr.srcIdx(numRecv), first.srcIdx(numRecv)) << "worst form";
  EXPECT_TRUE(wr.untouchedFrom(numRecv) && wr.topkUntouched()) << "worst form wrote past the received rows";
  EXPECT_EQ(matrixOf(buf, hw), matrixOf(buf, ht)) << "worst form's countsMatrix";

  // Combine without weights (rows summed): each token comes back times the ranks it went to; along the by-rank,
  // the worst-form and the top-k handles alike, bit for bit (the same rows summed in the same order).
  std::vector<uint16_t> y(size_t(numRecv) * H);
  for (int i = 0; i < numRecv; ++i)
    for (int j = 0; j < H; ++j) y[size_t(i) * H + j] = bf16Of(expertValue(c, rows[i].source, rows[i].token, j));
  Dev dy(y.size() * 2), outR(size_t(n) * H * 2), outW(size_t(n) * H * 2), outT(size_t(n) * H * 2);
  dy.put(y.data(), y.size() * 2);
  const ep::CombineInputs ci{dy.p, nullptr, nullptr, nullptr};
  buf.combine(ci, hr, ep::CombineOutputs{outR.p, nullptr}, stream);
  buf.combine(ci, hw, ep::CombineOutputs{outW.p, nullptr}, stream);
  buf.combine(ci, ht, ep::CombineOutputs{outT.p, nullptr}, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  const auto gotR = outR.get<uint16_t>(size_t(n) * H);
  EXPECT_EQ(gotR, outW.get<uint16_t>(size_t(n) * H)) << "combine along the worst form's handle";
  EXPECT_EQ(gotR, outT.get<uint16_t>(size_t(n) * H)) << "combine along the top-k form's handle";
  const auto inRankHost = inRank.get<unsigned char>(size_t(n) * kRanks);
  std::vector<double> ref(size_t(n) * H), got(size_t(n) * H);
  for (int t = 0; t < n; ++t) {
    int dests = 0;
    for (int d = 0; d < kRanks; ++d) dests += inRankHost[size_t(t) * kRanks + d] != 0;
    for (int j = 0; j < H; ++j) {
      const size_t i = size_t(t) * H + j;
      ref[i] = dests * double(floatOfBf16(bf16Of(expertValue(c, me, t, j))));
      got[i] = floatOfBf16(gotR[i]);
    }
  }
  EXPECT_LT(calcDiff(ref, got), 5e-6) << "combine calc_diff";
  ctx.barrier();
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"bf16 random H7168 K8 E256", 256, 7168, 8, 256, false});
  v.push_back({"fp8 H4096 K4 E64", 300, 4096, 4, 64, true, Values::kRandom, Routing::kRandom, -1, 1, 3});
  v.push_back(
      {"bf16 holes H2048 K2 E288 align 4", 513, 2048, 2, 288, false, Values::kRandom, Routing::kWithHoles, -1, 4, 5});
  v.push_back(
      {"bf16 rank 1 sends nothing H2048 K8 E16", 200, 2048, 8, 16, false, Values::kRandom, Routing::kRandom, 1, 1, 7});
  v.push_back(
      {"bf16 duplicates H2048 K8 E16", 90, 2048, 8, 16, false, Values::kRandom, Routing::kDuplicates, -1, 1, 19});
  // More rows than the kernels have warps: whole rows, stamped and taken as they arrive (protocol.hpp, "Row stamps").
  v.push_back(
      {"bf16 many tokens H2048 K8 E64", 2048, 2048, 8, 64, false, Values::kRandom, Routing::kRandom, -1, 1, 21});
  return v;
}

// Runs f and expects a gdx::Error of code kInvalidArgument whose message contains `text`.
template <typename F>
void expectInvalid(F&& f, const std::string& text, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
  }
}

// Bad input of the by-rank form, on every rank: refused alike, never a hang; the Buffer goes on.
void badInputs(Context& ctx, ep::Buffer& buf, cudaStream_t stream) {
  const int me = ctx.rank();
  const Case c{"bad by rank", 32, 2048, 4, 16, false};
  const int n = c.tokensOf(me), E = c.experts, epr = E / kRanks;
  std::vector<int64_t> idx;
  std::vector<float> w;
  routing(c, me, idx, w);
  Dev x(size_t(n) * 4096), di(idx.size() * 8), dw(w.size() * 4), perRank(kRanks * 4), perExpert(size_t(E) * 4),
      inRank(size_t(n) * kRanks);
  di.put(idx.data(), idx.size() * 8);
  buf.getDispatchLayout(di.as<int64_t>(), n, c.topk, E, perRank.as<int32_t>(), perExpert.as<int32_t>(),
                        inRank.as<bool>(), stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  const std::vector<int32_t> counts = perExpert.get<int32_t>(E);
  ep::DispatchHandle h = buf.newHandle(1 << 12);
  ep::DispatchInputs in{x.p, nullptr, nullptr, nullptr, n, 2048, 0, E, ep::DType::kBFloat16};
  in.isTokenInRank = inRank.as<bool>();
  in.numTokensPerExpert = perExpert.as<int32_t>();

  // Refused on the host, before any launch, on every rank alike (each rank's own arguments).
  ep::DispatchInputs noMask = in;
  noMask.isTokenInRank = nullptr;
  expectInvalid([&] { buf.dispatchPrepare(noMask, h, 1, stream); }, "isTokenInRank", "null isTokenInRank");
  ep::DispatchInputs noCounts = in;
  noCounts.numTokensPerExpert = nullptr;
  expectInvalid([&] { buf.dispatchPrepare(noCounts, h, 1, stream); }, "numTokensPerExpert", "null counts");
  Outputs r0(c, 64, epr, 1);
  expectInvalid([&] { buf.dispatchWorst(noCounts, h, r0.out, 64, 1, stream); }, "numTokensPerExpert",
                "null counts, worst form");
  ep::DispatchInputs topkNoIdx = in;
  topkNoIdx.numTopk = c.topk;  // top-k form without its topkIdx
  expectInvalid([&] { buf.dispatchPrepare(topkNoIdx, h, 1, stream); }, "topkIdx is needed", "top-k without topkIdx");
  ep::DispatchInputs weightsNoIdx = in;
  weightsNoIdx.topkWeights = dw.as<float>();
  expectInvalid([&] { buf.dispatchPrepare(weightsNoIdx, h, 1, stream); }, "topkWeights", "weights without topkIdx");
  ep::DispatchInputs idxNoTopk = in;
  idxNoTopk.topkIdx = di.as<int64_t>();  // topkIdx with numTopk 0
  expectInvalid([&] { buf.dispatchPrepare(idxNoTopk, h, 1, stream); }, "numTopk 0", "topkIdx with numTopk 0");
  EXPECT_TRUE(r0.untouchedFrom(0)) << "a refused call wrote rows";

  // A negative count on one rank: exchanged before any token is sent, every rank throws, naming that rank and value.
  for (int culprit = 0; culprit < kRanks; ++culprit) {
    const int expert = (3 + 5 * culprit) % E;
    std::vector<int32_t> bad = counts;
    if (me == culprit) bad[expert] = -3;
    perExpert.put(bad.data(), bad.size() * 4);
    const std::string what = "numTokensPerExpert[" + std::to_string(expert) + "] is -3";
    const std::string text = me == culprit ? what : "rank " + std::to_string(culprit) + " found bad input (" + what;
    expectInvalid([&] { buf.dispatchPrepare(in, h, 1, stream); }, text, "negative count");
    // The same through the worst form: nothing is written, the error comes with checkErrors() on every rank.
    Outputs r(c, 64, epr, 1);
    buf.dispatchWorst(in, h, r.out, 64, 1, stream);
    GDX_TEST_CUDA(cudaStreamSynchronize(stream));
    expectInvalid([&] { buf.checkErrors(); }, text, "negative count, worst form");
    EXPECT_TRUE(r.untouchedFrom(0)) << "rows were written although the input was refused";
  }
  perExpert.put(counts.data(), counts.size() * 4);
  // The Buffer goes on: the same call with good counts works on every rank.
  const ep::DispatchCounts good = buf.dispatchPrepare(in, h, 1, stream);
  EXPECT_GE(good.numRecvTokens, 0);
  Outputs r(c, std::max(good.numRecvTokens, 1), epr, 1);
  buf.dispatch(in, h, r.out, stream);
  GDX_TEST_CUDA(cudaStreamSynchronize(stream));
  buf.checkErrors();
  ctx.barrier();
}

// Ranks this one reaches through the proxy (on another emulated host).
int remoteRanks(const Context& ctx) {
  int remote = 0;
  for (int p = 0; p < ctx.worldSize(); ++p) remote += p != ctx.rank() && !ctx.isDirect(p);
  if (std::getenv("GDX_HOSTS")) EXPECT_GT(remote, 0) << "emulated hosts, yet every rank is on the direct path";
  return remote;
}

void childMain() {
  Context ctx;
  kRanks = ctx.worldSize();
  const int remote = remoteRanks(ctx);
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

TEST(EpByRankChild, Run) {
  if (!std::getenv("GDX_EP_CHILD")) GTEST_SKIP() << "runs only as a child of EpByRank.* (GDX_EP_CHILD)";
  childMain();
}

void runRanks(int ranks, int hosts = 0) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) gpus = 1;
  test::spawnRanks(ranks, "EpByRankChild.Run", "ep-by-rank-test", [&](int r) {
    std::vector<std::string> env{"GDX_CUDA_DEVICE=" + std::to_string(r % gpus), "GDX_EP_CHILD=1",
                                 "GDX_TIMEOUT_MS=60000", "GDX_LOG_LEVEL=WARN"};
    if (hosts) env.push_back("GDX_HOSTS=" + std::to_string(hosts));
    return env;
  });
}

TEST(EpByRank, TwoRanksMatchTheTopkForm) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks(2);
}

TEST(EpByRank, FourRanksOnOneHostMatchTheTopkForm) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks(4);
}

TEST(EpByRank, EightRanksOnOneHostMatchTheTopkForm) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks(8);
}

// Two emulated hosts of two ranks: the ranks of the other host through the proxy (TCP) and the relays.
TEST(EpByRank, TwoEmulatedHostsMatchTheTopkForm) {
  GDX_SKIP_WITHOUT_GPU();
  runRanks(4, 2);
}

}  // namespace
}  // namespace gdx
