// gdx::p2p::Endpoint between real processes on loopback: every call with random data checked byte for byte, many
// transfers in flight, vectors of 1..64 buffers, a server with several clients (also clients whose handshake comes
// late to a passive accept), and misuse (unknown ids, ranges past a region, damaged or foreign descriptors, a message
// larger than its receive, a peer that dies) ending in clear errors, never hangs. Under it, two connections of one
// process show what the endpoint cannot: that a finished transfer is let go.
// Runs over GDX_TRANSPORT (tcp here; the Soft-RoCE VM runs the same binary with GDX_TRANSPORT=verbs).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "p2p/connection.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/progress_pool.hpp"
#include "p2p/protocol.hpp"
#include "sockets/socket.hpp"
#include "support/connection_pair.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;
using p2p::Iov;

const std::vector<size_t> kSizes = {1, 7, 256, 4096, 65537, (1 << 20) + 3, 16 << 20, 64 << 20};

void expectAllZero(const std::vector<int>& codes, int killed = -1) {
  for (size_t i = 0; i < codes.size(); ++i)
    EXPECT_EQ(codes[i], static_cast<int>(i) == killed ? 128 + SIGKILL : 0) << "process " << i << " (0: the server)";
}

TEST(P2pEndpoint, SendRecvOfEverySizeEveryByteChecked) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        p2p::Accepted a = ep.accept();
        CHILD_CHECK(a.ip == "127.0.0.1");
        for (size_t n : kSizes) {
          std::vector<unsigned char> got(n, 0xA5), want(n);  // poisoned
          fillRandom(want.data(), n, n);
          uint64_t mr = ep.reg(got.data(), n);
          ep.recv(a.connId, mr, got.data(), n);
          CHILD_CHECK(firstMismatch(got.data(), want.data(), n) == -1);
          ep.dereg(mr);
        }
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (size_t n : kSizes) {
          std::vector<unsigned char> data(n);
          fillRandom(data.data(), n, n);
          uint64_t mr = ep.reg(data.data(), n);
          ep.send(conn, mr, data.data(), n);
          ep.dereg(mr);
        }
        return 0;
      }));
}

TEST(P2pEndpoint, VectorsOfOneToSixtyFourBuffersAndManyAsyncTransfersInFlight) {
  constexpr int kAsync = 48;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port, 2));
        uint64_t conn = ep.accept().connId;
        for (int count : {1, 2, 17, 64}) {
          std::vector<std::vector<unsigned char>> bufs;
          std::vector<Iov> iovs;
          for (int i = 0; i < count; ++i) bufs.emplace_back(1 + (i * 977) % 5000, 0x5A);
          for (auto& b : bufs) iovs.push_back(Iov{ep.reg(b.data(), b.size()), b.data(), b.size()});
          ep.recvv(conn, iovs);
          for (int i = 0; i < count; ++i) {
            std::vector<unsigned char> want(bufs[i].size());
            fillRandom(want.data(), want.size(), count * 1000 + i);
            CHILD_CHECK(firstMismatch(bufs[i].data(), want.data(), want.size()) == -1);
          }
        }
        std::vector<std::vector<unsigned char>> bufs(kAsync);
        std::vector<uint64_t> ids;
        for (int i = 0; i < kAsync; ++i) {
          bufs[i].assign(100 + i * 4099, 0xEE);
          ids.push_back(ep.recvAsync(conn, ep.reg(bufs[i].data(), bufs[i].size()), bufs[i].data(), bufs[i].size()));
        }
        size_t done = 0;
        std::vector<bool> finished(kAsync);
        while (done < ids.size())
          for (int i = 0; i < kAsync; ++i)
            if (!finished[i] && ep.poll(ids[i])) finished[i] = true, ++done;
        for (int i = 0; i < kAsync; ++i) {
          std::vector<unsigned char> want(bufs[i].size());
          fillRandom(want.data(), want.size(), 7000 + i);
          CHILD_CHECK(firstMismatch(bufs[i].data(), want.data(), want.size()) == -1);
        }
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0, 2));
        uint64_t conn = ep.connect("127.0.0.1", -1, port);
        for (int count : {1, 2, 17, 64}) {
          std::vector<std::vector<unsigned char>> bufs;
          std::vector<Iov> iovs;
          for (int i = 0; i < count; ++i) {
            bufs.emplace_back(1 + (i * 977) % 5000);
            fillRandom(bufs.back().data(), bufs.back().size(), count * 1000 + i);
          }
          for (auto& b : bufs) iovs.push_back(Iov{ep.reg(b.data(), b.size()), b.data(), b.size()});
          ep.sendv(conn, iovs);
        }
        std::vector<std::vector<unsigned char>> bufs(kAsync);
        std::vector<uint64_t> ids;
        for (int i = 0; i < kAsync; ++i) {
          bufs[i].resize(100 + i * 4099);
          fillRandom(bufs[i].data(), bufs[i].size(), 7000 + i);
          ids.push_back(ep.sendAsync(conn, ep.reg(bufs[i].data(), bufs[i].size()), bufs[i].data(), bufs[i].size()));
        }
        for (uint64_t id : ids) ep.wait(id);
        return 0;
      }));
}

TEST(P2pEndpoint, OneSidedWriteAndReadThroughAdvertisedDescriptors) {
  constexpr size_t kBytes = 8 << 20;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        uint64_t conn = ep.accept().connId;
        // The first half is written by the client, the second half it reads.
        std::vector<unsigned char> region(kBytes, 0x11);
        fillRandom(region.data() + kBytes / 2, kBytes / 2, 99);
        uint64_t mr = ep.reg(region.data(), kBytes);
        sendBlob(ep, conn, ep.advertise(conn, mr, region.data(), kBytes / 2));
        sendBlob(ep, conn, ep.advertise(conn, mr, region.data() + kBytes / 2, kBytes / 2));
        CHILD_CHECK(recvBlob(ep, conn) == "written");  // the client's writes completed before it said so
        std::vector<unsigned char> want(kBytes / 2);
        fillRandom(want.data(), want.size(), 42);
        CHILD_CHECK(firstMismatch(region.data(), want.data(), want.size()) == -1);
        CHILD_CHECK(recvBlob(ep, conn) == "bye");
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::string writable = recvBlob(ep, conn), readable = recvBlob(ep, conn);
        std::vector<unsigned char> data(kBytes / 2);
        fillRandom(data.data(), data.size(), 42);
        uint64_t mr = ep.reg(data.data(), data.size());
        // In three pieces: an async write, a write at an offset, a vectorised write of the rest.
        const size_t a = 12345, b = 1 << 20;
        uint64_t id = ep.writeAsync(conn, mr, data.data(), a, writable, 0);
        ep.write(conn, mr, data.data() + a, b, writable, a);
        ep.wait(id);
        ep.write(conn, mr, data.data() + a + b, data.size() - a - b, writable, a + b);
        sendBlob(ep, conn, "written");
        std::vector<unsigned char> got(kBytes / 2, 0xCC), want(kBytes / 2);
        fillRandom(want.data(), want.size(), 99);
        uint64_t gmr = ep.reg(got.data(), got.size());
        ep.read(conn, gmr, got.data(), 1000, readable, 0);
        ep.wait(ep.readAsync(conn, gmr, got.data() + 1000, got.size() - 1000, readable, 1000));
        CHILD_CHECK(firstMismatch(got.data(), want.data(), got.size()) == -1);
        std::fill(got.begin(), got.end(), 0xCC);
        ep.readv(conn, {Iov{gmr, got.data(), 4096}, Iov{gmr, got.data() + 4096, 4096}}, {readable, readable});
        CHILD_CHECK(firstMismatch(got.data(), want.data(), 4096) == -1);
        CHILD_CHECK(firstMismatch(got.data() + 4096, want.data(), 4096) == -1);
        sendBlob(ep, conn, "bye");
        return 0;
      }));
}

TEST(P2pEndpoint, MisuseIsRefusedByNameAndTheConnectionGoesOn) {
  expectAllZero(runServerClients(
      1,
      [](int port) {
        Endpoint ep(loopbackEndpoint(port));
        uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> region(4096, 0x77);
        uint64_t mr = ep.reg(region.data(), region.size());
        sendBlob(ep, conn, ep.advertise(conn, mr, region.data() + 1024, 1024));
        // A receive of 100 bytes that the client answers with 200: both sides fail by name.
        std::vector<unsigned char> small(100, 0);
        uint64_t smr = ep.reg(small.data(), small.size());
        try {
          ep.recv(conn, smr, small.data(), small.size());
          CHILD_CHECK(false);
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kInvalidArgument);
          CHILD_CHECK(std::string(e.what()).find("200 bytes") != std::string::npos);
        }
        CHILD_CHECK(recvBlob(ep, conn) == "checked");
        // Nothing outside the advertised range was written.
        for (size_t i = 0; i < region.size(); ++i) CHILD_CHECK(region[i] == 0x77);
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        uint64_t conn = ep.connect("127.0.0.1", -1, port);
        std::string desc = recvBlob(ep, conn);
        std::vector<unsigned char> buf(4096, 1);
        uint64_t mr = ep.reg(buf.data(), buf.size());
        auto code = [](auto f) { return errorCodeOf(f); };
        CHILD_CHECK(code([&] { ep.send(999, mr, buf.data(), 1); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.send(conn, 999, buf.data(), 1); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.send(conn, mr, buf.data() + 4000, 200); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.send(conn, mr, buf.data(), 0); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.poll(12345); }) == ErrorCode::kInvalidArgument);
        // Writes outside the advertised 1024 bytes, truncated and damaged descriptors: refused before sending.
        CHILD_CHECK(code([&] { ep.write(conn, mr, buf.data(), 1025, desc); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.write(conn, mr, buf.data(), 8, desc, 1020); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.write(conn, mr, buf.data(), 8, desc.substr(0, 10)); }) ==
                    ErrorCode::kInvalidArgument);
        std::string damaged = desc;
        damaged[20] ^= 0x40;
        CHILD_CHECK(code([&] { ep.write(conn, mr, buf.data(), 8, damaged); }) == ErrorCode::kInvalidArgument);
        // A legal read works; a well-formed descriptor naming a window the server never advertised is refused by it.
        ep.read(conn, mr, buf.data(), 8, desc, 0);
        CHILD_CHECK(buf[0] == 0x77);
        p2p::Descriptor d;
        CHILD_CHECK(p2p::decodeDescriptor(desc, &d).empty());
        d.window += 7;
        std::string forged = p2p::encodeDescriptor(d);
        try {
          ep.read(conn, mr, buf.data(), 8, forged, 0);
          CHILD_CHECK(false);
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kInvalidArgument);
          CHILD_CHECK(std::string(e.what()).find("not advertised") != std::string::npos);
        }
        CHILD_CHECK(code([&] { ep.write(conn, mr, buf.data(), 8, forged); }) == ErrorCode::kInvalidArgument);
        // A stale region: deregistered, then used.
        uint64_t gone = ep.reg(buf.data(), 16);
        ep.dereg(gone);
        CHILD_CHECK(code([&] { ep.send(conn, gone, buf.data(), 16); }) == ErrorCode::kInvalidArgument);
        CHILD_CHECK(code([&] { ep.dereg(gone); }) == ErrorCode::kInvalidArgument);
        // A send larger than the posted receive.
        try {
          ep.send(conn, mr, buf.data(), 200);
          CHILD_CHECK(false);
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kInvalidArgument);
          CHILD_CHECK(std::string(e.what()).find("has a buffer of 100 bytes, smaller than this send") !=
                      std::string::npos);
        }
        sendBlob(ep, conn, "checked");  // the connection still works after all of it
        return 0;
      }));
}

TEST(P2pEndpoint, ConnectingToNobodyEndsWithinTheTimeout) {
  EXPECT_EQ(runSolo([] {
              setenv("GDX_TIMEOUT_MS", "1500", 1);
              Endpoint ep(loopbackEndpoint(0));
              const int port = freePort();
              try {
                ep.connect("127.0.0.1", 0, port);
              } catch (const Error& e) {
                CHILD_CHECK(e.code() == ErrorCode::kTimeout);
                CHILD_CHECK(std::string(e.what()).find(std::to_string(port)) != std::string::npos);
                try {
                  ep.accept();
                } catch (const Error& a) {
                  CHILD_CHECK(a.code() == ErrorCode::kTimeout);
                  return 0;
                }
              }
              return 1;
            }),
            0);
}

TEST(P2pEndpoint, PeerKilledMidTransferFailsItsTransfersAndTheServerGoesOn) {
  constexpr int kDyingSends = 16;
  expectAllZero(runServerClients(
                    2,
                    [](int port) {
                      setenv("GDX_TIMEOUT_MS", "10000", 1);
                      Endpoint ep(loopbackEndpoint(port));
                      ep.startPassiveAccept();
                      p2p::Accepted first = ep.accept(), second = ep.accept();
                      if (first.remoteGpu != 0) std::swap(first, second);  // the client that dies serves "GPU" 0
                      std::vector<unsigned char> big(64 << 20, 0), ok(4096, 0);
                      uint64_t bmr = ep.reg(big.data(), big.size()), omr = ep.reg(ok.data(), ok.size());
                      uint64_t healthy = ep.recvAsync(second.connId, omr, ok.data(), ok.size());
                      // 1 GiB in 64 MiB receives: more than loopback moves in the 20 ms the client lives.
                      std::vector<uint64_t> dying;
                      for (int i = 0; i < kDyingSends; ++i)
                        dying.push_back(ep.recvAsync(first.connId, bmr, big.data(), big.size()));
                      bool failed = false;
                      for (uint64_t id : dying) {
                        try {
                          ep.wait(id);
                        } catch (const Error& e) {
                          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed || e.code() == ErrorCode::kTimeout);
                          if (!failed) std::fprintf(stderr, "as expected: %s\n", e.what());
                          failed = true;
                        }
                      }
                      CHILD_CHECK(failed);
                      ep.wait(healthy);  // the other connection was not disturbed
                      std::vector<unsigned char> want(4096);
                      fillRandom(want.data(), want.size(), 5);
                      CHILD_CHECK(firstMismatch(ok.data(), want.data(), want.size()) == -1);
                      return 0;
                    },
                    [](int client, int port) {
                      if (client == 0) setenv("GDX_TIMEOUT_MS", "10000", 1);
                      p2p::EndpointOptions o = loopbackEndpoint(0);
                      o.localGpu = client;
                      Endpoint ep(o);
                      uint64_t conn = ep.connect("127.0.0.1", -1, port);
                      if (client == 0) {
                        std::vector<unsigned char> big(64 << 20, 3);
                        const uint64_t mr = ep.reg(big.data(), big.size());
                        for (int i = 0; i < kDyingSends; ++i) ep.sendAsync(conn, mr, big.data(), big.size());
                        usleep(20000);
                        kill(getpid(), SIGKILL);  // mid-transfer, no goodbye
                      }
                      std::vector<unsigned char> data(4096);
                      fillRandom(data.data(), data.size(), 5);
                      ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
                      return 0;
                    }),
                /*killed=*/1);
}

// The TCP transport's goodbye. Over verbs a peer that closes destroys its queue pairs and says nothing: this side
// notices only when one of its operations to the peer fails, so a receive waiting for it ends at the timeout.
TEST(P2pEndpoint, APeerThatClosesCleanlyFailsWhatStillWaitsForItWithoutWaitingOutTheTimeout) {
  const char* transport = std::getenv("GDX_TRANSPORT");
  if (transport && std::string(transport) == "verbs") GTEST_SKIP() << "verbs announces no clean close";
  expectAllZero(runServerClients(
      1,
      [](int port) {
        setenv("GDX_TIMEOUT_MS", "20000", 1);
        Endpoint ep(loopbackEndpoint(port));
        const uint64_t conn = ep.accept().connId;
        std::vector<unsigned char> buf(4096, 0xA5);
        const uint64_t mr = ep.reg(buf.data(), buf.size());
        const auto t0 = std::chrono::steady_clock::now();
        try {
          ep.recv(conn, mr, buf.data(), buf.size());  // the client closes its endpoint instead of sending
          return 1;
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed);
          CHILD_CHECK(std::string(e.what()).find("closed the connection") != std::string::npos);
        }
        CHILD_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
        CHILD_CHECK(std::all_of(buf.begin(), buf.end(), [](unsigned char b) { return b == 0xA5; }));
        return 0;
      },
      [](int, int port) {
        Endpoint ep(loopbackEndpoint(0));
        ep.connect("127.0.0.1", -1, port);
        return 0;  // the endpoint closes here, with a goodbye
      }));
}

TEST(P2pEndpoint, SeveralClientsAreServedAndBadMetadataIsRefused) {
  constexpr int kClients = 3;
  const int port = freePort();
  std::vector<pid_t> pids{forkChild([&] {
    Endpoint ep(loopbackEndpoint(port));
    for (int i = 0; i < kClients; ++i) {
      p2p::Accepted a = ep.accept();
      std::vector<unsigned char> got(1000 + a.remoteGpu, 0), want(got.size());
      fillRandom(want.data(), want.size(), 300 + a.remoteGpu);
      ep.recv(a.connId, ep.reg(got.data(), got.size()), got.data(), got.size());
      CHILD_CHECK(firstMismatch(got.data(), want.data(), got.size()) == -1);
    }
    return 0;
  })};
  for (int c = 0; c < kClients; ++c)
    pids.push_back(forkChild([&, c] {
      p2p::EndpointOptions o = loopbackEndpoint(0);
      o.localGpu = c;
      Endpoint ep(o);
      std::string meta = ep.metadata();
      CHILD_CHECK(errorCodeOf([&] { ep.addRemoteEndpoint(meta.substr(0, 9)); }) == ErrorCode::kInvalidArgument);
      meta[8] ^= 1;
      CHILD_CHECK(errorCodeOf([&] { ep.addRemoteEndpoint(meta); }) == ErrorCode::kInvalidArgument);
      uint64_t conn = ep.connect("127.0.0.1", -1, port);
      std::vector<unsigned char> data(1000 + c);
      fillRandom(data.data(), data.size(), 300 + c);
      ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
      return 0;
    }));
  for (pid_t p : pids) EXPECT_EQ(waitChild(p, 240), 0);
}

/// A TCP relay on 127.0.0.1 in front of `targetPort`: each client it accepts is connected through at once, but what
/// the client sends is held back `delayMs` before it is passed on (then bytes go both ways until either side closes).
/// To the server this is a dialler whose handshake comes late. Serves `clients` clients one after another.
class SlowRelay {
 public:
  SlowRelay(int targetPort, int delayMs, int clients) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listener_, clients) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw Error(ErrorCode::kSystem, "SlowRelay: cannot listen");
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([=] {
      for (int i = 0; i < clients; ++i) relayOne(targetPort, delayMs);
    });
  }
  ~SlowRelay() {
    ::shutdown(listener_, SHUT_RDWR);  // a client that never came (the test failed before it) is not waited for
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  void relayOne(int targetPort, int delayMs) {
    const int client = ::accept(listener_, nullptr, nullptr);
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(targetPort));
    if (client >= 0 && ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      usleep(delayMs * 1000);
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      char buf[4096];
      for (bool open = true; open && ::poll(p, 2, 10000) > 0;) {
        for (int from = 0; from < 2 && open; ++from) {
          if (!(p[from].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const ssize_t n = ::read(p[from].fd, buf, sizeof buf);
          open = n > 0 && ::write(p[1 - from].fd, buf, static_cast<size_t>(n)) == n;
        }
      }
    }
    ::close(server);
    if (client >= 0) ::close(client);
  }
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(P2pEndpoint, PassiveAcceptGivesAHelloThatComesLateItsWholeWait) {
  // The passive thread waits for clients in slices of 200 ms; a client accepted late in one, whose Hello takes
  // 150 ms to come, is still answered (the hello is bounded by GDX_P2P_HELLO_MS, not by what is left of the slice).
  constexpr int kClients = 8;
  expectAllZero(runServerClients(
      1,
      [](int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        Endpoint ep(loopbackEndpoint(port));
        ep.startPassiveAccept();
        for (int i = 0; i < kClients; ++i) {
          const uint64_t conn = ep.accept().connId;
          std::vector<unsigned char> got(1000 + i, 0xA5), want(got.size());
          fillRandom(want.data(), want.size(), 400 + i);
          ep.recv(conn, ep.reg(got.data(), got.size()), got.data(), got.size());
          CHILD_CHECK(firstMismatch(got.data(), want.data(), want.size()) == -1);
        }
        return 0;
      },
      [](int, int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        SlowRelay relay(port, 150, kClients);
        Endpoint ep(loopbackEndpoint(0));
        for (int i = 0; i < kClients; ++i) {
          // The passive thread began a slice when it took the last client: come 60..120 ms into it, so that less
          // than the Hello's 150 ms is left of it.
          usleep((60 + (i * 17) % 60) * 1000);
          uint64_t conn = 0;
          try {
            conn = ep.connect("127.0.0.1", -1, relay.port());
          } catch (const Error& e) {
            std::fprintf(stderr, "client %d of %d: %s\n", i + 1, kClients, e.what());
            return 1;
          }
          std::vector<unsigned char> data(1000 + i);
          fillRandom(data.data(), data.size(), 400 + i);
          ep.send(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
        }
        return 0;
      }));
}

TEST(P2pEndpoint, AddRemoteEndpointIsCachedPerEndpoint) {
  EXPECT_EQ(runSolo([] {
              Endpoint server(loopbackEndpoint(0));
              server.startPassiveAccept();
              Endpoint client(loopbackEndpoint(0));
              uint64_t a = client.addRemoteEndpoint(server.metadata());
              uint64_t b = client.addRemoteEndpoint(server.metadata());
              CHILD_CHECK(a == b);
              p2p::Accepted acc = server.accept();
              std::vector<unsigned char> data(333), got(333, 0);
              fillRandom(data.data(), data.size(), 1);
              uint64_t t = server.recvAsync(acc.connId, server.reg(got.data(), got.size()), got.data(), got.size());
              client.send(a, client.reg(data.data(), data.size()), data.data(), data.size());
              server.wait(t);
              CHILD_CHECK(firstMismatch(got.data(), data.data(), got.size()) == -1);
              return 0;
            }),
            0);
}

TEST(P2pConnection, AOneSidedWriteLetsGoOfItsTransferOnceItIsDone) {
  EXPECT_EQ(runSolo([] {
              ConnectionPair pair;
              constexpr size_t kBytes = 64 << 10;
              std::vector<unsigned char> src(kBytes), dst(kBytes, 0xA5);
              const p2p::MemoryRegion from{1, reinterpret_cast<char*>(src.data()), kBytes, MemoryKind::kHost};
              const p2p::MemoryRegion into{1, reinterpret_cast<char*>(dst.data()), kBytes, MemoryKind::kHost};
              const uint32_t window = pair.conn[1]->advertise(into, 0, kBytes);
              // The first write waits for the window's key (it asks for it), the later ones find it known.
              constexpr int kWrites = 3;
              std::weak_ptr<p2p::Transfer> done[kWrites];
              for (int i = 0; i < kWrites; ++i) {
                fillRandom(src.data(), kBytes, 60 + i);
                auto t = std::make_shared<p2p::Transfer>("write", 2, nowNs() + ConnectionPair::kTimeoutNs);
                done[i] = t;
                pair.conn[0]->write(t, {p2p::Piece{from, 0, kBytes}}, {p2p::RemotePiece{window, 0, kBytes}}, false);
                t->wait(t->deadlineNs());
                CHILD_CHECK(firstMismatch(dst.data(), src.data(), kBytes) == -1);
              }
              // The connection keeps a finished transfer until its next look at the deadlines (every 10 ms), no
              // longer: then nothing holds it.
              auto allGone = [&] {
                for (auto& d : done)
                  if (!d.expired()) return false;
                return true;
              };
              for (const uint64_t until = nowNs() + 2000ull * 1000 * 1000; !allGone() && nowNs() < until;) usleep(1000);
              for (int i = 0; i < kWrites; ++i)
                if (!done[i].expired()) std::fprintf(stderr, "write %d: its transfer is still held\n", i);
              CHILD_CHECK(allGone());
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace gdx::test
