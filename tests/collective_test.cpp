// Collective consistency with real processes: ranks whose collective calls do not match (a window registered
// against a barrier, windows registered in another order, sizes that must be equal and are not) fail on every rank
// with both sides named, and the job goes on afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

using test::runRanks;

// True when f() throws gdx::Error(kInvalidArgument) with a message containing every one of `parts`.
template <typename F>
bool refusedNaming(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::fprintf(stderr, "child %d: got the expected error: %s\n", getpid(), e.what());
    bool ok = e.code() == ErrorCode::kInvalidArgument;
    for (const std::string& p : parts)
      if (std::string(e.what()).find(p) == std::string::npos) {
        std::fprintf(stderr, "child %d: the error does not name '%s'\n", getpid(), p.c_str());
        ok = false;
      }
    return ok;
  }
  std::fprintf(stderr, "child %d: no error thrown\n", getpid());
  return false;
}

// After a refused collective call nothing is half done: two windows take ids 0 and 1 again, and a put from the
// other rank delivers every byte. 0 when it does.
int exchangeStillWorks(Context& ctx, int rank) {
  auto pattern = [](int r, size_t i) { return static_cast<unsigned char>(r * 101 + i * 7 + (i >> 8)); };
  std::vector<unsigned char> src(4096), dst(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(rank, i);
  Window s = ctx.registerWindow(src.data(), src.size(), MemoryKind::kHost, "src");
  Window d = ctx.registerWindow(dst.data(), dst.size(), MemoryKind::kHost, "dst");
  CHILD_CHECK(s.id() == 0 && d.id() == 1);
  Channel ch = ctx.channel(1 - rank);
  ch.putWithSignal(d, 0, s, 0, src.size(), 0, 1);
  ctx.wait(0, 1);
  ch.flush();
  for (size_t i = 0; i < dst.size(); ++i) CHILD_CHECK(dst[i] == pattern(1 - rank, i));
  ctx.barrier();
  return 0;
}

TEST(Collective, RegisterWindowAgainstABarrierFailsOnEveryRankNamingBothSides) {
  auto codes = runRanks(2, [](int rank) {
    std::vector<unsigned char> src(4096);
    Context ctx;
    CHILD_CHECK(refusedNaming(
        [&] {
          if (rank == 0)
            ctx.registerWindow(src.data(), src.size(), MemoryKind::kHost, "src");
          else
            ctx.barrier();
        },
        {"rank " + std::to_string(rank) + ":", "collective call #",
         "rank 0 called registerWindow of 4096 bytes named 'src'", "rank 1 called barrier"}));
    // The job goes on, and the window id rank 0 took is free again.
    ctx.barrier();
    return exchangeStillWorks(ctx, rank);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Collective, WindowsRegisteredInAnotherOrderAreRefusedByTheirNames) {
  auto codes = runRanks(3, [](int rank) {
    std::vector<unsigned char> a(1024), b(2048);
    Context ctx;
    // Rank 0 gives no names; ranks 1 and 2 name their windows in opposite orders.
    const std::string first = rank == 0 ? "" : rank == 1 ? "a" : "b";
    CHILD_CHECK(refusedNaming(
        [&] {
          ctx.registerWindow(a.data(), rank == 2 ? b.size() : a.size(), MemoryKind::kHost, first,
                             WindowSizes::kMayDiffer);
        },
        {"different names", "rank 1 called registerWindow of 1024 bytes named 'a'",
         "rank 2 called registerWindow of 2048 bytes named 'b'"}));
    // Unnamed windows of different sizes are fine where the call says so.
    Window w = ctx.registerWindow(rank == 1 ? b.data() : a.data(), rank == 1 ? b.size() : a.size(), MemoryKind::kHost,
                                  {}, WindowSizes::kMayDiffer);
    CHILD_CHECK(w.remoteSize(1) == b.size() && w.remoteSize(0) == a.size());
    ctx.barrier();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// Two ranks registering unnamed windows of different sizes in opposite order: without a check, rank 0's put into its
// 256 KiB window would land in rank 1's 4 KiB one. Both ranks refuse the first call, naming both sizes.
TEST(Collective, UnnamedWindowsOfDifferentSizesAreRefusedUnlessTheCallAllowsIt) {
  auto codes = runRanks(2, [](int rank) {
    std::vector<unsigned char> big(256 << 10), small(4 << 10);
    Context ctx;
    std::vector<unsigned char>& first = rank == 0 ? big : small;
    CHILD_CHECK(
        refusedNaming([&] { ctx.registerWindow(first.data(), first.size()); },
                      {"different sizes where they must be equal", "rank 0 called registerWindow of 262144 bytes",
                       "rank 1 called registerWindow of 4096 bytes"}));
    Window same = ctx.registerWindow(small.data(), small.size());  // equal sizes: fine
    CHILD_CHECK(same.remoteSize(1 - rank) == small.size());
    ctx.barrier();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Collective, SizesThatMustMatchAndDoNotAreNamedWithTheSequenceNumber) {
  auto codes = runRanks(2, [](int rank) {
    Bootstrap b(BootstrapConfig::fromEnv());
    b.barrier();  // #1
    CollectiveTag tag;
    tag.kind = "symmetric buffer";
    tag.size = rank == 0 ? 4096 : 8192;
    tag.sameSize = true;
    CHILD_CHECK(refusedNaming([&] { b.allGather("x", tag); },
                              {"collective call #2", "different sizes", "rank 0 called symmetric buffer of 4096 bytes",
                               "rank 1 called symmetric buffer of 8192 bytes"}));
    tag.size = 4096;
    std::vector<std::string> all = b.allGather(std::to_string(rank), tag);  // #3: matches
    CHILD_CHECK(all.size() == 2 && all[0] == "0" && all[1] == "1");
    b.barrier();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A registration that fails on one rank only (here its transport refuses the memory: host memory said to be GPU
// memory) fails on every rank at once, naming that rank and its reason, instead of leaving the others waiting in
// the exchange until the timeout; and the job goes on with the ids the failed call took free again.
TEST(Collective, ARegistrationThatFailsOnOneRankFailsOnEveryRankWithItsReason) {
  auto codes = runRanks(2, [](int rank) {
    std::vector<unsigned char> buf(4096);
    setenv("GDX_TIMEOUT_MS", "20000", 1);
    Context ctx;
    const auto start = std::chrono::steady_clock::now();
    CHILD_CHECK(refusedNaming(
        [&] { ctx.registerWindow(buf.data(), buf.size(), rank == 1 ? MemoryKind::kCuda : MemoryKind::kHost, "buf"); },
        {"rank 1", "registerWindow", "buf", "transport rank 1"}));  // rank 0 too gets rank 1's reason
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "rank %d: the failed registration returned after %.3f s\n", rank, waited);
    CHILD_CHECK(waited < 5.0);  // not the 20 s timeout
    return exchangeStillWorks(ctx, rank);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace gdx
