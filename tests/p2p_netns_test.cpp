// gdx::p2p::Endpoint between processes in separate network namespaces joined by veth pairs to a bridge, as on two
// hosts: the client finds the server through its metadata (the advertised address is the namespace's own, not
// loopback), the server sees the client's address, and 64 MiB of two-sided and 16 MiB of one-sided traffic over
// several sockets arrive intact; a client whose link goes down fails the server's transfer by name within
// GDX_TIMEOUT_MS. Skipped (with the reason) where namespaces cannot be made.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "support/netns_job.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;

constexpr size_t kTwoSided = 64 << 20;
constexpr size_t kOneSided = 16 << 20;

/// An endpoint of namespace `r` of `job`, bound to its veth address.
p2p::EndpointOptions namespaceEndpoint(const NetnsJob& job, int r) {
  p2p::EndpointOptions o = p2p::EndpointOptions::fromEnv(-1, 2);
  o.bindAddress = job.address(r);
  o.port = 0;
  return o;
}

void putLine(int fd, const std::string& s) {
  std::string line = s + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("writing to the pipe failed");
}

std::string getLine(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

/// The server's metadata travels to the client through a pipe, as an application's own channel would carry it.
class MetadataPipe {
 public:
  MetadataPipe() {
    if (pipe(fds_) != 0) throw std::runtime_error("pipe() failed");
  }
  ~MetadataPipe() {
    close(fds_[0]);
    close(fds_[1]);
  }
  void put(const std::string& metadata) {
    std::string hex;
    char b[3];
    for (unsigned char c : metadata) std::snprintf(b, sizeof b, "%02x", c), hex += b;
    putLine(fds_[1], hex);
  }
  std::string get() {
    std::string hex = getLine(fds_[0]), out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
  }

 private:
  int fds_[2];
};

TEST(P2pNetns, EndpointsInSeparateNamespacesMoveEveryByte) {
  NetnsJob job(2, 11);
  if (!job.ok()) GTEST_SKIP() << "network namespaces unavailable: " << job.error();
  MetadataPipe meta;
  pid_t server = forkChild([&] {
    job.enter(0);
    Endpoint ep(namespaceEndpoint(job, 0));
    CHILD_CHECK(ep.ip() == job.address(0));
    meta.put(ep.metadata());
    p2p::Accepted a = ep.accept();
    CHILD_CHECK(a.ip == job.address(1));
    std::vector<unsigned char> got(kTwoSided, 0xA5), want(kTwoSided);
    fillRandom(want.data(), want.size(), 1101);
    uint64_t mr = ep.reg(got.data(), got.size());
    ep.recv(a.connId, mr, got.data(), got.size());
    CHILD_CHECK(firstMismatch(got.data(), want.data(), got.size()) == -1);
    // One-sided: the client writes the first half of `got` and reads the second, which holds fresh data.
    std::fill(got.begin(), got.begin() + kOneSided, 0x5A);
    fillRandom(got.data() + kOneSided, kOneSided, 1103);
    sendBlob(ep, a.connId, ep.advertise(a.connId, mr, got.data(), 2 * kOneSided));
    CHILD_CHECK(recvBlob(ep, a.connId) == "written");
    fillRandom(want.data(), kOneSided, 1102);
    CHILD_CHECK(firstMismatch(got.data(), want.data(), kOneSided) == -1);
    CHILD_CHECK(recvBlob(ep, a.connId) == "bye");
    return 0;
  });
  pid_t client = forkChild([&] {
    job.enter(1);
    setenv("GDX_TCP_SOCKETS", "4", 1);
    Endpoint ep(namespaceEndpoint(job, 1));
    uint64_t conn = ep.addRemoteEndpoint(meta.get());
    CHILD_CHECK(ep.connectionTransport(conn).rfind("tcp, 4 sockets", 0) == 0);
    std::vector<unsigned char> data(kTwoSided);
    fillRandom(data.data(), data.size(), 1101);
    uint64_t mr = ep.reg(data.data(), data.size());
    ep.send(conn, mr, data.data(), data.size());
    const std::string desc = recvBlob(ep, conn);
    fillRandom(data.data(), kOneSided, 1102);
    ep.write(conn, mr, data.data(), kOneSided, desc, 0);
    sendBlob(ep, conn, "written");
    std::vector<unsigned char> want(kOneSided);
    fillRandom(want.data(), want.size(), 1103);
    std::fill(data.begin(), data.begin() + kOneSided, 0xCC);
    ep.read(conn, mr, data.data(), kOneSided, desc, kOneSided);
    CHILD_CHECK(firstMismatch(data.data(), want.data(), kOneSided) == -1);
    sendBlob(ep, conn, "bye");
    return 0;
  });
  EXPECT_EQ(waitChild(server, 240), 0);
  EXPECT_EQ(waitChild(client, 240), 0);
}

// The client takes its link down as it starts a 64 MiB send, without closing anything: no FIN or RST reaches the
// server, whose posted receive must still end with an error naming the connection within GDX_TIMEOUT_MS.
TEST(P2pNetns, ACutLinkFailsTheReceiveByNameWithinTheTimeout) {
  NetnsJob job(2, 12);
  if (!job.ok()) GTEST_SKIP() << "network namespaces unavailable: " << job.error();
  constexpr int kTimeoutMs = 6000;
  MetadataPipe meta;
  pid_t server = forkChild([&] {
    job.enter(0);
    setenv("GDX_TIMEOUT_MS", std::to_string(kTimeoutMs).c_str(), 1);
    Endpoint ep(namespaceEndpoint(job, 0));
    meta.put(ep.metadata());
    p2p::Accepted a = ep.accept();
    std::vector<unsigned char> got(kTwoSided, 0);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      ep.recv(a.connId, ep.reg(got.data(), got.size()), got.data(), got.size());
      return 1;
    } catch (const Error& e) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "server after %.0f ms: %s\n", ms, e.what());
      if (e.code() != ErrorCode::kPeerFailed && e.code() != ErrorCode::kTimeout) return 2;
      if (std::string(e.what()).find("connection " + std::to_string(a.connId)) == std::string::npos) return 3;
      if (ms > kTimeoutMs + 2000) return 4;
    }
    _exit(0);  // the connection to a vanished peer cannot close cleanly; the verdict above is what is tested
  });
  pid_t client = forkChild([&] {
    job.enter(1);
    setenv("GDX_TIMEOUT_MS", std::to_string(kTimeoutMs).c_str(), 1);
    Endpoint ep(namespaceEndpoint(job, 1));
    uint64_t conn = ep.addRemoteEndpoint(meta.get());
    std::vector<unsigned char> data(kTwoSided, 7);
    if (sh("ip link set " + job.device(1) + " down") != 0) return 5;
    ep.sendAsync(conn, ep.reg(data.data(), data.size()), data.data(), data.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 4000));
    _exit(0);
  });
  EXPECT_EQ(waitChild(server, 120), 0) << "1: no error, 2: not kPeerFailed/kTimeout, 3: connection not named, "
                                          "4: later than the timeout";
  EXPECT_EQ(waitChild(client, 120), 0) << "5: could not take the link down";
}

}  // namespace
}  // namespace gdx::test
