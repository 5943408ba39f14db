// gdx::p2p::UrlTransport between two processes: bind/connect with URLs swapped through pipes (an application's own
// channel), many writes in flight with notifications, every byte checked, and refused misuse; two transports of one
// process closed at the same moment, with writes still in flight, many times over.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/url_transport.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::RegisteredMemory;
using p2p::RemoteBuffer;
using p2p::UrlTransport;

constexpr size_t kBytes = 4 << 20;
constexpr int kWrites = 32;

void putLine(int fd, const std::string& s) {
  std::string line = s + "\n";
  (void)!::write(fd, line.data(), line.size());
}

std::string getLine(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

/// Tells the other side this side's URL, the address of `mem` and its key; returns the other side's URL and sets
/// *remote to its memory.
std::string swapWithPeer(const std::string& url, const RegisteredMemory& mem, int toPeer, int fromPeer,
                         RemoteBuffer* remote) {
  putLine(toPeer, url);
  putLine(toPeer, std::to_string(reinterpret_cast<uintptr_t>(mem.data())));
  putLine(toPeer, mem.remoteKey());
  const std::string peerUrl = getLine(fromPeer);
  *remote = RemoteBuffer{reinterpret_cast<void*>(std::stoull(getLine(fromPeer))), getLine(fromPeer)};
  return peerUrl;
}

/// Runs `side(me, toPeer, fromPeer)` for me = 0 and 1 in two processes joined by pipes; expects both to exit 0 within
/// `seconds`.
void expectBothSidesPass(int (*side)(int, int, int), int seconds) {
  int ab[2], ba[2];
  ASSERT_EQ(pipe(ab), 0);
  ASSERT_EQ(pipe(ba), 0);
  pid_t a = forkChild([&] { return side(0, ab[1], ba[0]); });
  pid_t b = forkChild([&] { return side(1, ba[1], ab[0]); });
  EXPECT_EQ(waitChild(a, seconds), 0);
  EXPECT_EQ(waitChild(b, seconds), 0);
  for (int fd : {ab[0], ab[1], ba[0], ba[1]}) close(fd);
}

/// Side `me` of two: binds, swaps URL, buffer address and key with the other side, connects.
int side(int me, int toPeer, int fromPeer) {
  UrlTransport t;
  const std::string url = t.bind();
  std::vector<unsigned char> buf(kBytes, 0xAB);
  RegisteredMemory mem(buf.data(), buf.size());
  RemoteBuffer remote;
  const std::string peerUrl = swapWithPeer(url, mem, toPeer, fromPeer, &remote);
  CHILD_CHECK(!t.connected());
  t.connect(peerUrl);
  CHILD_CHECK(t.connected());
  if (me == 0) {  // the writer
    fillRandom(buf.data(), buf.size(), 77);
    std::vector<std::future<Status>> inFlight;
    const size_t piece = kBytes / kWrites;
    for (int i = 0; i < kWrites; ++i)
      inFlight.push_back(t.write(mem.view(i * piece, piece),
                                 RemoteBuffer{static_cast<char*>(remote.ptr) + i * piece, remote.accessKey}, true));
    for (auto& f : inFlight) CHILD_CHECK(f.get() == Status::kOk);
    // Misuse: past the peer's memory, a key that is not one, a view outside the local memory.
    CHILD_CHECK(
        t.write(mem.view(0, 16), RemoteBuffer{static_cast<char*>(remote.ptr) + kBytes - 8, remote.accessKey}, false)
            .get() == Status::kInvalidArgument);
    CHILD_CHECK(t.write(mem.view(0, 16), RemoteBuffer{remote.ptr, "gdxmem:1"}, false).get() ==
                Status::kInvalidArgument);
    CHILD_CHECK(errorCodeOf([&] { mem.view(kBytes - 4, 8); }) == ErrorCode::kInvalidArgument);
    CHILD_CHECK(mem.contains(mem.view(8, 8)) && !mem.contains(buf.data() + kBytes, 1));
    CHILD_CHECK(t.write(mem.view(0, 1), remote, true).get() == Status::kOk);  // "done"
  } else {
    for (int i = 0; i < kWrites; ++i) CHILD_CHECK(t.waitForWrite().get() == Status::kOk);
    std::vector<unsigned char> want(kBytes);
    fillRandom(want.data(), want.size(), 77);
    CHILD_CHECK(t.waitForWrite().get() == Status::kOk);  // the last one-byte write
    CHILD_CHECK(firstMismatch(buf.data(), want.data(), kBytes) == -1);
  }
  putLine(toPeer, "bye");  // neither side closes while the other still works
  CHILD_CHECK(getLine(fromPeer) == "bye");
  return 0;
}

TEST(P2pUrlTransport, ManyNotifiedWritesInFlightEveryByteChecked) {
  expectBothSidesPass(side, 240);
}

/// A wait that timed out takes no write: side 1 waits (1 s timeout) for a write that comes only after, then waits
/// again and gets it (before, the late write went to the first wait, the second one timed out as well).
int lateWriteSide(int me, int toPeer, int fromPeer) {
  if (me == 1) setenv("GDX_TIMEOUT_MS", "1000", 1);
  UrlTransport t;
  const std::string url = t.bind();
  std::vector<unsigned char> buf(4096, 0xAB);
  RegisteredMemory mem(buf.data(), buf.size());
  RemoteBuffer remote;
  t.connect(swapWithPeer(url, mem, toPeer, fromPeer, &remote));
  if (me == 0) {
    CHILD_CHECK(getLine(fromPeer) == "timed out");
    fillRandom(buf.data(), buf.size(), 78);
    CHILD_CHECK(t.write(mem.view(0, buf.size()), remote, true).get() == Status::kOk);
  } else {
    CHILD_CHECK(t.waitForWrite().get() == Status::kTimeout);
    putLine(toPeer, "timed out");
    CHILD_CHECK(t.waitForWrite().get() == Status::kOk);
    std::vector<unsigned char> want(buf.size());
    fillRandom(want.data(), want.size(), 78);
    CHILD_CHECK(firstMismatch(buf.data(), want.data(), buf.size()) == -1);
  }
  putLine(toPeer, "bye");
  CHILD_CHECK(getLine(fromPeer) == "bye");
  return 0;
}

TEST(P2pUrlTransport, AWaitThatTimedOutTakesNoLaterWrite) {
  expectBothSidesPass(lateWriteSide, 60);
}

/// Counts this side in at `step` and waits until both sides are there, at most 10 s; false (saying which step) when
/// the other side did not come.
bool meet(std::atomic<int>& arrived, const char* step) {
  ++arrived;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (arrived.load() < 2) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "the other side did not reach '%s' within 10 s\n", step);
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

/// `rounds` times: two transports of this process connect, write to each other (checked), leave more notified writes
/// in flight and close at the same moment. Each side closes while the other's goodbye, fence acknowledgements and
/// notified writes still arrive: its transport threads hand them to the connection, which wakes the progress thread,
/// up to the last moment.
int closeTwoTransportsTogether(int rounds) {
  constexpr size_t kSide = 256 << 10;
  for (int round = 0; round < rounds; ++round) {
    std::vector<unsigned char> buf[2];
    std::unique_ptr<RegisteredMemory> mem[2];
    std::unique_ptr<UrlTransport> t[2];
    std::string url[2];
    for (int i = 0; i < 2; ++i) {
      buf[i].assign(kSide, 0xA5);
      mem[i] = std::make_unique<RegisteredMemory>(buf[i].data(), buf[i].size());
      t[i] = std::make_unique<UrlTransport>(-1, "tcp");
      url[i] = t[i]->bind();
    }
    std::atomic<int> connected{0}, closing{0};
    std::atomic<bool> ok[2] = {{false}, {false}}, met[2] = {{false}, {false}};
    auto side = [&](int me) {
      const int peer = 1 - me;
      t[me]->connect(url[peer]);
      fillRandom(buf[me].data(), kSide / 2, 100 * round + me);  // the half this side writes into the peer's
      if (!meet(connected, "connected")) return;
      const RemoteBuffer remote{buf[peer].data() + kSide / 2, mem[peer]->remoteKey()};
      const bool wrote = t[me]->write(mem[me]->view(0, kSide / 2), remote, true).get() == Status::kOk;
      const bool arrived = t[me]->waitForWrite().get() == Status::kOk;
      std::vector<unsigned char> want(kSide / 2);
      fillRandom(want.data(), want.size(), 100 * round + peer);
      ok[me] = wrote && arrived && firstMismatch(buf[me].data() + kSide / 2, want.data(), want.size()) == -1;
      std::vector<std::future<Status>> inFlight;
      for (int i = 0; i < 8; ++i) inFlight.push_back(t[me]->write(mem[me]->view(0, kSide / 2), remote, true));
      met[me] = meet(closing, "closing");
      t[me].reset();  // the futures are dropped unresolved
    };
    std::thread a(side, 0), b(side, 1);
    a.join();
    b.join();
    CHILD_CHECK(met[0] && met[1]);
    CHILD_CHECK(ok[0] && ok[1]);
  }
  return 0;
}

TEST(P2pUrlTransport, TwoTransportsClosedAtTheSameMomentWithWritesInFlightManyTimesOver) {
  // A close that touches freed memory has been seen to hang rather than crash: the child's time limit catches it.
  EXPECT_EQ(runSolo([] { return closeTwoTransportsTogether(50); }, /*timeoutSec=*/120), 0);
}

/// A key made up from what a peer can learn or guess (the memory's id, address and size) writes nothing: neither in
/// the old form without a secret nor with a wrong secret, into memory whose key was never handed out. The real key
/// of the other memory still works. Guard bytes of both are compared whole.
TEST(P2pUrlTransport, AGuessedKeyWritesNothing) {
  EXPECT_EQ(
      runSolo([] {
        constexpr size_t kSide = 64 << 10;
        std::vector<unsigned char> src(kSide), open(kSide, 0x5A), hidden(kSide, 0x5A), guard(kSide, 0x5A);
        fillRandom(src.data(), src.size(), 601);
        RegisteredMemory srcMem(src.data(), src.size()), openMem(open.data(), open.size()),
            hiddenMem(hidden.data(), hidden.size());
        UrlTransport t[2] = {UrlTransport(-1, "tcp"), UrlTransport(-1, "tcp")};
        const std::string url[2] = {t[0].bind(), t[1].bind()};
        std::thread other([&] { t[1].connect(url[0]); });
        t[0].connect(url[1]);
        other.join();
        char prefix[96];
        std::snprintf(prefix, sizeof prefix, "gdxmem:%u:%llx:%zu", hiddenMem.id(),
                      static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(hidden.data())), kSide);
        for (const std::string& guess :
             {std::string(prefix), std::string(prefix) + ":0", std::string(prefix) + ":123456789abcdef0"}) {
          const Status s = t[0].write(srcMem.view(0, 4096), RemoteBuffer{hidden.data() + 4096, guess}, true).get();
          std::fprintf(stderr, "guessed key '%s': %s\n", guess.c_str(), statusName(s));
          CHILD_CHECK(s == Status::kInvalidArgument);
        }
        CHILD_CHECK(firstMismatch(hidden.data(), guard.data(), kSide) == -1);
        // The key handed out works, and only for its own memory.
        CHILD_CHECK(t[0].write(srcMem.view(0, kSide), RemoteBuffer{open.data(), openMem.remoteKey()}, true).get() ==
                    Status::kOk);
        CHILD_CHECK(firstMismatch(open.data(), src.data(), kSide) == -1);
        CHILD_CHECK(firstMismatch(hidden.data(), guard.data(), kSide) == -1);
        return 0;
      }),
      0);
}

TEST(P2pUrlTransport, SupportedBadUrlsAndNobodyAreClearErrors) {
  EXPECT_TRUE(UrlTransport::supported("tcp"));
  EXPECT_FALSE(UrlTransport::supported("carrier-pigeon"));
  EXPECT_EQ(runSolo([] {
              setenv("GDX_TIMEOUT_MS", "1000", 1);
              UrlTransport t(-1, "tcp");
              CHILD_CHECK(errorCodeOf([&] { t.connect("tcp://127.0.0.1:1"); }) == ErrorCode::kInvalidArgument);
              const std::string url = t.bind();
              CHILD_CHECK(errorCodeOf([&] { t.connect(url); }) == ErrorCode::kInvalidArgument);
              CHILD_CHECK(errorCodeOf([&] { t.connect("verbs://127.0.0.1:5"); }) == ErrorCode::kInvalidArgument);
              CHILD_CHECK(errorCodeOf([&] { t.connect("no-url"); }) == ErrorCode::kInvalidArgument);
              // A URL larger than ours dials: nobody listens there, so it times out by name.
              CHILD_CHECK(errorCodeOf([&] { t.connect("tcp://255.255.255.255:" + std::to_string(freePort())); }) ==
                          ErrorCode::kTimeout);
              CHILD_CHECK(!t.connected());
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace gdx::test
