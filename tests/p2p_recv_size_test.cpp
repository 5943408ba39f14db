// Receives of gdx::p2p::Endpoint into buffers at least as large as the message, between real processes on loopback:
// messages of 1 byte up to exactly the buffer, on both sides of the eager threshold, with the receive posted before
// and after the data; every byte of the message checked, and the poisoned rest of the buffer (and a guard past it)
// checked untouched; the size reported by recv(), recvv(), wait() and poll(). A message larger than its buffer fails
// the send and the receive, each naming both sizes, writes nothing, and the sends and receives after it still pair.
// And connect(): to a port whose listener starts half a second later (it retries), and to a port nobody listens on
// (it says so while it retries, and fails within the timeout naming the address, the attempts and the last errno).
// Runs over GDX_TRANSPORT (tcp here; the Soft-RoCE VM runs the same binary with GDX_TRANSPORT=verbs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "p2p/protocol.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;
using p2p::Iov;
using p2p::kEagerBytes;

constexpr unsigned char kPoison = 0xA5;
/// Bytes past the buffer, inside the registered region, that nothing may write either.
constexpr size_t kGuard = 64;

void expectAllZero(const std::vector<int>& codes) {
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

/// (message, buffer) sizes: 1 byte, a few bytes short, exactly the buffer, on both sides of the eager threshold.
const std::vector<std::pair<size_t, size_t>> kCases = {
    {1, 1},
    {1, kEagerBytes},
    {100, kEagerBytes},
    {kEagerBytes - 1, kEagerBytes},
    {kEagerBytes, kEagerBytes},
    {1, kEagerBytes + 1},
    {kEagerBytes, kEagerBytes + 1},
    {kEagerBytes + 1, kEagerBytes + 1},
    {1, 1 << 20},
    {kEagerBytes, 1 << 20},
    {kEagerBytes + 1, 1 << 20},
    {65537, 1 << 20},
    {(1 << 20) - 1, 1 << 20},
    {1 << 20, 1 << 20},
    {(3 << 20) + 5, (4 << 20) + 3},
};

/// How a round's receives are posted and how their sizes are read back.
enum class Round {
  kBlockingAfterData,  ///< the data (or a large send's announcement) is here first; recv() returns the size
  kAsyncBeforeData,    ///< recvAsync posted first; wait(id, &sizes)
  kPolledBeforeData,   ///< recvAsync posted first; poll(id, &sizes)
};

/// A buffer of `bytes` plus kGuard, poisoned, as the receiver holds it.
struct Landing {
  std::vector<unsigned char> mem;
  uint64_t mr = 0;
  size_t bytes = 0;
  Landing(Endpoint& ep, size_t n) : mem(n + kGuard, kPoison), mr(ep.reg(mem.data(), mem.size())), bytes(n) {}
};

/// 0 when `got` holds `n` bytes of seed `seed` at its start and poison everywhere after; else prints what is wrong.
int checkLanded(const Landing& got, size_t n, uint64_t seed, const char* what) {
  std::vector<unsigned char> want(n);
  fillRandom(want.data(), n, seed);
  const long long bad = firstMismatch(got.mem.data(), want.data(), n);
  if (bad != -1) {
    std::fprintf(stderr, "%s: a message of %zu bytes into %zu: byte %lld differs\n", what, n, got.bytes, bad);
    return 1;
  }
  for (size_t i = n; i < got.mem.size(); ++i)
    if (got.mem[i] != kPoison) {
      std::fprintf(stderr, "%s: a message of %zu bytes into %zu: byte %zu past it was written%s\n", what, n, got.bytes,
                   i, i >= got.bytes ? " (past the buffer)" : "");
      return 1;
    }
  return 0;
}

uint64_t seedOf(int round, size_t i) {
  return 1000 * static_cast<uint64_t>(round) + i;
}

TEST(P2pRecvSize, SmallerMessagesLandAtTheStartOfTheBufferAndTheirSizeIsReported) {
  const std::vector<Round> rounds = {Round::kBlockingAfterData, Round::kAsyncBeforeData, Round::kPolledBeforeData};
  expectAllZero(runServerClients(
      1,
      [&](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        for (size_t r = 0; r < rounds.size(); ++r) {
          std::vector<Landing> got;
          for (const auto& c : kCases) got.emplace_back(ep, c.second);
          std::vector<size_t> sizes(kCases.size(), 0);
          if (rounds[r] == Round::kBlockingAfterData) {
            usleep(300 * 1000);  // the eager messages wait in the eager buffer, the large ones announced themselves
            for (size_t i = 0; i < kCases.size(); ++i)
              sizes[i] = ep.recv(conn, got[i].mr, got[i].mem.data(), got[i].bytes);
          } else {
            std::vector<uint64_t> ids;
            for (auto& g : got) ids.push_back(ep.recvAsync(conn, g.mr, g.mem.data(), g.bytes));
            sendBlob(ep, conn, "posted");
            for (size_t i = 0; i < ids.size(); ++i) {
              std::vector<size_t> one;
              if (rounds[r] == Round::kAsyncBeforeData) {
                ep.wait(ids[i], &one);
              } else {
                const uint64_t deadline = nowNs() + 60ull * 1000 * 1000 * 1000;
                while (!ep.poll(ids[i], &one)) CHILD_CHECK(nowNs() < deadline);
              }
              CHILD_CHECK(one.size() == 1);
              sizes[i] = one[0];
            }
          }
          for (size_t i = 0; i < kCases.size(); ++i) {
            if (sizes[i] != kCases[i].first)
              std::fprintf(stderr, "round %zu, case %zu: reported %zu bytes, sent %zu\n", r, i, sizes[i],
                           kCases[i].first);
            CHILD_CHECK(sizes[i] == kCases[i].first);
            CHILD_CHECK(checkLanded(got[i], kCases[i].first, seedOf(r, i), "recv") == 0);
          }
        }
        return 0;
      },
      [&](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (size_t r = 0; r < rounds.size(); ++r) {
          if (rounds[r] != Round::kBlockingAfterData) CHILD_CHECK(recvBlob(ep, conn) == "posted");
          std::vector<std::vector<unsigned char>> data;
          std::vector<uint64_t> ids;
          for (size_t i = 0; i < kCases.size(); ++i) {
            data.emplace_back(kCases[i].first);
            fillRandom(data.back().data(), data.back().size(), seedOf(r, i));
          }
          for (auto& d : data) ids.push_back(ep.sendAsync(conn, ep.reg(d.data(), d.size()), d.data(), d.size()));
          for (uint64_t id : ids) ep.wait(id);
        }
        return 0;
      }));
}

/// (message, buffer) sizes of messages too large: eager into eager, large into eager, large into large.
const std::vector<std::pair<size_t, size_t>> kTooLarge = {
    {200, 100},
    {kEagerBytes, kEagerBytes - 1},
    {kEagerBytes + 1, 100},
    {kEagerBytes + 1, kEagerBytes},
    {5000, kEagerBytes + 1},
    {(1 << 20) + 1, 1 << 20},
};

bool names(const std::string& why, const std::string& part) {
  if (why.find(part) != std::string::npos) return true;
  std::fprintf(stderr, "child %d: the error does not name '%s': %s\n", getpid(), part.c_str(), why.c_str());
  return false;
}

TEST(P2pRecvSize, AMessageLargerThanItsBufferFailsBothSidesNamingBothSizesAndWritesNothing) {
  // Each too large message is followed by one that fits (its buffer's size minus one, random bytes): that it lands
  // whole in the next receive shows that the pairing was kept. Receives posted after the data came, then before.
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        for (bool receiveFirst : {false, true}) {
          for (size_t i = 0; i < kTooLarge.size(); ++i) {
            const size_t sent = kTooLarge[i].first, buffer = kTooLarge[i].second;
            Landing refused(ep, buffer), next(ep, buffer);
            if (receiveFirst) {
              const uint64_t id = ep.recvAsync(conn, refused.mr, refused.mem.data(), buffer);
              sendBlob(ep, conn, "posted");
              ErrorCode code = ErrorCode::kOk;
              const std::string why = errorOf([&] { ep.wait(id); }, &code);
              CHILD_CHECK(code == ErrorCode::kInvalidArgument);
              CHILD_CHECK(names(why, "the peer's send is " + std::to_string(sent) +
                                         " bytes, larger than this receive's buffer of " + std::to_string(buffer) +
                                         " bytes (nothing was written)"));
            } else {
              usleep(200 * 1000);  // the eager data is here, or the large send announced itself
              ErrorCode code = ErrorCode::kOk;
              const std::string why = errorOf([&] { ep.recv(conn, refused.mr, refused.mem.data(), buffer); }, &code);
              CHILD_CHECK(code == ErrorCode::kInvalidArgument);
              CHILD_CHECK(names(why, "the peer's send is " + std::to_string(sent) +
                                         " bytes, larger than this receive's buffer of " + std::to_string(buffer)));
            }
            CHILD_CHECK(checkLanded(refused, 0, 0, "refused receive") == 0);
            CHILD_CHECK(ep.recv(conn, next.mr, next.mem.data(), buffer) == buffer - 1);
            CHILD_CHECK(checkLanded(next, buffer - 1, 50 + i, "the receive after a refused one") == 0);
            ep.dereg(refused.mr);
            ep.dereg(next.mr);
          }
        }
        CHILD_CHECK(recvBlob(ep, conn) == "still works");
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (bool receiveFirst : {false, true}) {
          for (size_t i = 0; i < kTooLarge.size(); ++i) {
            const size_t sent = kTooLarge[i].first, buffer = kTooLarge[i].second;
            std::vector<unsigned char> big(sent, 1), fits(buffer - 1);
            fillRandom(fits.data(), fits.size(), 50 + i);
            const uint64_t bigMr = ep.reg(big.data(), big.size()), fitsMr = ep.reg(fits.data(), fits.size());
            if (receiveFirst) CHILD_CHECK(recvBlob(ep, conn) == "posted");
            ErrorCode code = ErrorCode::kOk;
            const std::string why = errorOf([&] { ep.send(conn, bigMr, big.data(), sent); }, &code);
            CHILD_CHECK(code == ErrorCode::kInvalidArgument);
            CHILD_CHECK(names(why, "send #"));
            CHILD_CHECK(names(why, " of " + std::to_string(sent) + " bytes"));
            CHILD_CHECK(names(why, "has a buffer of " + std::to_string(buffer) + " bytes, smaller than this send"));
            ep.send(conn, fitsMr, fits.data(), fits.size());
            ep.dereg(bigMr);
            ep.dereg(fitsMr);
          }
        }
        sendBlob(ep, conn, "still works");
        return 0;
      }));
}

/// A sendv's pieces and the recvv buffers they go to, piece i into buffer i (each buffer at least its piece).
const std::vector<size_t> kPieces = {1, kEagerBytes, kEagerBytes + 1, 70000, 3, (1 << 20) + 7};
const std::vector<size_t> kBuffers = {10, 2 * kEagerBytes, kEagerBytes + 1, 1 << 20, 3, (2 << 20) + 1};

TEST(P2pRecvSize, RecvvTakesPieceIOfTheSendvIntoBufferIAndReportsEachSize) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port, 2));
        const uint64_t conn = ep.accept().connId;
        for (int round = 0; round < 3; ++round) {  // blocking, async + wait, async + poll
          std::vector<Landing> got;
          std::vector<Iov> iovs;
          for (size_t b : kBuffers) got.emplace_back(ep, b);
          for (auto& g : got) iovs.push_back(Iov{g.mr, g.mem.data(), g.bytes});
          std::vector<size_t> sizes;
          if (round == 0) {
            sizes = ep.recvv(conn, iovs);
          } else {
            const uint64_t id = ep.recvvAsync(conn, iovs);
            if (round == 1) {
              ep.wait(id, &sizes);
            } else {
              const uint64_t deadline = nowNs() + 60ull * 1000 * 1000 * 1000;
              while (!ep.poll(id, &sizes)) CHILD_CHECK(nowNs() < deadline);
            }
          }
          CHILD_CHECK(sizes == kPieces);
          for (size_t i = 0; i < kPieces.size(); ++i)
            CHILD_CHECK(checkLanded(got[i], kPieces[i], seedOf(round, i), "recvv") == 0);
        }
        // A vector whose third buffer is one byte short of its piece: the whole receive fails naming that buffer's
        // sizes, the sendv fails too, and the next message pairs with the next receive.
        std::vector<Landing> got;
        std::vector<Iov> iovs;
        for (size_t i = 0; i < kBuffers.size(); ++i) got.emplace_back(ep, i == 2 ? kPieces[2] - 1 : kBuffers[i]);
        for (auto& g : got) iovs.push_back(Iov{g.mr, g.mem.data(), g.bytes});
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.recvv(conn, iovs); }, &code);
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(names(why, "the peer's send is " + std::to_string(kPieces[2]) +
                                   " bytes, larger than this receive's buffer of " + std::to_string(kPieces[2] - 1)));
        for (size_t i = 2; i < got.size(); ++i) CHILD_CHECK(checkLanded(got[i], 0, 0, "a failed recvv") == 0);
        sendBlob(ep, conn, "refused");
        Landing next(ep, 100);
        CHILD_CHECK(ep.recv(conn, next.mr, next.mem.data(), next.bytes) == 42);
        CHILD_CHECK(checkLanded(next, 42, 77, "the receive after a failed recvv") == 0);
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0, 2));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        auto pieces = [&](int round, std::vector<std::vector<unsigned char>>* data) {
          std::vector<Iov> iovs;
          for (size_t i = 0; i < kPieces.size(); ++i) {
            data->emplace_back(kPieces[i]);
            fillRandom(data->back().data(), kPieces[i], seedOf(round, i));
          }
          for (auto& d : *data) iovs.push_back(Iov{ep.reg(d.data(), d.size()), d.data(), d.size()});
          return iovs;
        };
        for (int round = 0; round < 3; ++round) {
          std::vector<std::vector<unsigned char>> data;
          ep.sendv(conn, pieces(round, &data));
        }
        std::vector<std::vector<unsigned char>> data;
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.sendv(conn, pieces(9, &data)); }, &code);
        CHILD_CHECK(code != ErrorCode::kOk);
        CHILD_CHECK(recvBlob(ep, conn) == "refused");
        std::vector<unsigned char> last(42);
        fillRandom(last.data(), last.size(), 77);
        ep.send(conn, ep.reg(last.data(), last.size()), last.data(), last.size());
        return 0;
      }));
}

// ---- connect ----------------------------------------------------------------------------------------------------

TEST(P2pConnect, AClientConnectsToAListenerThatStartsHalfASecondLater) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        usleep(500 * 1000);  // the client is refused meanwhile, and retries
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        CHILD_CHECK(recvBlob(ep, conn) == "connected late");
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t t0 = nowNs();
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        const double ms = (nowNs() - t0) / 1e6;
        std::fprintf(stderr, "connected after %.0f ms\n", ms);
        CHILD_CHECK(ms >= 300);  // it did wait for the listener
        CHILD_CHECK(ms < 5000);  // and came soon after it (the pauses stay short early on)
        sendBlob(ep, conn, "connected late");
        return 0;
      }));
}

TEST(P2pConnect, ConnectingToNobodySaysSoWhileItRetriesAndFailsWithinTheTimeoutNamingTheAddress) {
  const int code = waitChild(forkChild([] {
    setenv("GDX_LOG_LEVEL", "WARN", 1);  // the report of the retries is a WARN line
    const int port = freePort();         // nobody listens there
    p2p::EndpointOptions o = loopbackEndpoint(0);
    o.timeoutNs = 2500ull * 1000 * 1000;
    Endpoint ep(o);
    CapturedStderr log;
    const uint64_t t0 = nowNs();
    ErrorCode code = ErrorCode::kOk;
    const std::string why = errorOf([&] { ep.connect("127.0.0.1", 3, port); }, &code);
    const double ms = (nowNs() - t0) / 1e6;
    const std::string logged = log.restore();
    std::fprintf(stderr, "failed after %.0f ms: %s\n", ms, why.c_str());
    CHILD_CHECK(code == ErrorCode::kTimeout);
    CHILD_CHECK(ms >= 2000 && ms < 4000);  // it kept trying until shortly before the timeout, not past it
    const std::string address = "127.0.0.1:" + std::to_string(port) + " (GPU 3)";
    CHILD_CHECK(names(why, "connecting to " + address));
    CHILD_CHECK(names(why, "within GDX_TIMEOUT_MS (2500 ms)"));
    CHILD_CHECK(names(why, " attempts in "));
    CHILD_CHECK(names(why, "the last: Connection refused (ECONNREFUSED)"));
    // 10 ms doubling to 1 s: 10 + 20 + ... + 640 ms, then 1 s pauses, about 9 attempts in 2.5 s (not 50 of 50 ms).
    const size_t at = why.find(" attempts in ");
    const size_t from = why.rfind(' ', at - 1) + 1;
    const int attempts = std::stoi(why.substr(from, at - from));
    CHILD_CHECK(attempts >= 5 && attempts <= 14);
    // The retries were reported after the first second: what it connects to, why it failed, how long it goes on.
    CHILD_CHECK(names(logged, "connecting to " + address + ": connection refused, retrying for another "));
    return 0;
  }));
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace gdx::test
