// A transfer whose source memory the connection no longer knows (its window was deregistered) fails, and takes back
// what it held: an eager send its slot and credits, so that sender and receiver go on agreeing on which slot holds
// what; a large send its announcement (the receive fails, withdrawn); a one-sided write the rest of its pieces. The
// connection stays up and the transfers after it deliver every byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/protocol.hpp"
#include "support/connection_pair.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {
using p2p::MemoryRegion;
using p2p::Piece;
using p2p::RemotePiece;
using p2p::Transfer;

TEST(P2pForgottenRegion, EagerSendFromForgottenRegionTakesItsSlotBack) {
  EXPECT_EQ(runSolo([] {
              ConnectionPair pair;
              std::vector<unsigned char> gone(1024), ok(64 * 1024), in(64 * 1024, 0);
              const MemoryRegion goneR{11, reinterpret_cast<char*>(gone.data()), gone.size(), MemoryKind::kHost};
              const MemoryRegion okR{12, reinterpret_cast<char*>(ok.data()), ok.size(), MemoryKind::kHost};
              const MemoryRegion inR{13, reinterpret_cast<char*>(in.data()), in.size(), MemoryKind::kHost};
              fillRandom(ok.data(), ok.size(), 77);
              // The eager buffer's key first, so the failing send gets as far as its write.
              {
                auto r = transfer("warm recv", 1), s = transfer("warm send", 1);
                pair.conn[1]->recv(r, {Piece{inR, 0, 100}});
                pair.conn[0]->send(s, {Piece{okR, 0, 100}});
                std::string why;
                CHILD_CHECK(outcome(s, &why) == ErrorCode::kOk && outcome(r, &why) == ErrorCode::kOk);
              }
              std::vector<uint32_t> g{11};
              pair.conn[0]->forgetWindows(g);
              auto bad = transfer("send from forgotten", 1);
              pair.conn[0]->send(bad, {Piece{goneR, 0, 500}});
              std::string why;
              const ErrorCode code = outcome(bad, &why);
              std::fprintf(stderr, "forgotten send: %s (%s)\n", errorCodeName(code), why.c_str());
              CHILD_CHECK(code != ErrorCode::kOk);
              usleep(50000);  // the withdrawal reaches the receiver before its next receive
              for (int i = 0; i < 80; ++i) {
                const size_t bytes = 1 + (i * 37) % 4096;
                const size_t at = (i * 512) % (ok.size() - 4096);
                auto r = transfer("recv", 1), s = transfer("send", 1);
                pair.conn[1]->recv(r, {Piece{inR, 0, 4096}});
                pair.conn[0]->send(s, {Piece{okR, at, bytes}});
                CHILD_CHECK(outcome(s, &why) == ErrorCode::kOk);
                CHILD_CHECK(outcome(r, &why) == ErrorCode::kOk);
                CHILD_CHECK(std::memcmp(in.data(), ok.data() + at, bytes) == 0);
              }
              return 0;
            }),
            0);
}

TEST(P2pForgottenRegion, LargeSendAndOneSidedWriteFromForgottenRegionFailAndLaterOnesWork) {
  EXPECT_EQ(runSolo([] {
              ConnectionPair pair;
              constexpr size_t kBig = 64 * 1024;
              std::vector<unsigned char> gone(kBig), ok(kBig), in(kBig, 0), target(kBig, 0);
              const MemoryRegion goneR{21, reinterpret_cast<char*>(gone.data()), gone.size(), MemoryKind::kHost};
              const MemoryRegion okR{22, reinterpret_cast<char*>(ok.data()), ok.size(), MemoryKind::kHost};
              const MemoryRegion inR{23, reinterpret_cast<char*>(in.data()), in.size(), MemoryKind::kHost};
              const MemoryRegion targetR{24, reinterpret_cast<char*>(target.data()), target.size(), MemoryKind::kHost};
              fillRandom(ok.data(), ok.size(), 78);
              std::vector<uint32_t> g{21};
              pair.conn[0]->forgetWindows(g);
              std::string why;
              // Large send from a forgotten region: its receive fails (withdrawn), the next pair works.
              auto r1 = transfer("recv1", 1), s1 = transfer("send1", 1);
              pair.conn[1]->recv(r1, {Piece{inR, 0, kBig}});
              pair.conn[0]->send(s1, {Piece{goneR, 0, kBig}});
              ErrorCode c1 = outcome(s1, &why);
              std::fprintf(stderr, "large send: %s (%s)\n", errorCodeName(c1), why.c_str());
              ErrorCode c2 = outcome(r1, &why);
              std::fprintf(stderr, "its recv: %s (%s)\n", errorCodeName(c2), why.c_str());
              CHILD_CHECK(c1 != ErrorCode::kOk && c2 != ErrorCode::kOk);
              auto r2 = transfer("recv2", 1), s2 = transfer("send2", 1);
              pair.conn[1]->recv(r2, {Piece{inR, 0, kBig}});
              pair.conn[0]->send(s2, {Piece{okR, 0, kBig}});
              CHILD_CHECK(outcome(s2, &why) == ErrorCode::kOk && outcome(r2, &why) == ErrorCode::kOk);
              CHILD_CHECK(std::memcmp(in.data(), ok.data(), kBig) == 0);
              // One-sided: two pieces, the second from the forgotten region.
              const uint32_t w = pair.conn[1]->advertise(targetR, 0, kBig);
              auto wr = transfer("write", 3);
              pair.conn[0]->write(wr, {Piece{okR, 0, 4096}, Piece{goneR, 0, 4096}},
                                  {RemotePiece{w, 0, 4096}, RemotePiece{w, 8192, 4096}}, false);
              ErrorCode c3 = outcome(wr, &why);
              std::fprintf(stderr, "write: %s (%s)\n", errorCodeName(c3), why.c_str());
              CHILD_CHECK(c3 != ErrorCode::kOk);
              auto wr2 = transfer("write2", 2);
              pair.conn[0]->write(wr2, {Piece{okR, 100, 4096}}, {RemotePiece{w, 16384, 4096}}, false);
              CHILD_CHECK(outcome(wr2, &why) == ErrorCode::kOk);
              CHILD_CHECK(std::memcmp(target.data() + 16384, ok.data() + 100, 4096) == 0);
              CHILD_CHECK(pair.conn[0]->failure().empty() && pair.conn[1]->failure().empty());
              return 0;
            }),
            0);
}
}  // namespace
}  // namespace gdx::test
