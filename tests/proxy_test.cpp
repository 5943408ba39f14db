// The proxy over the loopback transport (a world of one, host memory): consecutive puts become one transport write
// and a putWithSignal that continues them announces their data only once all of it is in place; runs longer than the
// merge cap are split; a put the registry refuses in the middle of a run is rejected alone while the puts around it
// arrive; with Options::timing the threads time their handling and the operations in flight, and without it they
// read no clock. Commands are pushed before the proxy starts, so whole runs land in one batch.
#include "proxy/proxy.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "base/window_registry.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "proxy/placement.hpp"
#include "proxy/write_merger.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

constexpr uint32_t kSrc = 1;
constexpr uint32_t kDst = 2;
constexpr size_t kWindowBytes = size_t{4} << 20;
constexpr unsigned char kPoison = 0xA5;

class ProxyMerge : public ::testing::Test {
 protected:
  void SetUp() override {
    src_.resize(kWindowBytes);
    std::mt19937_64 rng(20261123);
    for (auto& b : src_) b = static_cast<unsigned char>(rng());
    dst_.assign(kWindowBytes, kPoison);
    transport_ = makeLoopbackTransport();
    transport_->connect({transport_->localAddress()}, 1);
    addWindow(kSrc, src_.data(), kWindowBytes);
    addWindow(kDst, dst_.data(), kWindowBytes);
    addWindow(kSignalWindowId, signals_, sizeof signals_);
    transport_->setImmHandler([this](const RemoteWrite& w) {
      // The announced write must carry the whole run before it: every byte from the run's start is in place.
      imms_.push_back(w);
      dataInPlaceAtImm_.push_back(
          std::memcmp(dst_.data() + runStart_, src_.data() + runStart_, w.offset + w.bytes - runStart_) == 0);
    });
    Proxy::Options o;
    o.threads = 1;
    o.ringsPerThread = 1;
    o.deviceRingsPerThread = 0;
    o.ringCapacity = 4096;
    o.timeoutNs = 10ull * 1000 * 1000 * 1000;
    o.placement = defaultPlacement();
    o.timing = timing_;
    proxy_ = std::make_unique<Proxy>(o, transport_.get(), registry_);
    ring_ = proxy_->ring(0).hostHandle();
  }
  void TearDown() override {
    proxy_->stop();
    transport_->shutdown();
  }

  void addWindow(uint32_t id, void* base, size_t bytes) {
    registry_.addLocal(id, base, bytes, MemoryKind::kHost);
    registry_.addRemote(0, id, bytes);
    transport_->addRemoteWindow(0, id, bytes, transport_->registerWindow(id, base, bytes, MemoryKind::kHost));
  }
  void put(uint64_t offset, uint64_t bytes) {
    ASSERT_EQ(ring_.push(Command::put(0, kSrc, offset, kDst, offset, bytes)), Status::kOk);
    ++pushed_;
  }
  void putWithSignal(uint64_t offset, uint64_t bytes, uint32_t signal) {
    ASSERT_EQ(ring_.pushPair(Command::put(0, kSrc, offset, kDst, offset, bytes, Opcode::kPutWithSignal),
                             Command::signal(0, signal, 1, SignalOp::kAdd)),
              Status::kOk);
    pushed_ += 2;
  }
  /// Starts the proxy and waits (bounded) until it completed every position pushed.
  void drain() {
    proxy_->start();
    const auto t0 = std::chrono::steady_clock::now();
    while (atomicLoad(ring_.completed, kAcquire) < pushed_) {
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
          << "the proxy completed " << atomicLoad(ring_.completed, kAcquire) << " of " << pushed_ << " positions";
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  /// Every byte of [from, to) of the destination equals the source (`copied`) or is still poison.
  void expectRange(uint64_t from, uint64_t to, bool copied) {
    for (uint64_t i = from; i < to; ++i) {
      const unsigned char want = copied ? src_[i] : kPoison;
      ASSERT_EQ(dst_[i], want) << "destination byte " << i << (copied ? " was not delivered" : " was written");
    }
  }

  std::vector<unsigned char> src_, dst_;
  uint64_t signals_[64] = {};
  WindowRegistry registry_{0, 1, kMaxWindows};
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Proxy> proxy_;
  RingDeviceHandle ring_{};
  uint64_t pushed_ = 0;
  uint64_t runStart_ = 0;
  bool timing_ = false;
  std::vector<RemoteWrite> imms_;
  std::vector<bool> dataInPlaceAtImm_;
};

TEST_F(ProxyMerge, ConsecutivePutsBecomeOneWriteAndTheirSignalFollowsAllTheirData) {
  constexpr uint64_t kPuts = 200, kBytes = 64;
  for (uint64_t i = 0; i < kPuts; ++i) put(i * kBytes, kBytes);
  putWithSignal(kPuts * kBytes, kBytes, 3);
  // Then 100 puts that do not continue each other (gaps between them, descending): one write each.
  constexpr uint64_t kScattered = 100, kRegion = 1 << 20;
  for (uint64_t i = 0; i < kScattered; ++i) put(kRegion + (kScattered - 1 - i) * 2 * kBytes, kBytes);
  drain();

  expectRange(0, (kPuts + 1) * kBytes, true);
  expectRange((kPuts + 1) * kBytes, kRegion, false);
  for (uint64_t i = 0; i < kScattered; ++i) {
    expectRange(kRegion + i * 2 * kBytes, kRegion + i * 2 * kBytes + kBytes, true);
    expectRange(kRegion + i * 2 * kBytes + kBytes, kRegion + (i + 1) * 2 * kBytes, false);
  }
  expectRange(kRegion + kScattered * 2 * kBytes, kWindowBytes, false);
  ASSERT_EQ(imms_.size(), 1u);
  const SignalUpdate u = decodeSignalImm(imms_[0].imm);
  EXPECT_TRUE(u.valid && u.id == 3 && u.value == 1 && u.op == SignalOp::kAdd);
  EXPECT_TRUE(dataInPlaceAtImm_[0]) << "the signal was announced before the puts merged with it were in place";
  EXPECT_EQ(imms_[0].offset + imms_[0].bytes, (kPuts + 1) * kBytes);
  const ProxyCounters c = proxy_->totalCounters();
  EXPECT_EQ(c.commands, pushed_);
  EXPECT_EQ(c.errors, 0u);
  EXPECT_EQ(c.bytes, (kPuts + 1 + kScattered) * kBytes);
  // The contiguous run is one write (two if a batch ends inside it); the scattered puts one write each.
  EXPECT_GE(c.writes, 1 + kScattered);
  EXPECT_LE(c.writes, 2 + kScattered) << "consecutive puts were not merged";
  EXPECT_EQ(c.handlingNs, 0u) << "timed without Options::timing";
  EXPECT_EQ(c.inFlightNs, 0u) << "timed without Options::timing";
}

class ProxyTiming : public ProxyMerge {
 protected:
  void SetUp() override {
    timing_ = true;
    ProxyMerge::SetUp();
  }
};

TEST_F(ProxyTiming, TheThreadsTimeTheirHandlingAndTheOperationsInFlight) {
  constexpr uint64_t kBytes = 4096;
  for (uint64_t i = 0; i < 300; ++i) put(i * 2 * kBytes, kBytes);  // gaps: 300 writes
  const auto t0 = std::chrono::steady_clock::now();
  drain();
  const uint64_t wallNs = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  for (uint64_t i = 0; i < 300; ++i) expectRange(i * 2 * kBytes, i * 2 * kBytes + kBytes, true);
  // The operations in flight end when the proxy reaps their completions, which may come after the ring's positions
  // are published: wait (bounded) for the in-flight span to close.
  ProxyCounters c = proxy_->totalCounters();
  for (int i = 0; i < 1000 && c.inFlightNs == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    c = proxy_->totalCounters();
  }
  EXPECT_EQ(c.commands, 300u);
  EXPECT_EQ(c.writes, 300u);
  EXPECT_GT(c.handlingNs, 0u) << "no handling time recorded";
  EXPECT_LE(c.handlingNs, wallNs) << "more handling time than the drain lasted (one thread)";
  EXPECT_GT(c.inFlightNs, 0u) << "no time with operations in flight recorded";
}

TEST_F(ProxyMerge, RunsLongerThanTheCapAreSplitAndEveryByteArrives) {
  constexpr uint64_t kBytes = 4096, kTotal = 3 * WriteMerger::kMaxMergedBytes + 5 * kBytes;
  for (uint64_t off = 0; off < kTotal; off += kBytes) put(off, kBytes);
  drain();
  expectRange(0, kTotal, true);
  expectRange(kTotal, kWindowBytes, false);
  const ProxyCounters c = proxy_->totalCounters();
  EXPECT_EQ(c.bytes, kTotal);
  EXPECT_GE(c.writes, kTotal / WriteMerger::kMaxMergedBytes + 1) << "a merged write passed the cap";
  EXPECT_LE(c.writes, kTotal / WriteMerger::kMaxMergedBytes + 1 + c.batches) << "consecutive puts were not merged";
}

TEST_F(ProxyMerge, AnInvalidPutInsideARunIsRejectedAloneAndThePutsAroundItArrive) {
  constexpr uint64_t kBytes = 256;
  for (uint64_t i = 0; i < 10; ++i) put(i * kBytes, kBytes);
  // Continues the run in the source but ends past the destination window: the registry refuses it.
  ASSERT_EQ(ring_.push(Command::put(0, kSrc, 10 * kBytes, kDst, kWindowBytes - kBytes / 2, kBytes)), Status::kOk);
  ++pushed_;
  for (uint64_t i = 11; i < 20; ++i) put(i * kBytes, kBytes);
  runStart_ = 11 * kBytes;
  putWithSignal(20 * kBytes, kBytes, 5);
  drain();
  expectRange(0, 10 * kBytes, true);
  expectRange(10 * kBytes, 11 * kBytes, false);
  expectRange(11 * kBytes, 21 * kBytes, true);
  expectRange(21 * kBytes, kWindowBytes, false);
  ASSERT_EQ(imms_.size(), 1u);
  EXPECT_TRUE(dataInPlaceAtImm_[0]);
  const ProxyCounters c = proxy_->totalCounters();
  EXPECT_EQ(c.errors, 1u);
  EXPECT_EQ(c.writes, 2u) << "the puts before and after the rejected one should be one write each";
  // The rejected command fails alone: the ring works on, and the fault is recorded for its peer at its position.
  EXPECT_EQ(proxy_->ring(0).error(), Status::kOk);
  EXPECT_EQ(proxy_->ring(0).fault(0).lastFailed, 11u);
  EXPECT_EQ(static_cast<Status>(proxy_->ring(0).fault(0).status), Status::kProxyError);
  EXPECT_NE(proxy_->lastError().find("outside"), std::string::npos) << proxy_->lastError();
}

TEST_F(ProxyMerge, AMergedWriteTheTransportRefusesFailsItsOwnPutsAndTheNextCommandArrives) {
  // Window 3 passes the registry's checks but the transport never heard of it (as after a deregistration between
  // the check and the post): the transport refuses the merged write of the four puts into it.
  constexpr uint32_t kUnknown = 3;
  std::vector<unsigned char> unknown(kWindowBytes, kPoison);
  registry_.addLocal(kUnknown, unknown.data(), kWindowBytes, MemoryKind::kHost);
  registry_.addRemote(0, kUnknown, kWindowBytes);
  constexpr uint64_t kBytes = 256;
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(ring_.push(Command::put(0, kSrc, i * kBytes, kUnknown, i * kBytes, kBytes)), Status::kOk);
    ++pushed_;
  }
  // Then a put that does not continue them (another window): posting it is what posts the refused write first.
  put(0, kBytes);
  putWithSignal(kBytes, kBytes, 7);
  drain();
  expectRange(0, 2 * kBytes, true);
  expectRange(2 * kBytes, kWindowBytes, false);
  for (size_t i = 0; i < unknown.size(); ++i) ASSERT_EQ(unknown[i], kPoison) << "byte " << i << " of window 3";
  ASSERT_EQ(imms_.size(), 1u);
  EXPECT_TRUE(dataInPlaceAtImm_[0]);
  EXPECT_EQ(proxy_->totalCounters().errors, 1u);
  // The fault is the four puts', at the last one's position (3; lastFailed counts the positions up to and including
  // it), not the next command's.
  EXPECT_EQ(proxy_->ring(0).error(), Status::kOk);
  EXPECT_EQ(proxy_->ring(0).fault(0).lastFailed, 4u);
  EXPECT_EQ(static_cast<Status>(proxy_->ring(0).fault(0).status), Status::kProxyError);
  EXPECT_NE(proxy_->lastError().find("4 puts merged"), std::string::npos) << proxy_->lastError();
}

}  // namespace
}  // namespace gdx
