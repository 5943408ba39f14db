// The host API end to end with real processes: Context -> Channel -> ring -> proxy -> TCP -> remote proxy ->
// remote signal. Every test runs its ranks in child processes (runRanks), because a Context starts threads.
#include "gdx/context.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/error.hpp"
#include "proxy/proxy.hpp"
#include "runtime/context_impl.hpp"
#include "support/data_exchange.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

using test::runRanks;

// A world of one: the rank talks to itself through its own sockets.
using test::runSolo;

TEST(Context, TwoRanksExchangeRandomDataUpTo64MiB) {
  auto codes = runRanks(2, [](int) { return test::exchangeRandomData(size_t{64} << 20); });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Context, FourRanksExchangeRandomDataUpTo64MiB) {
  auto codes = runRanks(4, [](int) { return test::exchangeRandomData(size_t{64} << 20); });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0, 0}));
}

TEST(Context, ManyThreadsShareChannelsAndSignalsCountExactly) {
  // 4 threads per rank each issue 500 small putWithSignal to the other rank; the receiver's signal must
  // reach exactly 2000 and every slot must hold the data its sender wrote.
  auto codes = runRanks(2, [](int rank) {
    Context ctx;
    const int peer = 1 - rank;
    constexpr int kThreads = 4, kPerThread = 500, kBytes = 24;
    std::vector<unsigned char> src(kThreads * kPerThread * kBytes), dst(src.size(), 0);
    test::fillRandom(src.data(), src.size(), 100 + rank);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Channel ch = ctx.channel(peer);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          size_t off = (size_t(t) * kPerThread + i) * kBytes;
          ch.putWithSignal(d, off, s, off, kBytes, 3, 1);
        }
      });
    for (auto& th : threads) th.join();
    ch.flush();
    ctx.wait(3, kThreads * kPerThread);
    std::vector<unsigned char> expect(src.size());
    test::fillRandom(expect.data(), expect.size(), 100 + peer);
    int bad = std::memcmp(dst.data(), expect.data(), dst.size()) != 0;
    if (ctx.signalValue(3) != uint64_t(kThreads * kPerThread)) bad = 1;
    ctx.barrier();
    return bad;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// 8 producer threads, each on ring t % 8 of 4 proxy threads with `ringsPerThread` rings each: every round cuts a 4 KiB
// slot into eight puts that continue each other (the proxy merges them) and then signals; a checker compares each
// slot once its signal arrived, and at the end every byte.
int mergedPutsOnManyRings(int ringsPerThread) {
  return runSolo([ringsPerThread] {
    ContextOptions options = ContextOptions::fromEnv();
    options.proxy.threads = 4;
    options.proxy.ringsPerThread = ringsPerThread;
    Context ctx(options);
    const int rings = gdx::detail::contextImpl(ctx).proxy().numRings();
    constexpr int kThreads = 8, kRounds = 1000;  // each ring wraps several times
    constexpr size_t kSlot = 4096, kPiece = kSlot / 8;
    std::vector<unsigned char> src(size_t(kThreads) * kRounds * kSlot), dst(src.size(), 0xEE);
    test::fillRandom(src.data(), src.size(), 77);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        Channel ch = ctx.channel(0, t % rings);
        for (int r = 0; r < kRounds; ++r) {
          const size_t slot = (size_t(t) * kRounds + r) * kSlot;
          for (size_t p = 0; p < 8; ++p) ch.put(d, slot + p * kPiece, s, slot + p * kPiece, kPiece);
          ch.signal(t, 1);
        }
        ch.flush();
      });
    int bad = 0;
    for (int r = 0; r < kRounds; ++r)
      for (int t = 0; t < kThreads; ++t) {
        ctx.wait(t, r + 1);
        const size_t slot = (size_t(t) * kRounds + r) * kSlot;
        if (std::memcmp(&dst[slot], &src[slot], kSlot) != 0) bad = 1;
      }
    for (auto& th : threads) th.join();
    if (std::memcmp(dst.data(), src.data(), dst.size()) != 0) bad = 2;
    const ProxyCounters c = ctx.stats();
    if (c.writes >= uint64_t(kThreads) * kRounds * 8) bad = 3;  // no puts were merged
    return bad;
  });
}

TEST(Context, ConsecutivePutsOnFourRingsArriveBeforeTheirSignals) {
  EXPECT_EQ(mergedPutsOnManyRings(1), 0);
}

TEST(Context, ConsecutivePutsOnTwoRingsPerProxyThreadArriveBeforeTheirSignals) {
  EXPECT_EQ(mergedPutsOnManyRings(2), 0);
}

TEST(Context, SignalSetAddAndLargeValuesAndAtomicAdd) {
  // Values that do not fit the immediate travel as remote atomics; both paths must land the same way.
  auto codes = runRanks(2, [](int rank) {
    Context ctx;
    const int peer = 1 - rank;
    std::vector<uint64_t> words(16, 0);
    std::vector<unsigned char> src(4096), dst(4096, 0);
    test::fillRandom(src.data(), src.size(), 7 + rank);
    Window w = ctx.registerWindow(words.data(), words.size() * 8);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Channel ch = ctx.channel(peer);
    const uint64_t big = 0x123456789abcdefull;
    ch.signal(1, 5);                             // add, fits the immediate
    ch.signal(1, big);                           // add, atomic path
    ch.signal(2, big, SignalOp::kSet);           // set, atomic path
    ch.putWithSignal(d, 0, s, 0, 4096, 4, big);  // data + atomic signal
    for (int i = 0; i < 10; ++i) ch.atomicAdd(w, 8 * 3, 1000 + i);
    ch.signal(5, 1);
    ch.flush();
    ctx.wait(5, 1);
    ctx.wait(4, big);
    std::vector<unsigned char> expect(4096);
    test::fillRandom(expect.data(), expect.size(), 7 + peer);
    int bad = 0;
    if (ctx.signalValue(1) != big + 5) bad |= 1;
    if (ctx.signalValue(2) != big) bad |= 2;
    if (std::memcmp(dst.data(), expect.data(), dst.size()) != 0) bad |= 4;
    if (words[3] != 10 * 1000 + 45) bad |= 8;
    if (bad) std::fprintf(stderr, "rank %d: bad mask %d\n", rank, bad);
    ctx.barrier();
    return bad;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Each case must throw kInvalidArgument before anything is enqueued, and leave the destination untouched.
TEST(Context, BadArgumentsThrowAndSendNothing) {
  int rc = runSolo([] {
    Context ctx;
    std::vector<unsigned char> src(1000, 1), dst(1000, 0);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Window unregistered;
    Channel ch = ctx.channel(0);
    int failures = 0;
    auto expectInvalid = [&](const char* what, const std::function<void()>& f) {
      try {
        f();
        std::fprintf(stderr, "%s: no exception\n", what);
        ++failures;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument) {
          std::fprintf(stderr, "%s: wrong code: %s\n", what, e.what());
          ++failures;
        }
      }
    };
    expectInvalid("unregistered window", [&] { ch.put(unregistered, 0, s, 0, 8); });
    expectInvalid("unregistered source", [&] { ch.put(d, 0, unregistered, 0, 8); });
    expectInvalid("destination past the end", [&] { ch.put(d, 999, s, 0, 2); });
    expectInvalid("source past the end", [&] { ch.put(d, 0, s, 1, 1000); });
    expectInvalid("offset overflow", [&] { ch.put(d, ~uint64_t{0} - 2, s, 0, 8); });
    ch.put(d, 0, s, 0, 0);  // zero bytes: a no-op, not an error
    expectInvalid("zero size past the end", [&] { ch.put(d, 2000, s, 0, 1); });
    expectInvalid("unknown peer", [&] { ctx.channel(1); });
    expectInvalid("negative peer", [&] { ctx.channel(-1); });
    expectInvalid("signal id out of range", [&] { ch.signal(ctx.numSignals(), 1); });
    expectInvalid("unaligned atomic", [&] { ch.atomicAdd(d, 4, 1); });
    expectInvalid("wait on a signal out of range", [&] { ctx.wait(ctx.numSignals(), 1, 1000000); });
    ch.flush();
    for (unsigned char b : dst)
      if (b != 0) {
        std::fprintf(stderr, "a rejected put wrote to the destination\n");
        return 1;
      }
    ch.putWithSignal(d, 0, s, 0, 1000, 0, 1);  // the channel still works
    ctx.wait(0, 1);
    return failures + (std::memcmp(src.data(), dst.data(), 1000) != 0);
  });
  EXPECT_EQ(rc, 0);
}

// Commands that bypass the host checks (as a kernel's would) are rejected by the proxy: not posted, counted, reported
// in the proxy's message. (The one for a peer that does not exist, which no handle can make, breaks the whole ring:
// its error word. Per-command reporting of the others is in peer_errors_test.cpp.)
TEST(Context, ProxyRejectsInvalidCommandsFromTheRing) {
  int rc = runSolo([] {
    Context ctx;
    std::vector<unsigned char> src(256, 9), dst(256, 0);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    RingDeviceHandle ring = gdx::detail::contextImpl(ctx).proxy().ring(0).hostHandle();
    uint64_t pos = 0;
    ring.push(Command::put(0, 40, 0, d.id(), 0, 8), &pos);                         // unregistered source window
    ring.push(Command::put(0, s.id(), 0, 41, 0, 8), &pos);                         // unregistered destination window
    ring.push(Command::put(0, s.id(), 250, d.id(), 0, 8), &pos);                   // source range past the end
    ring.push(Command::put(0, s.id(), 0, d.id(), 255, 2), &pos);                   // destination range past the end
    ring.push(Command::put(5, s.id(), 0, d.id(), 0, 8), &pos);                     // unknown peer
    ring.push(Command::put(0, s.id(), 0, d.id(), 0, 0), &pos);                     // zero size
    ring.push(Command::signal(0, ctx.numSignals() + 1, 1, SignalOp::kAdd), &pos);  // signal beyond the array
    ring.push(Command::atomicAdd(0, d.id(), 3, 1), &pos);                          // unaligned atomic
    Status st = ring.waitCompleted(pos);  // returns as soon as the error word is set
    // Then let the proxy work through every command before looking at its counters.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (atomicLoad(ring.completed, kAcquire) <= pos && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // The proxy counts a rejected command after it marks it completed: let the count settle (bounded).
    while (ctx.stats().errors < 8 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    int bad = 0;
    if (st != Status::kProxyError) {
      std::fprintf(stderr, "waitCompleted returned %s\n", statusName(st));
      bad = 1;
    }
    if (ctx.stats().errors != 8) {
      std::fprintf(stderr, "proxy counted %llu errors\n", (unsigned long long)ctx.stats().errors);
      bad = 1;
    }
    std::string why = ctx.proxyError();
    if (why.find("window 40") == std::string::npos || why.find("rank 0") == std::string::npos) {
      std::fprintf(stderr, "proxy error does not name the window: %s\n", why.c_str());
      bad = 1;
    }
    for (unsigned char b : dst) bad |= b != 0;
    return bad;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Context, WaitTimesOutWithinItsBoundAndNamesTheSignal) {
  int rc = runSolo([] {
    Context ctx;
    auto t0 = std::chrono::steady_clock::now();
    try {
      ctx.wait(7, 1, 300ull * 1000 * 1000);
      return 1;
    } catch (const Error& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool ok = e.code() == ErrorCode::kTimeout && s >= 0.3 && s < 0.6 &&
                std::string(e.what()).find("signal 7 >= 1") != std::string::npos;
      if (!ok) std::fprintf(stderr, "after %.3f s: %s\n", s, e.what());
      return ok ? 0 : 1;
    }
  });
  EXPECT_EQ(rc, 0);
}

// Rank 1 streams large puts at rank 0 and dies mid-transfer; rank 0's wait must end with kPeerFailed well
// within the configured timeout instead of hanging, and its flush must fail too.
TEST(Context, PeerKilledMidTransferEndsTheSurvivorsWait) {
  auto codes = runRanks(2, [](int rank) {
    setenv("GDX_TIMEOUT_MS", "8000", 1);
    Context ctx;
    std::vector<unsigned char> buf(size_t{32} << 20, 0x5A);
    Window w = ctx.registerWindow(buf.data(), buf.size());
    ctx.barrier();
    if (rank == 1) {
      Channel ch = ctx.channel(0);
      for (int i = 0;; ++i) {
        ch.put(w, 0, w, 0, buf.size());
        if (i == 3) raise(SIGKILL);
      }
    }
    auto t0 = std::chrono::steady_clock::now();
    Channel back = ctx.channel(1);
    try {
      ctx.wait(9, 1);
      return 1;
    } catch (const Error& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool ok =
          e.code() == ErrorCode::kPeerFailed && s < 8.0 && std::string(e.what()).find("rank 1") != std::string::npos;
      if (!ok) std::fprintf(stderr, "after %.3f s: %s\n", s, e.what());
      try {
        back.put(w, 0, w, 0, 1024);
        back.flush();
        std::fprintf(stderr, "flush to the dead peer succeeded\n");
        ok = false;
      } catch (const Error& e2) {
        ok = ok && e2.code() == ErrorCode::kPeerFailed;
      }
      return ok ? 0 : 1;
    }
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
}

}  // namespace
}  // namespace gdx
