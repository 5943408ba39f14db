// Which transport carries a p2p connection, and how: the dialling side's GDX_TCP_SOCKETS and GDX_TCP_CHUNK decide
// for both sides (the accepting side's own settings differ here on purpose), the connection reports and logs it,
// it really opens that many sockets, and writes split into chunks over them arrive intact. A transport forced on
// one side only is refused by name on both.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;

constexpr size_t kBytes = (8 << 20) + 3;  // 128 chunks of 64 KiB and a bit: every socket carries several
const std::string kShape = "tcp, 3 sockets, 65536-byte chunks";

/// How many of this process's file descriptors are sockets.
int socketCount() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    char target[PATH_MAX] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(link.c_str(), target, sizeof target - 1) > 0 && std::string(target).rfind("socket:", 0) == 0) ++n;
  }
  closedir(d);
  return n;
}

TEST(P2pTransports, TheDiallersSocketsAndChunksCarryTheConnectionAndAreReported) {
  auto codes = runServerClients(
      1,
      [](int port) {
        setenv("GDX_TCP_SOCKETS", "1", 1);  // not what the connection uses: the dialler decides
        setenv("GDX_TCP_CHUNK", "4096", 1);
        Endpoint ep(loopbackEndpoint(port));
        uint64_t conn = ep.accept().connId;
        CHILD_CHECK(ep.connectionTransport(conn) == kShape);
        std::vector<unsigned char> got(kBytes, 0xA5), want(kBytes);
        fillRandom(want.data(), want.size(), 61);
        uint64_t mr = ep.reg(got.data(), got.size());
        ep.recv(conn, mr, got.data(), got.size());
        CHILD_CHECK(firstMismatch(got.data(), want.data(), kBytes) == -1);
        std::fill(got.begin(), got.end(), 0x3C);
        sendBlob(ep, conn, ep.advertise(conn, mr, got.data(), kBytes));
        CHILD_CHECK(recvBlob(ep, conn) == "written");
        fillRandom(want.data(), want.size(), 62);
        CHILD_CHECK(firstMismatch(got.data(), want.data(), kBytes) == -1);
        return 0;
      },
      [](int, int port) {
        setenv("GDX_TCP_SOCKETS", "3", 1);
        setenv("GDX_TCP_CHUNK", "65536", 1);
        Endpoint ep(loopbackEndpoint(0));
        const int before = socketCount();
        uint64_t conn = ep.connect("127.0.0.1", -1, port);
        // Per direction 3 sockets to the peer and 3 from it (plus the transport's own to itself): at least 6 more.
        const int opened = socketCount() - before;
        std::fprintf(stderr, "connect opened %d sockets\n", opened);
        CHILD_CHECK(opened >= 6);
        CHILD_CHECK(ep.connectionTransport(conn) == kShape);
        CHILD_CHECK(errorCodeOf([&] { ep.connectionTransport(conn + 1); }) == ErrorCode::kInvalidArgument);
        std::vector<unsigned char> data(kBytes);
        fillRandom(data.data(), data.size(), 61);
        uint64_t mr = ep.reg(data.data(), data.size());
        ep.send(conn, mr, data.data(), data.size());
        const std::string desc = recvBlob(ep, conn);
        fillRandom(data.data(), data.size(), 62);
        ep.write(conn, mr, data.data(), data.size(), desc);
        sendBlob(ep, conn, "written");
        return 0;
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(P2pTransports, ATransportForcedOnOneSideOnlyIsRefusedByNameOnBoth) {
  auto codes = runServerClients(
      1,
      [](int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        p2p::EndpointOptions o = loopbackEndpoint(port);
        o.transport = "verbs";  // forced; the client keeps tcp
        Endpoint ep(o);
        CHILD_CHECK(ep.transport() == "verbs");
        try {
          ep.accept();
          return 1;
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kProtocol);
          CHILD_CHECK(std::string(e.what()).find("the peer uses transport 'tcp', this endpoint 'verbs'") !=
                      std::string::npos);
        }
        return 0;
      },
      [](int, int port) {
        setenv("GDX_TIMEOUT_MS", "5000", 1);
        Endpoint ep(loopbackEndpoint(0));
        CHILD_CHECK(ep.transport() == "tcp");
        try {
          ep.connect("127.0.0.1", -1, port);
          return 1;
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kInvalidArgument);
          CHILD_CHECK(std::string(e.what()).find("refused by the peer") != std::string::npos);
          CHILD_CHECK(std::string(e.what()).find("GDX_TRANSPORT") != std::string::npos);
        }
        return 0;
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(P2pTransports, AnUnknownTransportIsRefusedByName) {
  p2p::EndpointOptions o = loopbackEndpoint(0);
  o.transport = "carrier-pigeon";
  try {
    Endpoint ep(o);
    FAIL() << "an endpoint over carrier-pigeon was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gdx::test
