// gdx::p2p::TcpxSession / TcpxTransfer (the TCPX P2P library's API over gdx's TCP transport) between real processes
// on loopback: 64 MiB of random data posted as 512 KiB chunks into a poisoned buffer, every byte compared, then as one
// post against chunked receives, and back the other way; the connecting side's channels and chunk size adopted by
// the accepting side; bad input refused by name (unknown peers and mem_ids, ranges past a registration, postSend on
// receive memory, malformed connection info, a stranger on the listener); a peer killed mid-transfer failing the
// other side's wait() quickly instead of hanging it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "gdx/p2p/tcpx_session.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::kPtrCuda;
using p2p::kPtrHost;
using p2p::TcpxSession;
using p2p::TcpxSessionOptions;
using p2p::TcpxTransfer;

constexpr size_t kBytes = 64 << 20;
constexpr size_t kChunk = 512 << 10;
constexpr uint64_t kMs = 1000 * 1000;

/// A session on 127.0.0.1 with the TCPX variables' defaults (or what the environment sets).
TcpxSessionOptions loopback(uint64_t timeoutMs = 60000) {
  TcpxSessionOptions o = TcpxSessionOptions::fromEnv(-1);
  o.bindAddress = "127.0.0.1";
  o.timeoutNs = timeoutMs * kMs;
  return o;
}

/// Runs `server(path)` and `client(path)` in two processes; the server ships its connection info through the file at
/// `path`. Returns the exit codes, the server's first.
std::vector<int> runPair(const std::function<int(const std::string&)>& server,
                         const std::function<int(const std::string&)>& client) {
  const std::string path = scratchPath("tcpx_info");
  std::vector<pid_t> pids{forkChild([&] { return server(path); }), forkChild([&] { return client(path); })};
  std::vector<int> codes;
  for (pid_t p : pids) codes.push_back(waitChild(p, 240));
  std::remove(path.c_str());
  return codes;
}

/// The client's side of every pair: the server's info loaded and connected under the name "server".
void connectToServer(TcpxSession& s, const std::string& path) {
  const std::string info = awaitText(path);
  if (info.empty()) throw Error(ErrorCode::kTimeout, "no connection info in " + path);
  s.loadRemoteConnInfo("server", info);
  s.connect("server");
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(TcpxSession, SixtyFourMiBInChunksEveryByteCheckedBothWays) {
  const std::vector<int> codes = runPair(
      [](const std::string& path) {
        TcpxSession s(loopback());
        shipText(path, s.listen());
        s.accept("client");
        std::vector<unsigned char> got(kBytes, 0xA5), want(kBytes);  // poisoned
        fillRandom(want.data(), kBytes, 1);
        const uint64_t mem = s.registerMemory(got.data(), kBytes, kPtrHost, /*isRecv=*/true);
        std::unique_ptr<TcpxTransfer> t(s.createTransfer("client"));
        for (size_t off = 0; off < kBytes; off += kChunk) t->postRecv(mem, off, kChunk);
        CHILD_CHECK(t->totalChunks() == kBytes / kChunk);
        t->wait();
        CHILD_CHECK(t->completedChunks() == kBytes / kChunk);
        CHILD_CHECK(firstMismatch(got.data(), want.data(), kBytes) == -1);
        // Again on the same transfer: the sender posts the 64 MiB at once, which is cut into the same pieces.
        t->release();
        CHILD_CHECK(t->totalChunks() == 0 && t->completedChunks() == 0);
        std::fill(got.begin(), got.end(), 0x5A);
        fillRandom(want.data(), kBytes, 2);
        for (size_t off = 0; off < kBytes; off += kChunk) t->postRecv(mem, off, kChunk);
        t->wait();
        CHILD_CHECK(firstMismatch(got.data(), want.data(), kBytes) == -1);
        // And back: the accepting side sends over the same channels.
        std::vector<unsigned char> reply((1 << 20) + 3);
        fillRandom(reply.data(), reply.size(), 3);
        const uint64_t out = s.registerMemory(reply.data(), reply.size(), kPtrHost, /*isRecv=*/false);
        std::unique_ptr<TcpxTransfer> back(s.createTransfer("client"));
        back->postSend(out, 0, reply.size());
        back->wait();
        return 0;
      },
      [](const std::string& path) {
        TcpxSession s(loopback());
        connectToServer(s, path);
        std::vector<unsigned char> src(kBytes);
        fillRandom(src.data(), kBytes, 1);
        const uint64_t mem = s.registerMemory(src.data(), kBytes, kPtrHost, /*isRecv=*/false);
        std::unique_ptr<TcpxTransfer> t(s.createTransfer("server"));
        for (size_t off = 0; off < kBytes; off += kChunk) t->postSend(mem, off, kChunk);
        t->wait();
        CHILD_CHECK(t->isComplete());
        t->release();
        fillRandom(src.data(), kBytes, 2);
        t->postSend(mem, 0, kBytes);
        CHILD_CHECK(t->totalChunks() == kBytes / kChunk);
        t->wait();
        std::vector<unsigned char> got((1 << 20) + 3, 0xA5), want(got.size());
        fillRandom(want.data(), want.size(), 3);
        const uint64_t in = s.registerMemory(got.data(), got.size(), kPtrHost, /*isRecv=*/true);
        std::unique_ptr<TcpxTransfer> back(s.createTransfer("server"));
        back->postRecv(in, 0, got.size());
        while (!back->isComplete()) std::this_thread::sleep_for(std::chrono::microseconds(200));
        CHILD_CHECK(firstMismatch(got.data(), want.data(), got.size()) == -1);
        return 0;
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(TcpxSession, TheConnectingSidesChannelsAndChunkSizeDecide) {
  // The client's environment asks for 3 channels of 1 socket and 64 KiB pieces, the server keeps 2 x 2 and 512 KiB:
  // one post of 4 MiB + 5 bytes on each side arrives whole only if the server cuts it as the client does.
  constexpr size_t n = (4 << 20) + 5;
  const std::vector<int> codes = runPair(
      [](const std::string& path) {
        TcpxSession s(loopback());
        CHILD_CHECK(s.numChannels() == 2);
        shipText(path, s.listen());
        s.accept("client");
        std::vector<unsigned char> got(n, 0xA5), want(n);
        fillRandom(want.data(), n, 7);
        std::unique_ptr<TcpxTransfer> t(s.createTransfer("client"));
        t->postRecv(s.registerMemory(got.data(), n, kPtrHost, true), 0, n);
        CHILD_CHECK(t->totalChunks() == (n + (64 << 10) - 1) / (64 << 10));
        t->wait();
        CHILD_CHECK(firstMismatch(got.data(), want.data(), n) == -1);
        return 0;
      },
      [](const std::string& path) {
        setenv("UCCL_TCPX_NUM_CHANNELS", "3", 1);
        setenv("NCCL_NSOCKS_PERTHREAD", "1", 1);
        setenv("UCCL_TCPX_CHUNK_BYTES", "65536", 1);
        TcpxSession s(loopback());
        CHILD_CHECK(s.numChannels() == 3);
        connectToServer(s, path);
        std::vector<unsigned char> src(n);
        fillRandom(src.data(), n, 7);
        std::unique_ptr<TcpxTransfer> t(s.createTransfer("server"));
        t->postSend(s.registerMemory(src.data(), n, kPtrHost, false), 0, n);
        t->wait();
        return 0;
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(TcpxSession, BadInputIsRefusedByName) {
  EXPECT_EQ(
      waitChild(forkChild([] {
        TcpxSession server(loopback(2000)), client(loopback(2000));
        // Connection info that listen() did not write.
        for (const char* bad : {"", "gdx-tcpx/1", "gdx-tcpx/1 127.0.0.1 99999 0", "gdx-tcpx/1 127.0.0.1 80 0 x",
                                "gdx-tcpx/2 127.0.0.1 80 0", "gdx-tcpx/1 127.0.0.1 80 -7"})
          CHILD_CHECK(throwsNaming([&] { client.loadRemoteConnInfo("server", bad); }, ErrorCode::kInvalidArgument,
                                   {"'server'", "not connection info"}));
        CHILD_CHECK(throwsNaming([&] { client.connect("nobody"); }, ErrorCode::kInvalidArgument,
                                 {"connect('nobody')", "loadRemoteConnInfo"}));
        CHILD_CHECK(throwsNaming([&] { client.createTransfer("nobody"); }, ErrorCode::kInvalidArgument, {"'nobody'"}));
        // Registrations.
        std::vector<char> sendBuf(4096), recvBuf(4096, 0);
        fillRandom(sendBuf.data(), sendBuf.size(), 9);
        CHILD_CHECK(throwsNaming([&] { client.registerMemory(nullptr, 16, kPtrHost, false); },
                                 ErrorCode::kInvalidArgument, {"null pointer"}));
        CHILD_CHECK(throwsNaming([&] { client.registerMemory(sendBuf.data(), 0, kPtrHost, false); },
                                 ErrorCode::kInvalidArgument, {"zero bytes"}));
        CHILD_CHECK(throwsNaming([&] { client.registerMemory(sendBuf.data(), 16, 7, false); },
                                 ErrorCode::kInvalidArgument, {"ptrType 7", "kPtrHost"}));
        CHILD_CHECK(throwsNaming([&] { client.registerMemory(sendBuf.data(), 16, kPtrCuda, false); },
                                 ErrorCode::kInvalidArgument, {"kPtrCuda"}));
        client.loadRemoteConnInfo("server", server.listen());
        client.connect("server");
        server.accept("client");
        CHILD_CHECK(throwsNaming([&] { server.accept("client"); }, ErrorCode::kInvalidArgument,
                                 {"accept('client')", "exists already"}));
        const uint64_t sendMem = client.registerMemory(sendBuf.data(), sendBuf.size(), kPtrHost, false);
        const uint64_t recvMem = server.registerMemory(recvBuf.data(), recvBuf.size(), kPtrHost, true);
        const uint64_t clientRecvMem = client.registerMemory(recvBuf.data(), 64, kPtrHost, true);
        std::unique_ptr<TcpxTransfer> tx(client.createTransfer("server")), rx(server.createTransfer("client"));
        // Posts: unknown mem_id, a range past the registration (also by overflow), the wrong direction,
        // nothing at all. None of them is posted: the good transfer after them pairs up.
        CHILD_CHECK(throwsNaming([&] { tx->postSend(999, 0, 16); }, ErrorCode::kInvalidArgument,
                                 {"'server'", "postSend(mem_id 999, offset 0, size 16)", "not registered"}));
        CHILD_CHECK(throwsNaming([&] { tx->postSend(sendMem, 4000, 200); }, ErrorCode::kInvalidArgument,
                                 {"offset 4000, size 200", "past the end", "4096 bytes"}));
        CHILD_CHECK(
            throwsNaming([&] { tx->postSend(sendMem, SIZE_MAX, 2); }, ErrorCode::kInvalidArgument, {"past the end"}));
        CHILD_CHECK(throwsNaming([&] { tx->postSend(clientRecvMem, 0, 16); }, ErrorCode::kInvalidArgument,
                                 {"postSend", "isRecv true"}));
        CHILD_CHECK(throwsNaming([&] { rx->postRecv(recvMem, 0, 0); }, ErrorCode::kInvalidArgument,
                                 {"postRecv", "zero bytes"}));
        CHILD_CHECK(throwsNaming([&] { tx->postRecv(sendMem, 0, 16); }, ErrorCode::kInvalidArgument,
                                 {"postRecv", "isRecv false"}));
        CHILD_CHECK(tx->totalChunks() == 0 && rx->totalChunks() == 0);
        rx->postRecv(recvMem, 0, 4096);
        tx->postSend(sendMem, 0, 4096);
        tx->wait();
        rx->wait();
        CHILD_CHECK(firstMismatch(sendBuf.data(), recvBuf.data(), 4096) == -1);
        // Sizes that do not match fail the receive's wait by name (the send's bytes fit the larger receive, so the
        // sender's wait succeeds).
        rx->postRecv(recvMem, 0, 2000);
        tx->postSend(sendMem, 0, 1000);
        CHILD_CHECK(errorCodeOf([&] { tx->wait(); }) == ErrorCode::kOk);
        try {
          rx->wait();
          CHILD_CHECK(!"the receive of 2000 bytes for a send of 1000 succeeded");
        } catch (const Error& e) {
          std::fprintf(stderr, "child: the mismatch: %s\n", e.what());
          CHILD_CHECK(std::string(e.what()).find("postRecv(mem_id " + std::to_string(recvMem) +
                                                 ", offset 0, size 2000)") != std::string::npos);
        }
        // A send nobody receives: wait() ends after the session's timeout (2 s here) and names the post.
        auto t0 = std::chrono::steady_clock::now();
        tx->postSend(sendMem, 0, 4096);
        const std::string post = "postSend(mem_id " + std::to_string(sendMem) + ", offset 0, size 4096)";
        CHILD_CHECK(throwsNaming([&] { tx->wait(); }, ErrorCode::kTimeout, {"'server'", post.c_str(), "channel"}));
        CHILD_CHECK(secondsSince(t0) > 1.5 && secondsSince(t0) < 6);
        // Deregistered memory, then a disconnected peer.
        client.deregisterMemory(clientRecvMem);
        CHILD_CHECK(
            throwsNaming([&] { client.deregisterMemory(clientRecvMem); }, ErrorCode::kInvalidArgument, {"mem_id"}));
        client.disconnect("server");
        CHILD_CHECK(
            throwsNaming([&] { tx->postSend(sendMem, 0, 16); }, ErrorCode::kShutdown, {"disconnect('server')"}));
        CHILD_CHECK(throwsNaming([&] { client.createTransfer("server"); }, ErrorCode::kInvalidArgument, {"'server'"}));
        // Nobody comes: accept() and connect() end within the session's timeout, by name.
        t0 = std::chrono::steady_clock::now();
        CHILD_CHECK(
            throwsNaming([&] { server.accept("late"); }, ErrorCode::kTimeout, {"accept('late')", "GDX_TIMEOUT_MS"}));
        CHILD_CHECK(secondsSince(t0) < 6);
        const std::string deadPort = std::to_string(freePort());
        client.loadRemoteConnInfo("dead", "gdx-tcpx/1 127.0.0.1 " + deadPort + " 0");
        t0 = std::chrono::steady_clock::now();
        CHILD_CHECK(throwsNaming([&] { client.connect("dead"); }, ErrorCode::kTimeout,
                                 {"connect('dead')", "channel 0 of 2", deadPort.c_str()}));
        CHILD_CHECK(secondsSince(t0) < 6);
        return 0;
      })),
      0);
}

TEST(TcpxSession, BadSettingsAreRefusedByName) {
  EXPECT_EQ(
      waitChild(forkChild([] {
        TcpxSessionOptions o = loopback();
        o.channels = 0;
        CHILD_CHECK(throwsNaming([&] { TcpxSession s(o); }, ErrorCode::kInvalidArgument, {"UCCL_TCPX_NUM_CHANNELS"}));
        o = loopback();
        o.chunkBytes = 0;
        CHILD_CHECK(throwsNaming([&] { TcpxSession s(o); }, ErrorCode::kInvalidArgument, {"UCCL_TCPX_CHUNK_BYTES"}));
        setenv("NCCL_NSOCKS_PERTHREAD", "65", 1);
        CHILD_CHECK(
            throwsNaming([&] { TcpxSession s(-1, 2); }, ErrorCode::kInvalidArgument, {"NCCL_NSOCKS_PERTHREAD", "65"}));
        unsetenv("NCCL_NSOCKS_PERTHREAD");
        setenv("UCCL_TCPX_CHUNK_BYTES", "512K", 1);
        CHILD_CHECK(
            throwsNaming([&] { TcpxSession s(-1, 2); }, ErrorCode::kInvalidArgument, {"UCCL_TCPX_CHUNK_BYTES"}));
        unsetenv("UCCL_TCPX_CHUNK_BYTES");
        setenv("UCCL_TCPX_NUM_CHANNELS", "5", 1);
        CHILD_CHECK(TcpxSession(-1).numChannels() == 5);     // 0: from the environment
        CHILD_CHECK(TcpxSession(-1, 3).numChannels() == 3);  // as given
        return 0;
      })),
      0);
}

TEST(TcpxSession, StrangersOnTheListenerAreRefusedAndTheClientStillAccepted) {
  EXPECT_EQ(waitChild(forkChild([] {
              TcpxSession server(loopback(10000)), client(loopback(10000));
              const std::string info = server.listen();
              // Two endpoints that are no session: one says 64 bytes of something else, one a message of another
              // size. Each connects and speaks before the real client does.
              int port = 0;
              CHILD_CHECK(std::sscanf(info.c_str(), "gdx-tcpx/1 127.0.0.1 %d", &port) == 1);
              p2p::Endpoint stranger(loopbackEndpoint(0));
              std::vector<char> junk(100, 'x');
              const uint64_t mr = stranger.reg(junk.data(), junk.size());
              const uint64_t c1 = stranger.connect("127.0.0.1", -1, port);
              const uint64_t c2 = stranger.connect("127.0.0.1", -1, port);
              const uint64_t s1 = stranger.sendAsync(c1, mr, junk.data(), 64);
              const uint64_t s2 = stranger.sendAsync(c2, mr, junk.data(), 100);
              client.loadRemoteConnInfo("server", info);
              client.connect("server");
              server.accept("client");
              for (uint64_t s : {s1, s2}) errorCodeOf([&] { stranger.wait(s); });  // refused: closed or failed
              std::vector<char> src(300000), dst(300000, 0);
              fillRandom(src.data(), src.size(), 5);
              std::unique_ptr<TcpxTransfer> tx(client.createTransfer("server")), rx(server.createTransfer("client"));
              rx->postRecv(server.registerMemory(dst.data(), dst.size(), kPtrHost, true), 0, dst.size());
              tx->postSend(client.registerMemory(src.data(), src.size(), kPtrHost, false), 0, src.size());
              tx->wait();
              rx->wait();
              CHILD_CHECK(firstMismatch(src.data(), dst.data(), src.size()) == -1);
              return 0;
            })),
            0);
}

/// How long the survivor's wait() may take once its peer is killed: far below the session's timeout (60 s).
constexpr double kNoticeBoundSeconds = 15;

/// One side of a 64 MiB transfer in chunks: the server receives, the client sends. The side that `dies` posts a
/// quarter, waits for it and is killed; the survivor posted it all, and its wait() must fail by name (kPeerFailed)
/// long before the session's timeout, every piece settled, and posting to the dead peer must fail too.
int sideOfAKilledTransfer(TcpxSession& s, bool server, bool dies) {
  const char* peer = server ? "client" : "server";
  std::vector<unsigned char> buf(kBytes, 1);
  const uint64_t mem = s.registerMemory(buf.data(), kBytes, kPtrHost, /*isRecv=*/server);
  std::unique_ptr<TcpxTransfer> t(s.createTransfer(peer));
  for (size_t off = 0; off < (dies ? kBytes / 4 : kBytes); off += kChunk)
    server ? t->postRecv(mem, off, kChunk) : t->postSend(mem, off, kChunk);
  if (dies) {
    t->wait();  // a quarter went through; the rest never comes
    raise(SIGKILL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string name = "'" + std::string(peer) + "'";
  CHILD_CHECK(throwsNaming([&] { t->wait(); }, ErrorCode::kPeerFailed,
                           {name.c_str(), server ? "postRecv(mem_id" : "postSend(mem_id", "size 524288", "channel"}));
  std::fprintf(stderr, "%s: wait() failed after %.2f s\n", server ? "server" : "client", secondsSince(t0));
  CHILD_CHECK(secondsSince(t0) < kNoticeBoundSeconds);
  CHILD_CHECK(t->isComplete());  // nothing is left waiting
  CHILD_CHECK(errorCodeOf([&] {
                server ? t->postRecv(mem, 0, kChunk) : t->postSend(mem, 0, kChunk);
                t->wait();
              }) != ErrorCode::kOk);
  return 0;
}

/// The pair of sideOfAKilledTransfer(): the sender (client) is killed, or the receiver (server).
std::vector<int> killMidTransfer(bool senderDies) {
  return runPair(
      [&](const std::string& path) {
        TcpxSession s(loopback());
        shipText(path, s.listen());
        s.accept("client");
        return sideOfAKilledTransfer(s, true, !senderDies);
      },
      [&](const std::string& path) {
        TcpxSession s(loopback());
        connectToServer(s, path);
        return sideOfAKilledTransfer(s, false, senderDies);
      });
}

TEST(TcpxSession, ASenderKilledMidTransferFailsTheReceiversWaitByName) {
  EXPECT_EQ(killMidTransfer(/*senderDies=*/true), (std::vector<int>{0, 128 + SIGKILL}));
}

TEST(TcpxSession, AReceiverKilledMidTransferFailsTheSendersWaitByName) {
  EXPECT_EQ(killMidTransfer(/*senderDies=*/false), (std::vector<int>{128 + SIGKILL, 0}));
}

}  // namespace
}  // namespace gdx::test
