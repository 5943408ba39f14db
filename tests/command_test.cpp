#include "gdx/device/impl/command.hpp"

#include <gtest/gtest.h>

#include <random>

namespace gdx {
namespace {

TEST(Command, PutFieldsRoundTripAtTheirLimits) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 10000; ++i) {
    uint32_t peer = rng() % kMaxPeers, sw = rng() % kMaxWindows, dw = rng() % kMaxWindows;
    uint64_t so = rng() & kMaxWindowOffset, dof = rng() & kMaxWindowOffset, sz = rng() & kMaxCommandBytes;
    if (i == 0) peer = kMaxPeers - 1, sw = dw = kMaxWindows - 1, so = dof = kMaxWindowOffset, sz = kMaxCommandBytes;
    bool sig = i & 1;
    Command c = Command::put(peer, sw, so, dw, dof, sz, sig ? Opcode::kPutWithSignal : Opcode::kPut);
    for (uint64_t lap : {0, 1}) {
      Command l = c.withLap(lap);
      EXPECT_TRUE(l.lapsAgree(lap));
      EXPECT_FALSE(l.lapsAgree(!lap));
      EXPECT_EQ(l.opcode(), sig ? Opcode::kPutWithSignal : Opcode::kPut);
      EXPECT_EQ(l.peer(), peer);
      EXPECT_EQ(l.srcWindow(), sw);
      EXPECT_EQ(l.dstWindow(), dw);
      EXPECT_EQ(l.srcOffset(), so);
      EXPECT_EQ(l.dstOffset(), dof);
      EXPECT_EQ(l.size(), sz);
    }
  }
}

TEST(Command, SignalAndAtomicCarryFull64BitValues) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 10000; ++i) {
    uint64_t v = i == 0 ? ~uint64_t{0} : rng();
    uint32_t id = rng() % kMaxSignals, peer = rng() % kMaxPeers;
    Command s = Command::signal(peer, id, v, (i & 1) ? SignalOp::kAdd : SignalOp::kSet).withLap(1);
    EXPECT_EQ(s.opcode(), (i & 1) ? Opcode::kSignalAdd : Opcode::kSignalSet);
    EXPECT_EQ(s.peer(), peer);
    EXPECT_EQ(s.signalId(), id);
    EXPECT_EQ(s.value(), v);
    uint64_t off = rng() & kMaxWindowOffset;
    Command a = Command::atomicAdd(peer, 7, off, v).withLap(1);
    EXPECT_EQ(a.opcode(), Opcode::kAtomicAdd);
    EXPECT_EQ(a.dstWindow(), 7u);
    EXPECT_EQ(a.dstOffset(), off);
    EXPECT_EQ(a.value(), v);
  }
}

TEST(Command, TornHalvesAreDetected) {
  Command c = Command::put(1, 2, 3, 4, 5, 6).withLap(1);
  Command torn = c;
  torn.word[1] &= ~kLapBit;  // second half still from the previous lap
  EXPECT_FALSE(torn.lapsAgree(1));
  EXPECT_FALSE(torn.lapsAgree(0));
}

}  // namespace
}  // namespace gdx
