// Eager sends of gdx::p2p::Endpoint (messages of at most p2p::kEagerBytes travel without a clear-to-send, into the
// receiver's eager buffer, and complete when its credit comes back) between real processes on loopback: sizes around
// the threshold, receives posted before and after the data arrived, many small messages in order beyond the buffer's
// slots (the sender waits for credits), messages larger than their receive's buffer, which fail both sides (also one
// refused behind queued sends), a small message taken by a large receive that was posted after it arrived,
// receives that failed (a refused buffer of a vector, a timeout, memory deregistered while waiting) taking nothing
// of the sends that come for them while those fail by name, a receiver that takes a message and goes quiet, a
// receiver that never receives, and a peer that dies mid-stream. Random bytes, poisoned buffers, every byte
// compared. Runs over GDX_TRANSPORT (tcp here; the Soft-RoCE VM runs it with GDX_TRANSPORT=verbs).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

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
using p2p::kEagerBytes;

const std::vector<size_t> kAroundThreshold = {
    1, 255, 256, kEagerBytes - 1, kEagerBytes, kEagerBytes + 1, 2 * kEagerBytes};

void expectAllZero(const std::vector<int>& codes) {
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

/// Message i of a stream: its size (mostly eager, every 50th past the threshold) and its bytes (seeded by i).
size_t streamSize(int i) {
  return i % 50 == 49 ? kEagerBytes + 1 + i : 1 + (i * 37) % kEagerBytes;
}

TEST(P2pEager, SizesAroundTheThresholdWithTheReceivePostedBeforeAndAfterTheData) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        for (bool postedFirst : {true, false}) {
          std::vector<std::vector<unsigned char>> got;
          for (size_t n : kAroundThreshold) got.emplace_back(n, 0xA5);  // poisoned
          if (!postedFirst) usleep(200 * 1000);  // the eager sends arrive (and wait in the eager buffer) first
          std::vector<uint64_t> ids;
          for (auto& g : got) ids.push_back(ep.recvAsync(conn, ep.reg(g.data(), g.size()), g.data(), g.size()));
          if (postedFirst) sendBlob(ep, conn, "posted");
          for (uint64_t id : ids) ep.wait(id);
          for (size_t i = 0; i < got.size(); ++i) {
            std::vector<unsigned char> want(got[i].size());
            fillRandom(want.data(), want.size(), 100 * postedFirst + i);
            CHILD_CHECK(firstMismatch(got[i].data(), want.data(), want.size()) == -1);
          }
        }
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (bool postedFirst : {true, false}) {
          if (postedFirst) CHILD_CHECK(recvBlob(ep, conn) == "posted");
          std::vector<std::vector<unsigned char>> data;
          std::vector<uint64_t> ids;
          for (size_t i = 0; i < kAroundThreshold.size(); ++i) {
            data.emplace_back(kAroundThreshold[i]);
            fillRandom(data.back().data(), data.back().size(), 100 * postedFirst + i);
          }
          for (auto& d : data) ids.push_back(ep.sendAsync(conn, ep.reg(d.data(), d.size()), d.data(), d.size()));
          for (uint64_t id : ids) ep.wait(id);
        }
        return 0;
      }));
}

TEST(P2pEager, ManySmallMessagesArriveInOrderThroughMoreThanTheEagerBufferHolds) {
  constexpr int kMessages = 1000;  // 30 times the eager slots: the sender runs out of credits and waits for them
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        usleep(300 * 1000);  // let the sender fill the eager buffer and stall on credits
        std::vector<unsigned char> got(2 * kEagerBytes + kMessages), want(got.size());
        const uint64_t mr = ep.reg(got.data(), got.size());
        for (int i = 0; i < kMessages; ++i) {
          const size_t n = streamSize(i);
          std::fill(got.begin(), got.begin() + n, 0xA5);
          ep.recv(conn, mr, got.data(), n);
          fillRandom(want.data(), n, 7000 + i);
          CHILD_CHECK(firstMismatch(got.data(), want.data(), n) == -1);
        }
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<std::vector<unsigned char>> data(kMessages);
        std::vector<uint64_t> ids;
        for (int i = 0; i < kMessages; ++i) {
          data[i].resize(streamSize(i));
          fillRandom(data[i].data(), data[i].size(), 7000 + i);
          ids.push_back(ep.sendAsync(conn, ep.reg(data[i].data(), data[i].size()), data[i].data(), data[i].size()));
        }
        for (uint64_t id : ids) ep.wait(id);
        return 0;
      }));
}

bool allAre(const std::vector<unsigned char>& b, unsigned char v) {
  for (unsigned char x : b)
    if (x != v) return false;
  return true;
}

TEST(P2pEager, AfterTheDataCameFirstASmallerReceiveFailsBothSidesAndALargerOneTakesIt) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> buf(4 * kEagerBytes, 0xA5);  // poisoned
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        usleep(200 * 1000);  // the 200-byte eager send is here first
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.recv(conn, mr, buf.data(), 100); }, &code);
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(why.find("the peer's send is 200 bytes, larger than this receive's buffer of 100 bytes") !=
                    std::string::npos);
        std::fprintf(stderr, "as expected: %s\n", why.c_str());
        CHILD_CHECK(allAre(buf, 0xA5));
        // The next one waits in the eager buffer for a receive larger than kEagerBytes, which takes it without a
        // clear-to-send: its 200 bytes at the start of the buffer, the rest untouched.
        usleep(200 * 1000);
        CHILD_CHECK(ep.recv(conn, mr, buf.data(), 3 * kEagerBytes) == 200);
        std::vector<unsigned char> want(200);
        fillRandom(want.data(), want.size(), 31);
        CHILD_CHECK(firstMismatch(buf.data(), want.data(), want.size()) == -1);
        CHILD_CHECK(allAre(std::vector<unsigned char>(buf.begin() + 200, buf.end()), 0xA5));
        CHILD_CHECK(recvBlob(ep, conn) == "still works");
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> buf(200);
        fillRandom(buf.data(), buf.size(), 31);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.send(conn, mr, buf.data(), buf.size()); }, &code);
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(why.find("has a buffer of 100 bytes, smaller than this send") != std::string::npos);
        ep.send(conn, mr, buf.data(), buf.size());
        sendBlob(ep, conn, "still works");
        return 0;
      }));
}

TEST(P2pEager, ALargeSendIntoASmallReceiveFailsBothSidesWhicheverCameFirst) {
  constexpr size_t kLarge = 3 * kEagerBytes;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> buf(100, 0);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        for (bool receiveFirst : {true, false}) {
          if (receiveFirst) sendBlob(ep, conn, "receiving");  // the receive is posted before the send starts
          if (!receiveFirst) usleep(200 * 1000);              // the send announced itself before the receive
          ErrorCode code = ErrorCode::kOk;
          const std::string why = errorOf([&] { ep.recv(conn, mr, buf.data(), buf.size()); }, &code);
          CHILD_CHECK(code == ErrorCode::kInvalidArgument);
          CHILD_CHECK(why.find("the peer's send is " + std::to_string(kLarge) +
                               " bytes, larger than this receive's buffer of 100 bytes") != std::string::npos);
        }
        CHILD_CHECK(recvBlob(ep, conn) == "still works");
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> buf(kLarge, 1);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        for (bool receiveFirst : {true, false}) {
          if (receiveFirst) CHILD_CHECK(recvBlob(ep, conn) == "receiving");
          ErrorCode code = ErrorCode::kOk;
          const std::string why = errorOf([&] { ep.send(conn, mr, buf.data(), buf.size()); }, &code);
          CHILD_CHECK(code == ErrorCode::kInvalidArgument);
          CHILD_CHECK(why.find("has a buffer of 100 bytes, smaller than this send") != std::string::npos);
          if (!receiveFirst) std::fprintf(stderr, "as expected: %s\n", why.c_str());
        }
        sendBlob(ep, conn, "still works");
        return 0;
      }));
}

TEST(P2pEager, ALargeSendRefusedWhileSmallSendsAreQueuedAheadOfItFailsByName) {
  // More small sends than the eager buffer holds, then a large one whose receive is small: the refusal comes back
  // while most of the small sends still wait for credits ahead of the large one.
  constexpr int kSmall = 3 * static_cast<int>(p2p::kEagerSlots);
  constexpr size_t kLarge = 2 * kEagerBytes;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        usleep(200 * 1000);  // the first small sends fill the eager buffer, the large one announced itself
        std::vector<std::vector<unsigned char>> got(kSmall);
        std::vector<uint64_t> ids;
        for (int i = 0; i < kSmall; ++i) {
          got[i].assign(1 + (i * 53) % kEagerBytes, 0xA5);  // poisoned
          ids.push_back(ep.recvAsync(conn, ep.reg(got[i].data(), got[i].size()), got[i].data(), got[i].size()));
        }
        std::vector<unsigned char> small(100, 0xA5);
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.recv(conn, ep.reg(small.data(), 100), small.data(), 100); }, &code);
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(why.find("the peer's send is " + std::to_string(kLarge) + " bytes") != std::string::npos);
        for (int i = 0; i < kSmall; ++i) {
          ep.wait(ids[i]);
          std::vector<unsigned char> want(got[i].size());
          fillRandom(want.data(), want.size(), 900 + i);
          CHILD_CHECK(firstMismatch(got[i].data(), want.data(), want.size()) == -1);
        }
        for (unsigned char b : small) CHILD_CHECK(b == 0xA5);
        CHILD_CHECK(recvBlob(ep, conn) == "still works");
        return 0;
      },
      [](int, int port) {
        setenv("GDX_TIMEOUT_MS", "4000", 1);  // a send that misses its refusal times out after this
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<std::vector<unsigned char>> data(kSmall);
        std::vector<uint64_t> ids;
        for (int i = 0; i < kSmall; ++i) {
          data[i].resize(1 + (i * 53) % kEagerBytes);
          fillRandom(data[i].data(), data[i].size(), 900 + i);
          ids.push_back(ep.sendAsync(conn, ep.reg(data[i].data(), data[i].size()), data[i].data(), data[i].size()));
        }
        std::vector<unsigned char> large(kLarge, 3);
        const uint64_t largeId = ep.sendAsync(conn, ep.reg(large.data(), large.size()), large.data(), large.size());
        const uint64_t t0 = nowNs();
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.wait(largeId); }, &code);
        std::fprintf(stderr, "the large send ended after %.1f ms: %s\n", (nowNs() - t0) / 1e6, why.c_str());
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(why.find("has a buffer of 100 bytes, smaller than this send") != std::string::npos);
        for (uint64_t id : ids) ep.wait(id);
        sendBlob(ep, conn, "still works");
        return 0;
      }));
}

TEST(P2pEager, AFailedReceiveVectorTakesNothingMoreAndTheSendsForItFailByName) {
  // recvv of two 100-byte buffers against a send of 200 bytes, then one of 100: the receive fails on its first buffer,
  // and its second buffer must take nothing of the second send, whether that came before the receive was posted,
  // is on its way as the receive fails, or is made after the receiver deregistered the memory. Both sends fail by
  // name; the poisoned buffer keeps every byte.
  enum Round { kDataFirst, kReceiveFirst, kAfterDereg };
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> buf(200, 0xA5);  // poisoned
        for (Round round : {kDataFirst, kReceiveFirst, kAfterDereg}) {
          const uint64_t mr = ep.reg(buf.data(), buf.size());
          const std::vector<p2p::Iov> halves = {{mr, buf.data(), 100}, {mr, buf.data() + 100, 100}};
          ErrorCode code = ErrorCode::kOk;
          std::string why;
          if (round == kDataFirst) {
            usleep(200 * 1000);  // both sends' data is here, waiting in the eager buffer
            why = errorOf([&] { ep.recvv(conn, halves); }, &code);
          } else if (round == kReceiveFirst) {
            const uint64_t id = ep.recvvAsync(conn, halves);
            sendBlob(ep, conn, "posted");  // both sends leave now, while the receive is posted
            why = errorOf([&] { ep.wait(id); }, &code);
          } else {
            why = errorOf([&] { ep.recvv(conn, halves); }, &code);
          }
          CHILD_CHECK(code == ErrorCode::kInvalidArgument);
          CHILD_CHECK(why.find("the peer's send is 200 bytes, larger than this receive's buffer of 100") !=
                      std::string::npos);
          ep.dereg(mr);
          sendBlob(ep, conn, "deregistered");
          CHILD_CHECK(recvBlob(ep, conn) == "sent");
          CHILD_CHECK(allAre(buf, 0xA5));
        }
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(200);
        fillRandom(data.data(), data.size(), 21);
        const uint64_t mr = ep.reg(data.data(), data.size());
        for (Round round : {kDataFirst, kReceiveFirst, kAfterDereg}) {
          ErrorCode whole = ErrorCode::kOk, half = ErrorCode::kOk;
          std::string why;
          if (round == kAfterDereg) {
            errorOf([&] { ep.send(conn, mr, data.data(), 200); }, &whole);
            CHILD_CHECK(recvBlob(ep, conn) == "deregistered");
            why = errorOf([&] { ep.send(conn, mr, data.data(), 100); }, &half);
          } else {
            if (round == kReceiveFirst) CHILD_CHECK(recvBlob(ep, conn) == "posted");
            const uint64_t first = ep.sendAsync(conn, mr, data.data(), 200);
            const uint64_t second = ep.sendAsync(conn, mr, data.data(), 100);
            errorOf([&] { ep.wait(first); }, &whole);
            why = errorOf([&] { ep.wait(second); }, &half);
            CHILD_CHECK(recvBlob(ep, conn) == "deregistered");
          }
          std::fprintf(stderr, "round %d: %s\n", static_cast<int>(round), why.c_str());
          sendBlob(ep, conn, "sent");  // first, so that the receiver checks its buffer either way
          CHILD_CHECK(whole == ErrorCode::kInvalidArgument);
          CHILD_CHECK(half == ErrorCode::kPeerFailed);
          CHILD_CHECK(why.find("the receive the peer posted for it ended in error (invalid argument)") !=
                      std::string::npos);
        }
        return 0;
      }));
}

TEST(P2pEager, AReceiveThatTimedOutTakesNothingFromALateSendSmallOrLarge) {
  const std::vector<size_t> sizes = {100, 3 * kEagerBytes};
  expectAllZero(runServerClients(
      1,
      [&](int port) {
        p2p::EndpointOptions o = loopbackEndpoint(port);
        o.timeoutNs = 1000ull * 1000 * 1000;
        Endpoint ep(o);
        const uint64_t conn = ep.accept().connId;
        for (size_t n : sizes) {
          std::vector<unsigned char> buf(n, 0xA5);  // poisoned, and still registered when the send comes
          const uint64_t mr = ep.reg(buf.data(), buf.size());
          ErrorCode code = ErrorCode::kOk;
          errorOf([&] { ep.recv(conn, mr, buf.data(), n); }, &code);
          CHILD_CHECK(code == ErrorCode::kTimeout);
          sendBlob(ep, conn, "timed out");
          CHILD_CHECK(recvBlob(ep, conn) == "sent");
          CHILD_CHECK(allAre(buf, 0xA5));
        }
        return 0;
      },
      [&](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (size_t n : sizes) {
          std::vector<unsigned char> data(n);
          fillRandom(data.data(), n, n);
          CHILD_CHECK(recvBlob(ep, conn) == "timed out");
          ErrorCode code = ErrorCode::kOk;
          const std::string why = errorOf([&] { ep.send(conn, ep.reg(data.data(), n), data.data(), n); }, &code);
          std::fprintf(stderr, "%zu bytes: %s\n", n, why.c_str());
          sendBlob(ep, conn, "sent");  // first, so that the receiver checks its buffer either way
          CHILD_CHECK(code == ErrorCode::kPeerFailed);
          CHILD_CHECK(why.find("the receive the peer posted for it ended in error (timeout)") != std::string::npos);
        }
        return 0;
      }));
}

TEST(P2pEager, AReceiveWhoseMemoryWasDeregisteredWhileItWaitedTakesNothing) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> buf(100, 0xA5);  // poisoned
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        const uint64_t id = ep.recvAsync(conn, mr, buf.data(), buf.size());
        ep.dereg(mr);  // too early: the receive still waits for its send
        sendBlob(ep, conn, "deregistered");
        CHILD_CHECK(recvBlob(ep, conn) == "sent");
        ErrorCode code = ErrorCode::kOk;
        const std::string why = errorOf([&] { ep.wait(id); }, &code);
        std::fprintf(stderr, "receive: %s\n", why.c_str());
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(why.find("was deregistered while the receive was pending") != std::string::npos);
        CHILD_CHECK(allAre(buf, 0xA5));
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(100);
        fillRandom(data.data(), data.size(), 31);
        CHILD_CHECK(recvBlob(ep, conn) == "deregistered");
        ErrorCode code = ErrorCode::kOk;
        const std::string why =
            errorOf([&] { ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size()); }, &code);
        std::fprintf(stderr, "send: %s\n", why.c_str());
        sendBlob(ep, conn, "sent");
        CHILD_CHECK(code == ErrorCode::kPeerFailed);
        CHILD_CHECK(why.find("the receive the peer posted for it ended in error (invalid argument)") !=
                    std::string::npos);
        return 0;
      }));
}

TEST(P2pEager, ASendCompletesSoonAfterAReceiverThatThenGoesQuietTookIt) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> got(256, 0xA5), want(256);
        ep.recv(conn, ep.reg(got.data(), got.size()), got.data(), got.size());
        fillRandom(want.data(), want.size(), 11);
        CHILD_CHECK(firstMismatch(got.data(), want.data(), want.size()) == -1);
        usleep(2000 * 1000);  // sends nothing and posts no receive: the confirmation goes on its own
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(256);
        fillRandom(data.data(), data.size(), 11);
        const uint64_t t0 = nowNs();
        ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
        const uint64_t tookNs = nowNs() - t0;
        std::fprintf(stderr, "the send was confirmed after %.3f ms\n", tookNs / 1e6);
        CHILD_CHECK(tookNs < 500ull * 1000 * 1000);  // about a millisecond; far below the receiver's 2 s of quiet
        return 0;
      }));
}

TEST(P2pEager, AReceiverThatNeverReceivesStopsTheSenderAtTheEagerBufferWithinTheTimeout) {
  const int sends = static_cast<int>(p2p::kEagerSlots) + 8;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        ep.accept();
        usleep(4000 * 1000);  // receives nothing; stays until the client has given up
        return 0;
      },
      [sends](int, int port) {
        setenv("GDX_TIMEOUT_MS", "1500", 1);
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> buf(64, 2);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        std::vector<uint64_t> ids;
        for (int i = 0; i < sends; ++i) ids.push_back(ep.sendAsync(conn, mr, buf.data(), buf.size()));
        const uint64_t t0 = nowNs();
        for (int i = 0; i < sends; ++i) {
          ErrorCode code = ErrorCode::kOk;
          const std::string why = errorOf([&] { ep.wait(ids[i]); }, &code);
          CHILD_CHECK(code == ErrorCode::kTimeout);
          // The first sends left (their receives were never posted); the next found the eager buffer full, and the
          // rest queued behind it. Each send that times out is withdrawn, which frees its slot in the peer's eager
          // buffer: a later send may then leave before its own timeout (on a slow transport, Soft-RoCE under QEMU,
          // it does), so from the first that waited on, each names one of the three waits.
          const int slots = static_cast<int>(p2p::kEagerSlots);
          const bool named = i < slots ? why.find("the peer's receive to take it") != std::string::npos
                                       : why.find("room in the peer's eager buffer") != std::string::npos ||
                                             why.find("a matching receive posted by the peer") != std::string::npos ||
                                             why.find("the peer's receive to take it") != std::string::npos;
          if (!named) std::fprintf(stderr, "send %d of %d: %s\n", i, sends, why.c_str());
          CHILD_CHECK(named);
          if (i == slots) std::fprintf(stderr, "as expected: %s\n", why.c_str());
        }
        CHILD_CHECK(nowNs() - t0 < 3500ull * 1000 * 1000);
        return 0;
      }));
}

TEST(P2pEager, APeerDyingMidStreamFailsTheReceivesByNameAndEverythingBeforeArrivedIntact) {
  constexpr int kMessages = 100000;  // more than loopback moves in the 30 ms the client lives
  const std::vector<int> codes = runServerClients(
      1,
      [](int port) {
        setenv("GDX_TIMEOUT_MS", "10000", 1);
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> got(kEagerBytes), want(kEagerBytes);
        const uint64_t mr = ep.reg(got.data(), got.size());
        int received = 0;
        try {
          for (; received < kMessages; ++received) {
            const size_t n = 1 + (received * 37) % kEagerBytes;
            std::fill(got.begin(), got.begin() + n, 0xA5);
            ep.recv(conn, mr, got.data(), n);
            fillRandom(want.data(), n, received);
            CHILD_CHECK(firstMismatch(got.data(), want.data(), n) == -1);
          }
        } catch (const Error& e) {
          // TCP sees the connection close; verbs may only see the receive's deadline pass (nothing is sent to the
          // dead peer that could fail): either way the receive ends by name within GDX_TIMEOUT_MS.
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed || e.code() == ErrorCode::kTimeout);
          CHILD_CHECK(std::string(e.what()).find("receive of") != std::string::npos);
          std::fprintf(stderr, "as expected, after %d intact messages: %s\n", received, e.what());
        }
        CHILD_CHECK(received > 0 && received < kMessages);
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(kEagerBytes);
        const uint64_t mr = ep.reg(data.data(), data.size());
        const uint64_t t0 = nowNs();
        for (int i = 0; i < kMessages; ++i) {
          const size_t n = 1 + (i * 37) % kEagerBytes;
          fillRandom(data.data(), n, i);
          ep.send(conn, mr, data.data(), n);
          if (nowNs() - t0 > 30ull * 1000 * 1000) kill(getpid(), SIGKILL);  // mid-stream, no goodbye
        }
        return 1;  // never reached: the stream outlasts 30 ms
      });
  EXPECT_EQ(codes[0], 0) << "the server";
  EXPECT_EQ(codes[1], 128 + SIGKILL) << "the client, killed mid-stream";
}

}  // namespace
}  // namespace gdx::test
