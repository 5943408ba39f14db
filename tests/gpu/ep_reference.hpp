// Host side of the EP tests: deterministic inputs (any rank can rebuild any rank's tokens from the case's seed, so
// received rows are checked byte for byte without shipping the tokens), the routing drawn per case, and the
// reference a receiver expects from the all-gathered top-k of every rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gdx::test::ep {

enum class Values { kRandom, kRankValued };
// kDuplicates: about a third of the slots after the first name an expert an earlier slot of the token names too
// (a token may name one expert two or three times), each slot with its own weight.
enum class Routing { kRandom, kWithHoles, kOneExpert, kDuplicates };

struct Case {
  std::string name;
  int tokens;  // per rank
  int hidden, topk, experts;
  bool fp8;
  Values values = Values::kRandom;
  Routing routing = Routing::kRandom;
  int zeroTokenRank = -1;  // this rank dispatches nothing
  int alignment = 1;
  uint64_t seed = 1;
  int tokensOf(int rank) const { return rank == zeroTokenRank ? 0 : tokens + 7 * rank; }
};

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint16_t bf16Of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float floatOfBf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Bytes of token `t` of rank `s` (hidden * 2 for BF16, hidden for FP8).
inline void tokenBytes(const Case& c, int s, int t, unsigned char* out) {
  const int n = c.hidden * (c.fp8 ? 1 : 2);
  if (c.values == Values::kRankValued && !c.fp8) {
    const uint16_t v = bf16Of(float(s));
    for (int i = 0; i < c.hidden; ++i) std::memcpy(out + 2 * i, &v, 2);
    return;
  }
  for (int i = 0; i < n; i += 8) {
    const uint64_t w = mix(c.seed * 0x1000193 ^ (uint64_t(s) << 48) ^ (uint64_t(t) << 24) ^ uint64_t(i));
    std::memcpy(out + i, &w, 8);
  }
}
inline float scaleOf(const Case& c, int s, int t, int j) {
  return float(mix(c.seed ^ (uint64_t(s) << 40) ^ (uint64_t(t) << 16) ^ uint64_t(j)) % 10000) / 997.0f + 0.5f;
}
/// The BF16 value the "experts" return for column `i` of token `t` of rank `s` (what combine sums).
inline float expertValue(const Case& c, int s, int t, int i) {
  return float(int(mix(c.seed + 77 + (uint64_t(s) << 40) + (uint64_t(t) << 16) + uint64_t(i)) % 2001) - 1000) / 256.0f;
}

/// Top-k of rank s: [tokens, topk] expert ids, and the weights.
inline void routing(const Case& c, int s, std::vector<int64_t>& idx, std::vector<float>& weights) {
  const int n = c.tokensOf(s);
  idx.assign(size_t(n) * c.topk, -1);
  weights.assign(size_t(n) * c.topk, 0.f);
  std::mt19937_64 rng(c.seed * 31 + s);
  for (int t = 0; t < n; ++t) {
    std::vector<int> chosen;
    for (int k = 0; k < c.topk; ++k) {
      int64_t e = -1;
      if (c.routing == Routing::kOneExpert) {
        e = k == 0 ? (c.experts / 2 + 1) % c.experts : -1;
      } else if (c.routing == Routing::kDuplicates && k > 0 && rng() % 3 == 0) {
        e = idx[size_t(t) * c.topk + rng() % k];
      } else if (c.routing == Routing::kWithHoles && rng() % 4 == 0) {
        e = -1;
      } else {
        do e = int64_t(rng() % c.experts);
        while (std::find(chosen.begin(), chosen.end(), int(e)) != chosen.end());
        chosen.push_back(int(e));
      }
      idx[size_t(t) * c.topk + k] = e;
      weights[size_t(t) * c.topk + k] = float(rng() % 1000) / 1000.0f + 0.001f;
    }
  }
}

struct ExpectedRow {
  int source, token;
};

/// What rank `me` of `ranks` receives, in order (source rank, then token), from every rank's top-k.
inline std::vector<ExpectedRow> expectedRows(const Case& c, int me, int ranks,
                                             const std::vector<std::vector<int64_t>>& allIdx) {
  const int epr = c.experts / ranks;
  std::vector<ExpectedRow> rows;
  for (int s = 0; s < ranks; ++s)
    for (int t = 0; t < c.tokensOf(s); ++t) {
      bool in = false;
      for (int k = 0; k < c.topk; ++k) {
        const int64_t e = allIdx[s][size_t(t) * c.topk + k];
        in |= e >= 0 && e / epr == me;
      }
      if (in) rows.push_back({s, t});
    }
  return rows;
}

/// DeepEP's measure of how far two tensors are apart: 1 - 2 sum(xy) / sum(x^2 + y^2).
inline double calcDiff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, sq = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    sq += x[i] * x[i] + y[i] * y[i];
  }
  return sq == 0 ? 0 : 1 - 2 * xy / sq;
}

}  // namespace gdx::test::ep
