#include "support/data_exchange.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

#include "gdx/context.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {
uint64_t seedFor(int from, int to, size_t size) {
  return (uint64_t(from) << 48) ^ (uint64_t(to) << 32) ^ size;
}

std::vector<size_t> sizesUpTo(size_t maxBytes) {
  std::vector<size_t> sizes;
  for (size_t s :
       {size_t{1}, size_t{3}, size_t{4096}, size_t{65537}, size_t{1} << 20, (size_t{16} << 20) + 5, size_t{64} << 20})
    if (s <= maxBytes) sizes.push_back(s);
  return sizes;
}
}  // namespace

int exchangeRandomData(size_t maxBytes) {
  Context ctx;
  const int rank = ctx.rank(), world = ctx.worldSize();
  std::vector<size_t> sizes = sizesUpTo(maxBytes);
  // Layout: the source holds one message per size (the same bytes go to every peer, seeded per peer when
  // sent); the destination holds one slot of maxBytes + 64 per sender, so unaligned offsets are covered too.
  const size_t slot = maxBytes + 64;
  std::vector<unsigned char> src(maxBytes + 64), dst(slot * world), expect(maxBytes);
  Window srcWin = ctx.registerWindow(src.data(), src.size());
  Window dstWin = ctx.registerWindow(dst.data(), dst.size());
  int failures = 0;
  for (size_t round = 0; round < sizes.size(); ++round) {
    const size_t n = sizes[round];
    const size_t offset = round % 8;            // unaligned destinations
    std::memset(dst.data(), 0xA5, dst.size());  // poison
    ctx.barrier();
    for (int k = 1; k < world; ++k) {
      int peer = (rank + k) % world;
      fillRandom(src.data() + offset, n, seedFor(rank, peer, n));
      Channel ch = ctx.channel(peer);
      ch.putWithSignal(dstWin, slot * rank + offset, srcWin, offset, n, /*signal=*/0, 1);
      ch.flush();  // the source is rewritten for the next peer
    }
    ctx.wait(0, uint64_t(world - 1) * (round + 1));
    for (int from = 0; from < world; ++from) {
      if (from == rank) continue;
      fillRandom(expect.data(), n, seedFor(from, rank, n));
      const unsigned char* got = dst.data() + slot * from + offset;
      long long bad = firstMismatch(got, expect.data(), n);
      if (bad >= 0) {
        std::fprintf(stderr, "rank %d: %zu bytes from rank %d differ at byte %lld\n", rank, n, from, bad);
        ++failures;
      }
      for (size_t g = 0; g < offset; ++g)
        if (got[-1 - static_cast<long>(g)] != 0xA5) ++failures;
      if (got[n] != 0xA5) {
        std::fprintf(stderr, "rank %d: byte after the %zu bytes from rank %d was overwritten\n", rank, n, from);
        ++failures;
      }
    }
  }
  ctx.barrier();
  return failures == 0 ? 0 : 1;
}

}  // namespace gdx::test
