// The command ring under load: 8 host producer threads x 1e6 commands, one consumer, ring sizes 2 .. 4096.
// Every command carries its producer, its sequence number and a checksum of both in the other fields; the
// consumer checks that each producer's commands arrive exactly once, in order, and intact.
#include "base/command_ring.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gdx/error.hpp"

namespace gdx {
namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// The payload of command `seq` of `producer`: every field is a function of the two, so a torn, duplicated or
// misplaced command shows up as a mismatch.
Command expectedCommand(uint32_t producer, uint64_t seq) {
  uint64_t h = mix(producer * 0x100000001ull + seq);
  if (seq % 7 == 3) return Command::signal(producer, h % kMaxSignals, h, SignalOp::kAdd);
  return Command::put(producer, h % kMaxWindows, seq & kMaxWindowOffset, (h >> 8) % kMaxWindows,
                      (h >> 12) & kMaxWindowOffset, (h >> 40) & kMaxCommandBytes);
}

struct StressResult {
  uint64_t received = 0;
  uint64_t fullObserved = 0;
};

StressResult runStress(uint64_t capacity, int producers, uint64_t perProducer, bool withPairs) {
  CommandRing ring({capacity, -1, 60ull * 1000 * 1000 * 1000});
  RingDeviceHandle h = ring.hostHandle();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (uint64_t s = 0; s < perProducer;) {
        Status st;
        if (withPairs && capacity >= 2 && s % 5 == 0 && s + 1 < perProducer) {
          Command first = expectedCommand(p, s);
          first = Command::put(first.peer(), first.srcWindow(), first.srcOffset(), first.dstWindow(), first.dstOffset(),
                               first.size(), Opcode::kPutWithSignal);
          st = h.pushPair(first, expectedCommand(p, s + 1));
          s += 2;
        } else {
          st = h.push(expectedCommand(p, s));
          s += 1;
        }
        if (st != Status::kOk) {
          failures++;
          return;
        }
      }
    });
  }
  std::vector<uint64_t> next(producers, 0);
  StressResult r;
  const uint64_t total = producers * perProducer;
  std::vector<Command> batch(64);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  uint64_t sincePause = 0;
  while (r.received < total && std::chrono::steady_clock::now() < deadline && failures == 0) {
    size_t n = ring.poll(batch.data(), batch.size());
    if (n == 0) std::this_thread::yield();  // on a small machine the producers need the core
    for (size_t i = 0; i < n; ++i) {
      const Command& c = batch[i];
      uint32_t p = c.peer();
      if (p >= static_cast<uint32_t>(producers)) {
        ADD_FAILURE() << "command from unknown producer " << p;
        return r;
      }
      uint64_t s = next[p]++;
      Command want = expectedCommand(p, s);
      bool pairHead = withPairs && s % 5 == 0 && s + 1 < perProducer;
      if (pairHead)
        want = Command::put(want.peer(), want.srcWindow(), want.srcOffset(), want.dstWindow(), want.dstOffset(),
                            want.size(), Opcode::kPutWithSignal);
      Command got = c.withLap(0);
      if (got.word[0] != want.word[0] || got.word[1] != want.word[1]) {
        ADD_FAILURE() << "producer " << p << " command " << s << " arrived as " << std::hex << got.word[0] << ":"
                      << got.word[1] << ", expected " << want.word[0] << ":" << want.word[1];
        return r;
      }
    }
    r.received += n;
    sincePause += n;
    ring.publishTail();
    ring.publishCompleted(ring.consumed());
    // Hold the consumer back now and then so that producers spend long stretches facing a full ring.
    if (sincePause > 50000) {
      sincePause = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (atomicLoad(h.head, kRelaxed) - ring.consumed() >= capacity) r.fullObserved++;
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << "a producer's push failed";
  EXPECT_EQ(r.received, total);
  for (int p = 0; p < producers; ++p) EXPECT_EQ(next[p], perProducer) << "producer " << p;
  EXPECT_EQ(ring.poll(batch.data(), batch.size()), 0u) << "more commands than were pushed";
  return r;
}

uint64_t perProducerFromEnv() {
  const char* v = std::getenv("GDX_RING_STRESS_COUNT");
  return v ? std::strtoull(v, nullptr, 10) : 1000000;
}

class RingStress : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RingStress, EightProducersMillionEachArriveExactlyOnceIntact) {
  StressResult r = runStress(GetParam(), 8, perProducerFromEnv(), /*withPairs=*/false);
  EXPECT_GT(r.fullObserved, 0u) << "the ring was never seen full; the test did not exercise back-pressure";
}

TEST_P(RingStress, PutWithSignalPairsStayTogether) {
  runStress(GetParam(), 4, 200000, /*withPairs=*/true);
}

INSTANTIATE_TEST_SUITE_P(Capacities, RingStress, ::testing::Values(2, 4, 16, 128, 1024, 4096));

TEST(CommandRing, RejectsCapacityThatIsNotAPowerOfTwo) {
  EXPECT_THROW(CommandRing({3, -1, 0}), Error);
  EXPECT_THROW(CommandRing({1, -1, 0}), Error);
}

TEST(CommandRing, FullRingTimesOutWithinBound) {
  CommandRing ring({4, -1, 200ull * 1000 * 1000});
  RingDeviceHandle h = ring.hostHandle();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1)), Status::kOk);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1)), Status::kTimeout);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.2);
  EXPECT_LT(s, 0.4);
}

TEST(CommandRing, ErrorWordEndsProducerWaitsEarly) {
  CommandRing ring({2, -1, 10ull * 1000 * 1000 * 1000});
  RingDeviceHandle h = ring.hostHandle();
  ASSERT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1)), Status::kOk);
  ASSERT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1)), Status::kOk);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ring.setError(Status::kPeerFailed);
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1)), Status::kPeerFailed);
  EXPECT_EQ(h.waitCompleted(0), Status::kPeerFailed);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  t.join();
}

TEST(CommandRing, WaitCompletedFollowsPublishedCompletion) {
  CommandRing ring({8, -1, 100ull * 1000 * 1000});
  RingDeviceHandle h = ring.hostHandle();
  uint64_t pos = 0;
  ASSERT_EQ(h.push(Command::put(0, 0, 0, 0, 0, 1), &pos), Status::kOk);
  EXPECT_EQ(h.waitCompleted(pos), Status::kTimeout);
  Command c[2];
  ASSERT_EQ(ring.poll(c, 2), 1u);
  ring.publishCompleted(ring.consumed());
  EXPECT_EQ(h.waitCompleted(pos), Status::kOk);
}

}  // namespace
}  // namespace gdx
