#include "support/fault_job.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {
constexpr int kPuts = 10;
constexpr size_t kBytes = 4096;

}  // namespace

// Exit codes: rank 0: 10 flush succeeded where it must fail, 11 flush failed where it must not, 12 its error does not
// name GDX_FAULT; rank 1: 20 the wait succeeded where it must not, 21 wrong bytes, 22 delivered too early, 23 not a
// timeout, 24 the timeout does not name the signal and the value seen, 25 not a peer failure, 26 rank 0 not named,
// 27 an error where delivery was expected.
std::vector<int> runFaultJob(const std::string& transport, const std::string& fault, FaultExpect expect,
                             bool senderNamesFault, long long minMs) {
  using Expect = FaultExpect;
  return test::runRanks(2, [&](int rank) {
    setenv("GDX_TIMEOUT_MS", "4000", 1);
    setenv("GDX_TRANSPORT", transport.c_str(), 1);
    if (rank == 0) setenv("GDX_FAULT", fault.c_str(), 1);
    Context ctx;
    std::vector<unsigned char> src(kPuts * kBytes), dst(kPuts * kBytes, 0);
    test::fillRandom(src.data(), src.size(), 5);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    // Before the barrier: rank 0 cannot start sending before this rank entered it, so a delay of the sender shows
    // in full in what this rank measures (after the barrier, a late exit from it would hide part of the delay).
    const auto t0 = std::chrono::steady_clock::now();
    if (rank == 0) {
      ctx.barrier();
      Channel ch = ctx.channel(1);
      try {
        for (int i = 0; i < kPuts; ++i) ch.putWithSignal(d, i * kBytes, s, i * kBytes, kBytes, 0, 1);
        ch.flush();
        if (senderNamesFault) return 10;
      } catch (const Error& e) {
        std::fprintf(stderr, "rank 0: %s\n", e.what());
        if (expect != Expect::kPeerFailed) return 11;
        if (senderNamesFault && std::string(e.what()).find("GDX_FAULT") == std::string::npos) return 12;
      }
      if (expect == Expect::kDelivered) {
        ctx.barrier();  // rank 1 has checked everything: close normally
        return 0;
      }
      // Stay until rank 1's wait ended on its own (a closed connection would end it sooner).
      if (expect == Expect::kTimeout) std::this_thread::sleep_for(std::chrono::milliseconds(5500));
      std::fflush(stderr);
      _exit(0);
    }
    try {
      // Inside the try: a sender whose fault fails the peer at once may exit (ending the rendezvous it hosts) before
      // this rank read the barrier's release, and that error, a failed peer naming rank 0, is one this rank expects.
      ctx.barrier();
      ctx.wait(0, kPuts);
      const long long ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      if (expect != Expect::kDelivered) return 20;
      if (std::memcmp(dst.data(), src.data(), dst.size()) != 0) return 21;
      if (ms < minMs) return 22;
      ctx.barrier();
      return 0;
    } catch (const Error& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      const std::string what = e.what();
      if (expect == Expect::kTimeout) {
        if (e.code() != ErrorCode::kTimeout) return 23;
        if (what.find("signal 0 >= 10") == std::string::npos || what.find("last value seen") == std::string::npos)
          return 24;
      } else if (expect == Expect::kPeerFailed) {
        if (e.code() != ErrorCode::kPeerFailed && e.code() != ErrorCode::kProtocol) return 25;
        if (what.find("rank 0") == std::string::npos && what.find("peer 0") == std::string::npos) return 26;
      } else {
        return 27;
      }
    }
    std::fflush(stderr);
    _exit(0);
  });
}

}  // namespace gdx::test
