// Lifetimes with real processes: Windows and Channels that outlive their Context, a Window handed to another
// Context's Channel, puts left unflushed when a Context is destroyed, and a window deregistered while a peer is
// still writing into it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "runtime/context_impl.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

using test::runRanks;
using test::throwsNaming;

using test::CapturedStderr;
using test::runSolo;

TEST(Lifetime, WindowAndChannelUsedOrDestroyedAfterTheirContextThrowOrDoNothing) {
  EXPECT_EQ(runSolo([] {
              std::vector<unsigned char> buf(4096, 1);
              Window w;  // declared before the Context: destroyed after it
              std::optional<Channel> ch;
              {
                Context ctx;
                w = ctx.registerWindow(buf.data(), buf.size(), MemoryKind::kHost, "buf");
                ch.emplace(ctx.channel(0));
                ch->put(w, 2048, w, 0, 64);
                ch->flush();
                CHILD_CHECK(w.valid() && w.remoteSize(0) == buf.size());
              }
              CHILD_CHECK(!w.valid());
              CHILD_CHECK(w.id() == 0 && w.size() == buf.size() && w.data() == buf.data());  // plain fields stay
              CHILD_CHECK(throwsNaming([&] { ch->put(w, 0, w, 64, 8); }, ErrorCode::kShutdown,
                                       {"channel to peer 0", "put", "Context is gone"}));
              CHILD_CHECK(throwsNaming([&] { ch->signal(0, 1); }, ErrorCode::kShutdown, {"signal", "Context is gone"}));
              CHILD_CHECK(throwsNaming([&] { ch->flush(); }, ErrorCode::kShutdown, {"flush", "Context is gone"}));
              CHILD_CHECK(throwsNaming([&] { w.remoteSize(0); }, ErrorCode::kShutdown,
                                       {"window 0 ('buf')", "remoteSize", "Context is gone"}));
              CHILD_CHECK(throwsNaming([&] { w.peerData(0); }, ErrorCode::kShutdown, {"window 0", "Context is gone"}));
              w = Window();  // destroying it now does nothing
              ch.reset();
              return 0;
            }),
            0);
}

TEST(Lifetime, ThreadsUsingAChannelWhileItsContextIsDestroyedGetAnErrorNotACrash) {
  EXPECT_EQ(runSolo([] {
              std::vector<unsigned char> buf(1 << 16);
              Window w;
              std::optional<Channel> ch;
              std::atomic<int> shutdowns{0}, others{0};
              std::vector<std::thread> threads;
              {
                Context ctx;
                w = ctx.registerWindow(buf.data(), buf.size());
                ch.emplace(ctx.channel(0));
                for (int t = 0; t < 3; ++t)
                  threads.emplace_back([&, t] {
                    try {
                      for (;;) ch->put(w, 32768 + 1024 * t, w, 1024 * t, 1024);
                    } catch (const Error& e) {
                      ++(e.code() == ErrorCode::kShutdown ? shutdowns : others);
                      if (e.code() != ErrorCode::kShutdown) std::fprintf(stderr, "unexpected: %s\n", e.what());
                    }
                  });
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
              }  // destroyed while the threads keep putting
              for (auto& th : threads) th.join();
              CHILD_CHECK(shutdowns == 3 && others == 0);
              return 0;
            }),
            0);
}

TEST(Lifetime, WindowOfAnotherContextIsRefused) {
  EXPECT_EQ(runSolo([] {
              std::vector<unsigned char> a(4096), b(4096);
              Context first;
              BootstrapConfig other = BootstrapConfig::fromEnv();
              other.masterPort = test::freePort();  // a second job of one rank
              Context second(other, ContextOptions::fromEnv());
              // Both windows get id 0: ids alone would match.
              Window wa = first.registerWindow(a.data(), a.size());
              Window wb = second.registerWindow(b.data(), b.size());
              CHILD_CHECK(wa.id() == wb.id());
              Channel ch = second.channel(0);
              CHILD_CHECK(throwsNaming([&] { ch.put(wa, 0, wb, 0, 64); }, ErrorCode::kInvalidArgument,
                                       {"destination window 0", "belongs to another Context"}));
              CHILD_CHECK(throwsNaming([&] { ch.put(wb, 0, wa, 0, 64); }, ErrorCode::kInvalidArgument,
                                       {"source window 0", "belongs to another Context"}));
              CHILD_CHECK(throwsNaming([&] { ch.atomicAdd(wa, 0, 1); }, ErrorCode::kInvalidArgument,
                                       {"atomicAdd", "belongs to another Context"}));
              ch.put(wb, 2048, wb, 0, 64);  // its own windows still work
              ch.flush();
              return 0;
            }),
            0);
}

TEST(Lifetime, PutsNotFlushedBeforeTheContextIsDestroyedAreDelivered) {
  constexpr size_t kBytes = size_t{32} << 20;
  auto codes = runRanks(2, [](int rank) {
    std::vector<unsigned char> src(kBytes), dst(kBytes, 0);
    test::fillRandom(src.data(), src.size(), 7 + rank);
    CapturedStderr log;
    {
      Context ctx;
      Window s = ctx.registerWindow(src.data(), src.size());
      Window d = ctx.registerWindow(dst.data(), dst.size());
      if (rank == 0) {
        ctx.channel(1).putWithSignal(d, 0, s, 0, kBytes, 0, 1);
        return 0;  // no flush, no barrier: ~Context must deliver it
      }
      ctx.wait(0, 1);
      std::vector<unsigned char> want(kBytes);
      test::fillRandom(want.data(), want.size(), 7);
      CHILD_CHECK(std::memcmp(dst.data(), want.data(), kBytes) == 0);
    }
    CHILD_CHECK(log.restore().find("lost") == std::string::npos);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Lifetime, PutsLostWhenTheContextIsDestroyedAreLoggedNamingThePeer) {
  auto codes = runRanks(
      2,
      [](int rank) {
        setenv("GDX_TIMEOUT_MS", "1500", 1);
        constexpr size_t kBytes = size_t{64} << 20;
        std::vector<unsigned char> buf(kBytes);
        CapturedStderr log;
        pid_t stopped = 0;
        {
          Context ctx;
          Window w = ctx.registerWindow(buf.data(), buf.size());
          const pid_t me = getpid();
          std::vector<std::string> pids = ctx.allGather(std::string(reinterpret_cast<const char*>(&me), 4));
          std::memcpy(&stopped, pids[1].data(), 4);
          ctx.barrier();
          if (rank == 1) {
            raise(SIGSTOP);  // never continued: rank 0 kills it
            return 1;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          Channel ch = ctx.channel(1);
          // Far more than the sockets buffer: most of it cannot leave while the peer is stopped.
          try {
            for (int i = 0; i < 4; ++i) ch.put(w, 0, w, 0, kBytes);
          } catch (const Error& e) {
            std::fprintf(stderr, "enqueueing stopped early: %s\n", e.what());
          }
        }
        ::kill(stopped, SIGKILL);
        const std::string text = log.restore();
        CHILD_CHECK(text.find("closing the context") != std::string::npos);
        CHILD_CHECK(text.find("peer 1") != std::string::npos);
        return 0;
      },
      120);
  EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGKILL}));
}

// A producer that reserved a ring position and never published it (a thread that stopped mid-command) holds up the
// commands behind it: ~Context waits GDX_TIMEOUT_MS for them, then logs them with counts per peer and kind and the
// unpublished position, and nothing of them is delivered.
TEST(Lifetime, CommandsStuckBehindAnUnpublishedPositionAreLoggedWithCounts) {
  EXPECT_EQ(
      runSolo([] {
        setenv("GDX_TIMEOUT_MS", "1000", 1);
        std::vector<unsigned char> src(4096, 0x11), dst(4096, 0);
        CapturedStderr log;
        {
          Window s, d;  // destroyed after the Context: only ~Context drains the ring
          Context ctx;
          s = ctx.registerWindow(src.data(), src.size());
          d = ctx.registerWindow(dst.data(), dst.size());
          Channel ch = ctx.channel(0, 0);
          uint64_t hole = 0;
          CHILD_CHECK(gdx::detail::contextImpl(ctx).proxy().ring(0).hostHandle().reserve(1, &hole) == Status::kOk);
          for (int i = 0; i < 3; ++i) ch.put(d, 64 * i, s, 0, 64);
          ch.signal(0, 1);
        }
        const std::string text = log.restore();
        CHILD_CHECK(text.find("closing the context: 5 command(s) on ring 0 did not complete") != std::string::npos);
        CHILD_CHECK(text.find("to peer 0: 3 put 1 signalAdd") != std::string::npos);
        CHILD_CHECK(text.find("1 reserved by a producer but never published") != std::string::npos);
        for (unsigned char b : dst) CHILD_CHECK(b == 0);
        return 0;
      }),
      0);
}

TEST(Lifetime, AWindowDeregisteredUnderIncomingWritesIsNeverWrittenAgain) {
  // Rank 0 streams large puts into rank 1's window; rank 1 destroys its window in the middle of the stream and then
  // overwrites the memory with a marker. Deregistration waits for the chunk being received; every later chunk is
  // refused with an error naming the window (the peer fails), so the marker must stay intact.
  constexpr size_t kBytes = size_t{16} << 20;
  auto codes = runRanks(2, [](int rank) {
    std::vector<unsigned char> src(kBytes, 0x11), dst(kBytes, 0);
    Context ctx;
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    ctx.barrier();
    if (rank == 0) {
      Channel ch = ctx.channel(1);
      try {
        ch.putWithSignal(d, 0, s, 0, kBytes, 0, 1);
        for (int i = 0; i < 64 && ctx.failure().empty(); ++i) ch.put(d, 0, s, 0, kBytes);
        ch.flush();
      } catch (const Error& e) {
        std::fprintf(stderr, "rank 0: the stream ended: %s\n", e.what());
      }
    } else {
      ctx.wait(0, 1);
      d = Window();  // deregistered while rank 0 keeps writing
      std::memset(dst.data(), 0xAB, kBytes);
      for (int i = 0; i < 1000 && ctx.failure().empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const std::string why = ctx.failure();
      std::fprintf(stderr, "rank 1: %s\n", why.c_str());
      CHILD_CHECK(why.find("window 1") != std::string::npos && why.find("not registered") != std::string::npos);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // anything still arriving would land now
      for (size_t i = 0; i < kBytes; ++i) CHILD_CHECK(dst[i] == 0xAB);
    }
    ctx.barrier();  // the bootstrap still works: both leave together
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace gdx
