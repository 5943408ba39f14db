// Errors are per peer and per command, with real processes over TCP: a rank killed in the middle of a job fails only
// the operations that involve it (its waits, its channels' flushes) while the survivors go on exchanging random data
// that every receiver checks byte for byte; a command the proxy refuses fails the flush that covers it and nothing
// else, so later commands on the same ring, and every other peer's commands, succeed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
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

constexpr size_t kSlice = (size_t{256} << 10) + 123;  // bytes each rank sends each peer per round
constexpr uint32_t kDataSignal = 0;                   // + sender: "your slice from me is in place"
constexpr uint32_t kAckSignal = 16;                   // + receiver: "I checked the slice you sent me"
constexpr unsigned char kPoison = 0xEE;

uint64_t seedOf(int rank, int round) {
  return 1000003ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(round);
}

// The slice `from` sent to `to` in `round`: part of `from`'s random send buffer of that round.
bool sliceIsIntact(const unsigned char* got, int from, int to, int round, int world) {
  std::vector<unsigned char> theirs(kSlice * world);
  test::fillRandom(theirs.data(), theirs.size(), seedOf(from, round));
  const long long bad = test::firstMismatch(got, theirs.data() + kSlice * to, kSlice);
  if (bad >= 0)
    std::fprintf(stderr, "child %d: round %d: byte %lld of the slice from rank %d differs\n", getpid(), round, bad,
                 from);
  return bad < 0;
}

bool waitUntil(const std::function<bool()>& pred, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Four ranks exchange random slices all-to-all, round after round, every channel on the one host ring. Rank 3 takes
// part in round 1 and is killed at the start of round 2, while the others are sending to it. The survivors keep
// sending to it too (those commands share the ring with theirs), and must: finish every round with every byte from
// each other intact and every flush of a survivor's channel succeeding; see waitFrom(3) and a flush to rank 3 fail
// with kPeerFailed naming rank 3, at once and not after the timeout.
TEST(PeerErrors, ARankKilledMidJobFailsOnlyWhatInvolvesIt) {
  constexpr int kWorld = 4, kDead = 3, kRounds = 6;
  auto codes = runRanks(kWorld, [](int rank) {
    setenv("GDX_TIMEOUT_MS", "15000", 1);
    Context ctx;
    std::vector<unsigned char> send(kSlice * kWorld), recv(kSlice * kWorld, kPoison);
    Window s = ctx.registerWindow(send.data(), send.size());
    Window d = ctx.registerWindow(recv.data(), recv.size());
    std::vector<Channel> ch;
    for (int q = 0; q < kWorld; ++q) ch.push_back(ctx.channel(q));
    CHILD_CHECK(gdx::detail::contextImpl(ctx).proxy().numRings() ==
                1);  // every channel on one ring: the dead peer's commands share it
    ctx.barrier();
    auto survivor = [](int q) { return q != kDead; };
    for (int round = 1; round <= kRounds; ++round) {
      if (rank == kDead && round == 2) {
        // Only once every survivor's round-1 ack arrived: their flushes of round 1 cover those acks and must succeed.
        for (int q = 0; q < kWorld; ++q)
          if (q != rank) ctx.waitFrom(q, kAckSignal + q, 1);
        raise(SIGKILL);
      }
      test::fillRandom(send.data(), send.size(), seedOf(rank, round));
      for (int q = 0; q < kWorld; ++q) {
        if (q == rank) continue;
        // q checked what this rank sent it last round: its slice may be overwritten.
        if (survivor(q) && round > 1) ctx.waitFrom(q, kAckSignal + q, round - 1);
        try {
          ch[q].putWithSignal(d, kSlice * rank, s, kSlice * q, kSlice, kDataSignal + rank, 1);
        } catch (const Error& e) {
          CHILD_CHECK(q == kDead);  // only the dead peer's commands may be refused
        }
      }
      for (int q = 0; q < kWorld; ++q) {
        if (q == rank || (!survivor(q) && round > 1)) continue;
        ctx.waitFrom(q, kDataSignal + q, round);
        CHILD_CHECK(sliceIsIntact(recv.data() + kSlice * q, q, rank, round, kWorld));
        std::memset(recv.data() + kSlice * q, kPoison, kSlice);
        ch[q].signal(kAckSignal + rank, 1);
      }
      // The send buffer is refilled next round: every put to a live peer (rank 3 too in round 1, which checks what it
      // got) must have left, and say so without an error.
      for (int q = 0; q < kWorld; ++q)
        if (q != rank && (survivor(q) || round == 1)) ch[q].flush();
      if (round >= 2) {
        // The dead peer's channel: its flush waits for nothing and names the peer, whatever it held.
        try {
          ch[kDead].flush();
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed);
        }
      }
      if (round == 3) {
        CHILD_CHECK(waitUntil([&] { return ctx.peerFailed(kDead); }, 10000));
        const auto t0 = std::chrono::steady_clock::now();
        CHILD_CHECK(throwsNaming([&] { ctx.waitFrom(kDead, kDataSignal + kDead, 2); }, ErrorCode::kPeerFailed,
                                 {"wait from peer 3", "rank 3 failed"}));
        CHILD_CHECK(throwsNaming(
            [&] {
              ch[kDead].put(d, 0, s, 0, 4096);
              ch[kDead].flush();
            },
            ErrorCode::kPeerFailed, {"flush to peer 3", "rank 3 failed"}));
        CHILD_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
        CHILD_CHECK(!ctx.peerFailed((rank + 1) % kDead));
        CHILD_CHECK(ctx.failure((rank + 1) % kDead).empty());
      }
    }
    // No barrier (rank 3 cannot join one): the last acks say every survivor checked everything it was sent.
    for (int q = 0; q < kWorld; ++q)
      if (q != rank && survivor(q)) ctx.waitFrom(q, kAckSignal + q, kRounds);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0, 128 + SIGKILL}));
}

// Rank 0 pushes commands the proxy must refuse straight onto a ring (as a kernel's handle would: nothing on the host
// checks them) between valid puts to ranks 1 and 2 on the same ring. Each bad command fails the flush that covers it,
// with the proxy's reason; the next flush of the same peer succeeds; the other peer's flushes never fail; ranks 1
// and 2 receive every valid put intact and nothing of the bad ones.
TEST(PeerErrors, ARejectedCommandFailsItsFlushAloneAndTheRingGoesOn) {
  constexpr int kWorld = 3, kRounds = 4;
  auto codes = runRanks(kWorld, [](int rank) {
    setenv("GDX_TIMEOUT_MS", "15000", 1);
    Context ctx;
    std::vector<unsigned char> send(kSlice * kWorld), recv(kSlice * kWorld, kPoison);
    Window s = ctx.registerWindow(send.data(), send.size());
    Window d = ctx.registerWindow(recv.data(), recv.size());
    ctx.barrier();
    if (rank != 0) {
      for (int round = 1; round <= kRounds; ++round) {
        ctx.waitFrom(0, kDataSignal, round);
        CHILD_CHECK(sliceIsIntact(recv.data(), 0, rank, round, kWorld));
        // The bad commands aimed past the end of the window: nothing after it may have been written.
        for (size_t i = kSlice; i < recv.size(); ++i) CHILD_CHECK(recv[i] == kPoison);
        std::memset(recv.data(), kPoison, kSlice);
        ctx.channel(0).signal(kAckSignal + rank, 1);
      }
      ctx.barrier();
      return 0;
    }
    Channel to1 = ctx.channel(1, 0), to2 = ctx.channel(2, 0);
    const RingDeviceHandle ring = gdx::detail::contextImpl(ctx).proxy().ring(0).hostHandle();
    for (int round = 1; round <= kRounds; ++round) {
      if (round > 1) {
        ctx.waitFrom(1, kAckSignal + 1, round - 1);
        ctx.waitFrom(2, kAckSignal + 2, round - 1);
      }
      test::fillRandom(send.data(), send.size(), seedOf(0, round));
      const bool bad = round % 2 == 1;
      if (bad) {
        // A destination range past the end of peer 1's window, and a window id nobody registered.
        CHILD_CHECK(ring.push(Command::put(1, s.id(), 0, d.id(), recv.size() - 8, 64)) == Status::kOk);
        CHILD_CHECK(ring.push(Command::put(1, s.id(), 0, 40, 0, 64)) == Status::kOk);
      }
      to2.putWithSignal(d, 0, s, kSlice * 2, kSlice, kDataSignal, 1);
      to1.putWithSignal(d, 0, s, kSlice * 1, kSlice, kDataSignal, 1);
      to2.flush();  // another peer on the same ring: never sees peer 1's errors
      if (bad) {
        CHILD_CHECK(throwsNaming([&] { to1.flush(); }, ErrorCode::kInvalidArgument,
                                 {"flush to peer 1", "proxy error", "rejected put to peer 1"}));
        to1.flush();  // reported once: nothing new to report
      } else {
        to1.flush();
      }
      CHILD_CHECK(gdx::detail::contextImpl(ctx).proxy().ring(0).error() == Status::kOk);
    }
    CHILD_CHECK(ctx.stats().errors == 4);
    ctx.waitFrom(1, kAckSignal + 1, kRounds);
    ctx.waitFrom(2, kAckSignal + 2, kRounds);
    ctx.barrier();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// The device handle's bookkeeping, run by a host thread (the same code a kernel runs): two copies on one ring, one to
// each peer. A copy whose command was refused reports it at its next flush and not again; the other copy's flushes
// succeed throughout.
TEST(PeerErrors, DeviceHandleCopiesReportTheirOwnRejectedCommandsOnce) {
  auto codes = runRanks(3, [](int rank) {
    setenv("GDX_TIMEOUT_MS", "15000", 1);
    Context ctx;
    std::vector<unsigned char> send(kSlice * 3), recv(kSlice * 3, kPoison);
    Window s = ctx.registerWindow(send.data(), send.size());
    Window d = ctx.registerWindow(recv.data(), recv.size());
    ctx.barrier();
    if (rank == 0) {
      test::fillRandom(send.data(), send.size(), seedOf(0, 1));
      ChannelDeviceHandle h{};
      h.ring = gdx::detail::contextImpl(ctx).proxy().ring(0).hostHandle();
      h.numSignals = ctx.numSignals();
      h.lastPosition = ~uint64_t{0};
      h.forwardTo = -1;
      ChannelDeviceHandle to1 = h, to2 = h;
      to1.peer = 1;
      to2.peer = 2;
      // In range for a command, past the end of the window: only the proxy can tell.
      CHILD_CHECK(to1.put(d.id(), recv.size(), s.id(), 0, 16) == Status::kOk);
      CHILD_CHECK(to2.putWithSignal(d.id(), 0, s.id(), kSlice * 2, kSlice, kDataSignal, 1) == Status::kOk);
      CHILD_CHECK(to2.flush() == Status::kOk);
      CHILD_CHECK(to1.flush() == Status::kProxyError);
      CHILD_CHECK(to1.flush() == Status::kOk);
      CHILD_CHECK(to1.putWithSignal(d.id(), 0, s.id(), kSlice, kSlice, kDataSignal, 1) == Status::kOk);
      CHILD_CHECK(to1.flush() == Status::kOk);
    } else {
      ctx.waitFrom(0, kDataSignal, 1);
      CHILD_CHECK(sliceIsIntact(recv.data(), 0, rank, 1, 3));
      for (size_t i = kSlice; i < recv.size(); ++i) CHILD_CHECK(recv[i] == kPoison);
    }
    ctx.barrier();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace gdx
