// What a peer may reach of this side's memory over a p2p connection: only the range it was given, and only while it
// is given. A receive lets the peer write exactly its range until the data arrived; a read's destination exactly the
// range read until it is done; the eager buffer is never readable. Each refused access fails the side that asked,
// with the reason, and changes no byte: the regions carry guard bytes that are compared whole afterwards. Two
// connections of one process over loopback TCP (ConnectionPair), which can name any window as a forged peer would.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/protocol.hpp"
#include "support/connection_pair.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::MemoryRegion;
using p2p::Piece;
using p2p::RemotePiece;
using p2p::Transfer;

constexpr unsigned char kGuard = 0x5A;
constexpr size_t kRegion = 256 << 10;

/// A write of `bytes` random bytes from `from` into `window` at `offset` that must be refused: the writer's error,
/// and nothing of it in `region` (which must still equal `expect`).
bool writeIsRefused(ConnectionPair& pair, const MemoryRegion& from, uint32_t window, uint64_t offset, size_t bytes,
                    const std::vector<unsigned char>& region, const std::vector<unsigned char>& expect) {
  fillRandom(from.base, bytes, 1234 + window);
  auto t = transfer("forged write", 2);
  pair.conn[0]->write(t, {Piece{from, 0, bytes}}, {RemotePiece{window, offset, bytes}}, false);
  std::string why;
  const ErrorCode code = outcome(t, &why);
  const long long bad = firstMismatch(region.data(), expect.data(), region.size());
  std::fprintf(stderr, "write of %zu bytes into window %u at %llu: %s (%s); first changed byte: %lld\n", bytes, window,
               static_cast<unsigned long long>(offset), errorCodeName(code), why.c_str(), bad);
  return code != ErrorCode::kOk && bad == -1;
}

TEST(P2pGrants, AReceiveLetsThePeerWriteOnlyItsRangeAndOnlyUntilItsDataArrived) {
  EXPECT_EQ(runSolo([] {
              ConnectionPair pair;
              constexpr size_t kOffset = 64 << 10, kBytes = 64 << 10;
              std::vector<unsigned char> src(kRegion), dst(kRegion, kGuard);
              const MemoryRegion from{1, reinterpret_cast<char*>(src.data()), kRegion, MemoryKind::kHost};
              const MemoryRegion into{7, reinterpret_cast<char*>(dst.data()), kRegion, MemoryKind::kHost};
              fillRandom(src.data(), kBytes, 501);
              auto r = transfer("receive", 1);
              auto s = transfer("send", 1);
              pair.conn[1]->recv(r, {Piece{into, kOffset, kBytes}});
              pair.conn[0]->send(s, {Piece{from, 0, kBytes}});
              std::string why;
              CHILD_CHECK(outcome(s, &why) == ErrorCode::kOk);
              CHILD_CHECK(outcome(r, &why) == ErrorCode::kOk);
              std::vector<unsigned char> expect(kRegion, kGuard);
              std::memcpy(expect.data() + kOffset, src.data(), kBytes);
              CHILD_CHECK(firstMismatch(dst.data(), expect.data(), kRegion) == -1);
              CHILD_CHECK(pair.conn[1]->grantsOpen() == 0);
              // The region itself (window 7), past the received range: never given to the peer.
              CHILD_CHECK(writeIsRefused(pair, from, 7, 128 << 10, 4096, dst, expect));
              CHILD_CHECK(writeIsRefused(pair, from, 7, 0, 4096, dst, expect));
              // The receive's own window (the first grant), after its data arrived: revoked. The transport refuses
              // the write and the connection fails, so this comes last.
              CHILD_CHECK(writeIsRefused(pair, from, p2p::kGrantWindowBase, 0, 4096, dst, expect));
              return 0;
            }),
            0);
}

TEST(P2pGrants, AReadsDestinationIsWritableOnlyForThatRangeAndTheEagerBufferIsNeverRead) {
  EXPECT_EQ(
      runSolo([] {
        ConnectionPair pair;
        constexpr size_t kBytes = 8192;
        std::vector<unsigned char> owned(kRegion), got(kRegion, kGuard), small(64);
        fillRandom(owned.data(), owned.size(), 502);
        const MemoryRegion source{3, reinterpret_cast<char*>(owned.data()), kRegion, MemoryKind::kHost};
        const MemoryRegion into{9, reinterpret_cast<char*>(got.data()), kRegion, MemoryKind::kHost};
        const uint32_t window = pair.conn[1]->advertise(source, 0, kRegion);
        // conn[0] reads 8 KiB of conn[1]'s advertised range into the middle of its region.
        auto rd = transfer("read", 1);
        pair.conn[0]->read(rd, {Piece{into, 4096, kBytes}}, {RemotePiece{window, 1000, kBytes}});
        std::string why;
        CHILD_CHECK(outcome(rd, &why) == ErrorCode::kOk);
        std::vector<unsigned char> expect(kRegion, kGuard);
        std::memcpy(expect.data() + 4096, owned.data() + 1000, kBytes);
        CHILD_CHECK(firstMismatch(got.data(), expect.data(), kRegion) == -1);
        CHILD_CHECK(pair.conn[0]->grantsOpen() == 0);
        // A small send fills conn[0]'s eager buffer once: conn[1] must not read it back.
        fillRandom(small.data(), small.size(), 503);
        const MemoryRegion smallRegion{4, reinterpret_cast<char*>(small.data()), small.size(), MemoryKind::kHost};
        std::vector<unsigned char> smallIn(small.size(), kGuard);
        const MemoryRegion smallInto{10, reinterpret_cast<char*>(smallIn.data()), smallIn.size(), MemoryKind::kHost};
        auto r = transfer("receive", 1), s = transfer("send", 1);
        pair.conn[0]->recv(r, {Piece{smallInto, 0, small.size()}});
        pair.conn[1]->send(s, {Piece{smallRegion, 0, small.size()}});
        CHILD_CHECK(outcome(s, &why) == ErrorCode::kOk && outcome(r, &why) == ErrorCode::kOk);
        CHILD_CHECK(firstMismatch(smallIn.data(), small.data(), small.size()) == -1);
        std::vector<unsigned char> peek(4096, kGuard), peekExpect(4096, kGuard);
        const MemoryRegion peekRegion{5, reinterpret_cast<char*>(peek.data()), peek.size(), MemoryKind::kHost};
        auto eager = transfer("read of the eager buffer", 1);
        pair.conn[1]->read(eager, {Piece{peekRegion, 0, peek.size()}}, {RemotePiece{p2p::kEagerWindow, 0, 4096}});
        const ErrorCode code = outcome(eager, &why);
        std::fprintf(stderr, "read of the eager buffer: %s (%s)\n", errorCodeName(code), why.c_str());
        CHILD_CHECK(code == ErrorCode::kInvalidArgument);
        CHILD_CHECK(firstMismatch(peek.data(), peekExpect.data(), peek.size()) == -1);
        // conn[1] writes into conn[0]'s read destination (window 9) after the read: never given.
        std::vector<unsigned char> scratch(4096);
        const MemoryRegion scratchRegion{6, reinterpret_cast<char*>(scratch.data()), scratch.size(), MemoryKind::kHost};
        fillRandom(scratch.data(), scratch.size(), 504);
        auto w = transfer("forged write", 2);
        pair.conn[1]->write(w, {Piece{scratchRegion, 0, 4096}}, {RemotePiece{9, 64 << 10, 4096}}, false);
        const ErrorCode wrote = outcome(w, &why);
        std::fprintf(stderr, "write into the read destination's region: %s (%s)\n", errorCodeName(wrote), why.c_str());
        CHILD_CHECK(wrote != ErrorCode::kOk);
        CHILD_CHECK(firstMismatch(got.data(), expect.data(), kRegion) == -1);
        return 0;
      }),
      0);
}

TEST(P2pGrants, AWriteIntoTheEagerBufferWithoutItsImmediateIsRefusedAndNoReceiveReturnsIt) {
  EXPECT_EQ(
      runSolo([] {
        ConnectionPair pair;
        constexpr size_t kBytes = 64;
        std::vector<unsigned char> sent(kBytes), forged(kBytes), got(kBytes, kGuard);
        fillRandom(sent.data(), kBytes, 505);
        fillRandom(forged.data(), kBytes, 506);
        const MemoryRegion sentRegion{1, reinterpret_cast<char*>(sent.data()), kBytes, MemoryKind::kHost};
        const MemoryRegion forgedRegion{2, reinterpret_cast<char*>(forged.data()), kBytes, MemoryKind::kHost};
        const MemoryRegion into{3, reinterpret_cast<char*>(got.data()), kBytes, MemoryKind::kHost};
        // A small send lands in slot 0 of conn[1]'s eager buffer before its receive is posted ...
        auto s = transfer("send", 1);
        pair.conn[0]->send(s, {Piece{sentRegion, 0, kBytes}});
        usleep(200 * 1000);
        // ... and a plain write (no immediate) over that slot must not replace it.
        auto w = transfer("forged write into the eager buffer", 2);
        pair.conn[0]->write(w, {Piece{forgedRegion, 0, kBytes}}, {RemotePiece{p2p::kEagerWindow, 0, kBytes}}, false);
        std::string why;
        const ErrorCode wrote = outcome(w, &why);
        std::fprintf(stderr, "write into the eager buffer: %s (%s)\n", errorCodeName(wrote), why.c_str());
        CHILD_CHECK(wrote != ErrorCode::kOk);
        auto r = transfer("receive", 1);
        pair.conn[1]->recv(r, {Piece{into, 0, kBytes}});
        const ErrorCode received = outcome(r, &why);
        const bool forgedSeen = firstMismatch(got.data(), forged.data(), kBytes) == -1;
        std::fprintf(stderr, "the receive after it: %s (%s), forged bytes returned: %d\n", errorCodeName(received),
                     why.c_str(), forgedSeen);
        CHILD_CHECK(!forgedSeen);
        CHILD_CHECK(received != ErrorCode::kOk || firstMismatch(got.data(), sent.data(), kBytes) == -1);
        return 0;
      }),
      0);
}

TEST(P2pGrants, AUrlTransportSourceIsNotWritableWithoutItsKeysSecret) {
  EXPECT_EQ(runSolo([] {
              ConnectionPair pair;
              constexpr size_t kBytes = 64 << 10;
              std::vector<unsigned char> src(kBytes), got(kBytes, kGuard), forged(kBytes);
              fillRandom(src.data(), kBytes, 507);
              fillRandom(forged.data(), kBytes, 508);
              const std::vector<unsigned char> before = src;
              // conn[1] resolves windows as the URL transport does (its memory, for the key's secret); no key of it is
              // ever handed out here, so no secret can be presented.
              pair.conn[1]->setResolver([](uint32_t, uint64_t, MemoryRegion*) { return false; });
              const MemoryRegion source{7, reinterpret_cast<char*>(src.data()), kBytes, MemoryKind::kHost};
              const MemoryRegion into{3, reinterpret_cast<char*>(got.data()), kBytes, MemoryKind::kHost};
              auto r = transfer("receive", 1);
              pair.conn[0]->recv(r, {Piece{into, 0, kBytes}});
              auto s = transfer("send", 1);
              pair.conn[1]->send(s, {Piece{source, 0, kBytes}});  // registers window 7 on conn[1] as a source
              std::string why;
              CHILD_CHECK(outcome(s, &why) == ErrorCode::kOk && outcome(r, &why) == ErrorCode::kOk);
              CHILD_CHECK(firstMismatch(got.data(), src.data(), kBytes) == -1);
              // A forged peer writes window 7 straight through conn[0]'s transport, with the TCP key it can guess
              // (window ids are small numbers, the key names only the id and the size).
              Transport& forger = *pair.raw[0];
              forger.registerWindow(0x7000, forged.data(), kBytes, MemoryKind::kHost);
              forger.addRemoteWindow(1, 7, kBytes, "tcp:7:" + std::to_string(kBytes));
              forger.lane(0).post(WriteOp{1, 0x7000, 0, 7, 0, kBytes, false, 0, 0});
              const bool refused =
                  waitFor([&] { return !pair.conn[0]->failure().empty() || !pair.conn[1]->failure().empty(); }, 5000);
              std::fprintf(stderr, "forged write into the source: %s; conn[1]: %s\n",
                           refused ? "refused" : "not refused", pair.conn[1]->failure().c_str());
              CHILD_CHECK(refused);
              CHILD_CHECK(firstMismatch(src.data(), before.data(), kBytes) == -1);
              return 0;
            }),
            0);
}

}  // namespace
}  // namespace gdx::test
