// Strangers at a p2p endpoint's door, from raw sockets: clients that connect and then stall (one byte of a Hello,
// then nothing) delay no legitimate client, whether the endpoint accepts blocking or passively, even when there are
// more of them than handshake places; a silent socket is closed after GDX_P2P_HELLO_MS; with a secret, a
// well-formed Hello that does not present it gets a refusal with the reason and nothing else (no transport address,
// no token), an Endpoint client without it or with a wrong one is refused by name on both sides, and one with it
// transfers as always (random data, every byte compared).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "p2p/handshake.hpp"
#include "p2p/handshakes.hpp"
#include "p2p/pair_link.hpp"
#include "sockets/socket.hpp"
#include "support/p2p_helpers.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;

constexpr int kStrangers = 4;
constexpr uint64_t kSecond = 1000ull * 1000 * 1000;

/// A raw TCP connection to 127.0.0.1:`port` (blocking), or -1 when nobody listens there within 5 s (the server
/// process starts beside this one).
int rawConnect(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  for (const uint64_t until = nowNs() + 5 * kSecond; nowNs() < until; usleep(10 * 1000)) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
  }
  return -1;
}

/// The server: accepts one client (blocking or passively) and receives 100000 random bytes from it, checked.
int serveOne(int port, bool passive) {
  setenv("GDX_TIMEOUT_MS", "5000", 1);
  Endpoint ep(loopbackEndpoint(port));
  if (passive) ep.startPassiveAccept();
  const uint64_t conn = ep.accept().connId;
  std::vector<unsigned char> got(100000, 0xA5), want(got.size());
  fillRandom(want.data(), want.size(), 700);
  ep.recv(conn, ep.reg(got.data(), got.size()), got.data(), got.size());
  CHILD_CHECK(firstMismatch(got.data(), want.data(), want.size()) == -1);
  return 0;
}

/// The client: `count` stalled connections first, then an Endpoint that must connect within 2 s and send.
int strangersThenClient(int port, int count = kStrangers) {
  setenv("GDX_TIMEOUT_MS", "5000", 1);
  std::vector<int> strangers;
  for (int i = 0; i < count; ++i) {
    const int fd = rawConnect(port);
    CHILD_CHECK(fd >= 0);
    CHILD_CHECK(::write(fd, "G", 1) == 1);  // the first byte of a length prefix, then nothing
    strangers.push_back(fd);
  }
  usleep(100 * 1000);  // the endpoint took them (and began their handshakes) before the client comes
  Endpoint ep(loopbackEndpoint(0));
  const uint64_t start = nowNs();
  uint64_t conn = 0;
  try {
    conn = ep.connect("127.0.0.1", -1, port);
  } catch (const Error& e) {
    std::fprintf(stderr, "the client behind %d stalled strangers: %s (after %.2f s)\n", count, e.what(),
                 (nowNs() - start) / 1e9);
    return 1;
  }
  const double took = (nowNs() - start) / 1e9;
  std::fprintf(stderr, "the client behind %d stalled strangers connected in %.3f s\n", count, took);
  CHILD_CHECK(took < 2.0);
  std::vector<unsigned char> data(100000);
  fillRandom(data.data(), data.size(), 700);
  ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
  for (int fd : strangers) ::close(fd);
  return 0;
}

TEST(P2pStrangers, StalledConnectionsDelayNoClientOfABlockingAccept) {
  auto codes = runServerClients(
      1, [](int port) { return serveOne(port, false); }, [](int, int port) { return strangersThenClient(port); });
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

TEST(P2pStrangers, StalledConnectionsDelayNoClientOfAPassiveAccept) {
  auto codes = runServerClients(
      1, [](int port) { return serveOne(port, true); }, [](int, int port) { return strangersThenClient(port); });
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

TEST(P2pStrangers, MoreStalledConnectionsThanHandshakePlacesKeepNoClientOut) {
  // Before the silent ones gave their places up, the client behind them found every place taken and was closed.
  constexpr int kMany = static_cast<int>(p2p::Handshakes::kMaxRunning) + 8;
  auto codes = runServerClients(
      1, [](int port) { return serveOne(port, false); },
      [](int, int port) { return strangersThenClient(port, kMany); });
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

TEST(P2pStrangers, ASilentConnectionIsClosedAfterTheHelloWait) {
  auto codes = runServerClients(
      1,
      [](int port) {
        setenv("GDX_P2P_HELLO_MS", "300", 1);  // GDX_TIMEOUT_MS stays 5 s: the hello has far less
        return serveOne(port, true);
      },
      [](int, int port) {
        const int fd = rawConnect(port);
        CHILD_CHECK(fd >= 0);
        CHILD_CHECK(::write(fd, "G", 1) == 1);
        const uint64_t start = nowNs();
        CHILD_CHECK(rawClosed(fd, 3000));  // before: open until GDX_TIMEOUT_MS (5 s)
        const double took = (nowNs() - start) / 1e9;
        std::fprintf(stderr, "the silent connection was closed after %.3f s\n", took);
        CHILD_CHECK(took < 2.0);
        ::close(fd);
        return strangersThenClient(port, 1);  // and the endpoint still serves a real client
      });
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

bool mentions(const std::string& text, const char* words) {
  const bool yes = text.find(words) != std::string::npos;
  if (!yes) std::fprintf(stderr, "'%s' does not say '%s'\n", text.c_str(), words);
  return yes;
}

TEST(P2pStrangers, WithASecretAHelloWithoutItIsRefusedWithTheReasonAndNothingElse) {
  auto codes = runServerClients(
      1,
      [](int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        p2p::EndpointOptions o = loopbackEndpoint(port);
        o.secret = "the job's secret";
        Endpoint ep(o);
        // The raw stranger, then an Endpoint without the secret, then one with a wrong one: each refused by name.
        for (const char* why : {"presented none", "presented none", "the wrong secret"}) {
          ErrorCode code = ErrorCode::kOk;
          const std::string what = errorOf([&] { ep.accept(); }, &code);
          CHILD_CHECK(code == ErrorCode::kProtocol && mentions(what, why));
        }
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> got(100000, 0xA5), want(got.size());
        fillRandom(want.data(), want.size(), 701);
        ep.recv(conn, ep.reg(got.data(), got.size()), got.data(), got.size());
        CHILD_CHECK(firstMismatch(got.data(), want.data(), want.size()) == -1);
        return 0;
      },
      [](int, int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        {  // a well-formed Hello from a raw socket, without the secret
          net::UniqueFd fd(rawConnect(port));
          CHILD_CHECK(fd.valid());
          p2p::Hello hello;
          hello.transport = "tcp";
          hello.address = "127.0.0.1:1";
          hello.sockets = 1;
          hello.chunkBytes = 65536;
          const net::Deadline deadline = net::deadlineIn(5 * kSecond);
          p2p::sendBlob(fd.get(), p2p::encodeHello(hello), deadline, "stranger");
          p2p::Answer answer;
          const std::string bad =
              p2p::decodeAnswer(p2p::recvBlob(fd.get(), p2p::kMaxHandshakeBytes, deadline, "stranger"), &answer);
          CHILD_CHECK(bad.empty());
          std::fprintf(stderr, "the stranger's answer: ok %d, reason '%s', address '%s', token %llu\n", answer.ok,
                       answer.reason.c_str(), answer.address.c_str(), static_cast<unsigned long long>(answer.token));
          CHILD_CHECK(!answer.ok && answer.address.empty() && answer.token == 0);
          CHILD_CHECK(mentions(answer.reason, "requires a secret"));
        }
        for (const char* secret : {"", "not the job's secret"}) {
          p2p::EndpointOptions o = loopbackEndpoint(0);
          o.secret = secret;
          Endpoint ep(o);
          ErrorCode code = ErrorCode::kOk;
          const std::string what = errorOf([&] { ep.connect("127.0.0.1", -1, port); }, &code);
          CHILD_CHECK(code == ErrorCode::kInvalidArgument && mentions(what, "refused by the peer"));
        }
        p2p::EndpointOptions o = loopbackEndpoint(0);
        o.secret = "the job's secret";
        Endpoint ep(o);
        const uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::vector<unsigned char> data(100000);
        fillRandom(data.data(), data.size(), 701);
        ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
        return 0;
      });
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i << " (0: the server)";
}

}  // namespace
}  // namespace gdx::test
