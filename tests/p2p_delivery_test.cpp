// What gdx::p2p::Endpoint delivers when something fails, between real processes on loopback TCP: a send that failed
// (its timeout) is never taken by a receive posted later, and the sends after it pair with the receives after it;
// dereg() returns only once no transfer reads the region any more; close(connId) releases a connection (its sockets
// and threads) and fails what still waits on it by name, and connections whose peer left are released too. Random
// bytes, guard bytes around the buffers, every byte compared.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
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

constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0x5A;

void expectAllZero(const std::vector<int>& codes) {
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

/// A buffer of `n` bytes poisoned with 0xA5 between two guards of kGuardByte.
struct Guarded {
  explicit Guarded(size_t n) : bytes(n + 2 * kGuard, kGuardByte) {
    std::fill(bytes.begin() + kGuard, bytes.end() - kGuard, 0xA5);
  }
  unsigned char* data() { return bytes.data() + kGuard; }
  size_t size() const { return bytes.size() - 2 * kGuard; }
  bool guardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (bytes[i] != kGuardByte || bytes[bytes.size() - 1 - i] != kGuardByte) return false;
    return true;
  }
  std::vector<unsigned char> bytes;
};

bool allAre(const std::vector<unsigned char>& b, unsigned char v) {
  for (unsigned char x : b)
    if (x != v) return false;
  return true;
}

/// Compares `got` with the random bytes of `seed`; prints what differs.
bool holds(Guarded& got, uint64_t seed, const char* what) {
  std::vector<unsigned char> want(got.size());
  fillRandom(want.data(), want.size(), seed);
  const long long at = firstMismatch(got.data(), want.data(), want.size());
  if (at != -1) {
    std::vector<unsigned char> other(got.size());
    int from = -1;
    for (uint64_t s : {seed - 1, seed + 1}) {  // the message before or after it?
      fillRandom(other.data(), other.size(), s);
      if (firstMismatch(got.data(), other.data(), other.size()) == -1) from = static_cast<int>(s % 10);
    }
    std::fprintf(stderr, "%s (%zu bytes): byte %lld differs from message %d's; it holds %s\n", what, got.size(), at,
                 static_cast<int>(seed % 10),
                 from == 0   ? "the send that failed"
                 : from >= 0 ? "another message"
                             : "no message sent");
  }
  if (!got.guardsIntact()) std::fprintf(stderr, "%s: a guard byte around the buffer was overwritten\n", what);
  return at == -1 && got.guardsIntact();
}

/// A send of `n` bytes times out (nobody receives); then the receiver posts two receives and the sender sends its
/// retry and a next message: they must get the retry and the next message. Message seeds: 10 * i + 0 the send that
/// times out, + 1 its retry, + 2 the next message.
void timedOutSendThenRetry(const std::vector<size_t>& sizes) {
  const std::vector<size_t> kSizes = sizes;
  expectAllZero(runServerClients(
      1,
      [&](int port) {
        p2p::EndpointOptions o = loopbackEndpoint(port);
        o.timeoutNs = 3000ull * 1000 * 1000;
        Endpoint ep(o);
        const uint64_t data = ep.accept().connId;  // the client's endpoint with a 1 s timeout
        const uint64_t ctl = ep.accept().connId;   // its other endpoint, for the test's own messages
        for (size_t i = 0; i < kSizes.size(); ++i) {
          CHILD_CHECK(recvBlob(ep, ctl) == "timed out");
          usleep(100 * 1000);  // whatever the client's endpoint said about the failed send has arrived
          Guarded first(kSizes[i]), second(kSizes[i]);
          const uint64_t mr1 = ep.reg(first.bytes.data(), first.bytes.size());
          const uint64_t mr2 = ep.reg(second.bytes.data(), second.bytes.size());
          ErrorCode code = ErrorCode::kOk;
          std::string why = errorOf([&] { ep.recv(data, mr1, first.data(), first.size()); }, &code);
          if (!why.empty()) std::fprintf(stderr, "first receive of %zu bytes: %s\n", kSizes[i], why.c_str());
          CHILD_CHECK(why.empty());
          why = errorOf([&] { ep.recv(data, mr2, second.data(), second.size()); }, &code);
          if (!why.empty()) std::fprintf(stderr, "second receive of %zu bytes: %s\n", kSizes[i], why.c_str());
          CHILD_CHECK(why.empty());
          CHILD_CHECK(holds(first, 10 * i + 1, "the first receive after the timeout (wants the retry)"));
          CHILD_CHECK(holds(second, 10 * i + 2, "the second receive (wants the next message)"));
          ep.dereg(mr1);
          ep.dereg(mr2);
          sendBlob(ep, ctl, "checked");
        }
        return 0;
      },
      [&](int, int port) {
        p2p::EndpointOptions o = loopbackEndpoint(0);
        o.timeoutNs = 1000ull * 1000 * 1000;
        Endpoint ep(o);
        Endpoint side(loopbackEndpoint(0));
        const uint64_t data = ep.connect("127.0.0.1", -1, port);
        const uint64_t ctl = side.connect("127.0.0.1", -1, port);
        for (size_t i = 0; i < kSizes.size(); ++i) {
          std::vector<std::vector<unsigned char>> msg(3, std::vector<unsigned char>(kSizes[i]));
          std::vector<uint64_t> mr;
          for (int k = 0; k < 3; ++k) {
            fillRandom(msg[k].data(), msg[k].size(), 10 * i + k);
            mr.push_back(ep.reg(msg[k].data(), msg[k].size()));
          }
          ErrorCode code = ErrorCode::kOk;
          const std::string why = errorOf([&] { ep.send(data, mr[0], msg[0].data(), msg[0].size()); }, &code);
          std::fprintf(stderr, "send of %zu bytes, nobody receiving: %s\n", kSizes[i], why.c_str());
          CHILD_CHECK(code == ErrorCode::kTimeout);
          sendBlob(side, ctl, "timed out");
          const uint64_t t0 = nowNs();
          for (int k = 1; k < 3; ++k) {
            std::string again = errorOf([&] { ep.send(data, mr[k], msg[k].data(), msg[k].size()); }, &code);
            if (!again.empty()) std::fprintf(stderr, "send %d of %zu bytes: %s\n", k, kSizes[i], again.c_str());
            CHILD_CHECK(again.empty());
          }
          const double ms = (nowNs() - t0) / 1e6;
          std::fprintf(stderr, "%zu bytes: the retry and the next message took %.1f ms\n", kSizes[i], ms);
          CHILD_CHECK(ms < 800);  // the receives were posted 100 ms after the timeout
          CHILD_CHECK(recvBlob(side, ctl) == "checked");
        }
        return 0;
      }));
}

TEST(P2pDelivery, AnEagerSendThatTimedOutIsNeverTakenByALaterReceiveAndLaterMessagesPairUp) {
  timedOutSendThenRetry({256, p2p::kEagerBytes});
}

TEST(P2pDelivery, ALargeSendThatTimedOutLeavesTheNextReceiveToItsRetry) {
  timedOutSendThenRetry({p2p::kEagerBytes + 1, 1 << 20});
}

TEST(P2pDelivery, DeregReturnsOnlyOnceNoSendReadsTheRegionAnyMore) {
  constexpr size_t kBytes = 32u << 20;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        Guarded got(kBytes);
        const uint64_t id = ep.recvAsync(conn, ep.reg(got.bytes.data(), got.bytes.size()), got.data(), kBytes);
        sendBlob(ep, conn, "posted");  // after the receive's clear-to-send: the send is written at once
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.wait(id); }, &code);
        if (!why.empty()) {  // a receive may fail, by name, but take nothing from memory that was reused
          std::fprintf(stderr, "receive: %s\n", why.c_str());
          return 0;
        }
        CHILD_CHECK(holds(got, 3, "the receive of a send whose region was deregistered while it was written"));
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(kBytes);
        fillRandom(data.data(), data.size(), 3);
        const uint64_t mr = ep.reg(data.data(), data.size());
        CHILD_CHECK(recvBlob(ep, conn) == "posted");
        const uint64_t id = ep.sendAsync(conn, mr, data.data(), data.size());
        usleep(2000);  // the write is on its way
        const uint64_t t0 = nowNs();
        ep.dereg(mr);
        const double ms = (nowNs() - t0) / 1e6;
        std::fill(data.begin(), data.end(), 0xEE);  // the memory is the application's again: it reuses it
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.wait(id); }, &code);
        std::fprintf(stderr, "dereg took %.1f ms; the send: %s\n", ms, why.empty() ? "done" : why.c_str());
        return 0;
      }));
}

/// Entries of a /proc/self folder (fd: open files; task: threads).
int countIn(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST(P2pDelivery, CloseFailsWhatWaitsOnBothSidesByNameAndIsIdempotent) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        CHILD_CHECK(recvBlob(ep, conn) == "posted");
        std::vector<unsigned char> buf(100, 0xA5);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        const uint64_t pending = ep.recvAsync(conn, mr, buf.data(), buf.size());
        const int fds = countIn("/proc/self/fd"), threads = countIn("/proc/self/task");
        ep.close(conn);
        ErrorCode code = ErrorCode::kOk;
        std::string why = errorOf([&] { ep.wait(pending); }, &code);
        std::fprintf(stderr, "pending receive: %s\n", why.c_str());
        CHILD_CHECK(code == ErrorCode::kShutdown);
        CHILD_CHECK(why.find("closed by close(1) on this side") != std::string::npos);
        ep.close(conn);  // again: nothing happens
        why = errorOf([&] { ep.send(conn, mr, buf.data(), buf.size()); }, &code);
        std::fprintf(stderr, "send after close: %s\n", why.c_str());
        CHILD_CHECK(why.find("connection 1 was released: closed by close(1) on this side") != std::string::npos);
        why = errorOf([&] { ep.close(77); }, &code);
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        const int fdsAfter = countIn("/proc/self/fd"), threadsAfter = countIn("/proc/self/task");
        std::fprintf(stderr, "open files %d -> %d, threads %d -> %d\n", fds, fdsAfter, threads, threadsAfter);
        CHILD_CHECK(fdsAfter < fds && threadsAfter < threads);
        CHILD_CHECK(allAre(buf, 0xA5));
        return 0;
      },
      [](int, int port) {
        p2p::EndpointOptions o = loopbackEndpoint(0);
        o.timeoutNs = 10ull * 1000 * 1000 * 1000;
        Endpoint ep(o);
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> buf(100, 0xA5);
        const uint64_t pending = ep.recvAsync(conn, ep.reg(buf.data(), buf.size()), buf.data(), buf.size());
        sendBlob(ep, conn, "posted");
        const uint64_t t0 = nowNs();
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.wait(pending); }, &code);
        const double ms = (nowNs() - t0) / 1e6;
        std::fprintf(stderr, "the peer's pending receive after %.1f ms: %s\n", ms, why.c_str());
        CHILD_CHECK(code == ErrorCode::kPeerFailed);
        CHILD_CHECK(why.find("the peer closed the connection") != std::string::npos);
        CHILD_CHECK(ms < 3000);  // not the 10 s timeout
        return 0;
      }));
}

TEST(P2pDelivery, AServerWhoseClientsComeAndGoKeepsItsFilesAndThreadsBounded) {
  constexpr int kClients = 40;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        std::vector<unsigned char> got(256);
        const uint64_t mr = ep.reg(got.data(), got.size());
        int fds = 0, threads = 0;
        for (int i = 0; i < kClients; ++i) {
          const uint64_t conn = ep.accept().connId;
          std::fill(got.begin(), got.end(), 0xA5);
          ep.recv(conn, mr, got.data(), got.size());
          std::vector<unsigned char> want(got.size());
          fillRandom(want.data(), want.size(), 500 + i);
          CHILD_CHECK(firstMismatch(got.data(), want.data(), want.size()) == -1);
          if (i % 2 == 0) ep.close(conn);  // the others are released once their client left
          if (i == 4) fds = countIn("/proc/self/fd"), threads = countIn("/proc/self/task");
        }
        const int fdsAfter = countIn("/proc/self/fd"), threadsAfter = countIn("/proc/self/task");
        std::fprintf(stderr, "after client 5 of %d: %d open files, %d threads; after the last: %d, %d\n", kClients, fds,
                     threads, fdsAfter, threadsAfter);
        CHILD_CHECK(fdsAfter - fds < 60);  // a connection holds about 19 files and 13 threads here
        CHILD_CHECK(threadsAfter - threads < 40);
        return 0;
      },
      [](int, int port) {
        for (int i = 0; i < kClients; ++i) {
          Endpoint ep(loopbackEndpoint(0));
          const uint64_t conn = ep.connect("127.0.0.1", -1, port);
          std::vector<unsigned char> data(256);
          fillRandom(data.data(), data.size(), 500 + i);
          ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
        }  // each client leaves
        return 0;
      }));
}

}  // namespace
}  // namespace gdx::test
