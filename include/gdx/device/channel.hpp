// ChannelDeviceHandle: what a CUDA kernel receives (by value) to issue one-sided operations to one peer.
// Two paths, chosen per peer when the Context is set up (and logged at GDX_LOG_LEVEL=INFO):
//  * proxy path: every operation is a command enqueued on a command ring that a proxy thread drains; see
//    ring_device.hpp for the ring protocol and proxy.hpp for what the proxy does with each command.
//  * direct path (a peer GPU of the same host that this GPU can address, `direct` set): put / putWithSignal /
//    signal / atomicAdd between GPU-addressable windows are done by the calling threads themselves, with SM
//    loads and stores into the peer's IPC-mapped window and system-scope release atomics on the peer's device
//    signal array (direct_device.hpp). A put whose source or destination window is not on the direct path
//    (a host window that CUDA cannot address, a host window on the peer) still goes through the proxy.
//    Direct-path operations are complete when the call returns (flush() has nothing to wait for); a range
//    outside the window returns kInvalidArgument at once instead of a later kProxyError. The single-thread
//    forms copy with one thread, 8 loads of 16 bytes in flight (when source and destination agree modulo 16):
//    about one microsecond per KiB; anything past a few KiB belongs to the warp (…Warp) or block (…Block) forms,
//    which move 32 or blockDim times as much per round trip.
//    A kernel that puts between the same two windows many times binds them once, bind(dstWindow, srcWindow) ->
//    BoundWindows, and passes that to the put forms: on the direct path a put then loads nothing from the table.
//    Ordering between direct-path operations and proxied operations to the same peer is not guaranteed:
//    announce data with a signal of the path that carried it.
// Relayed handles (Context::deviceRelayChannel): `peer` is a relay on the destination's host and `forwardTo` the
// destination; every put travels as a pair whose signal slot names the destination, the relay forwards data and
// signals there in order (channel.hpp). atomicAdd returns kInvalidArgument on them.
// wait(id, v) returns when either this rank's host-mapped signal (updated by proxied peers) or its device
// signal (updated by direct-path peers) reaches v: let each signal id be updated by peers of one kind.
//
// Status, not hangs: every call returns a Status. Enqueueing waits only when the ring is full; wait() and
// flush() wait for the peer or the proxy. All of them are bounded by `ring.timeoutNs` (GDX_TIMEOUT_MS). Errors are
// per peer and per command, nothing traps:
//  * A failed peer (its connection broke, it died) sets that peer's failure word: wait() and flush() of handles to
//    it return kPeerFailed at once; handles to other peers, even on the same ring, go on.
//  * A command the proxy refuses (a window or offset it does not know) fails alone: the flush() of this copy of the
//    handle that covers it returns kProxyError (also when another command to the same peer on the same ring failed
//    after it, see ring_device.hpp), and later commands and flushes work. The proxy's message says which command.
//  * Only what breaks the ring itself (its proxy thread stopped, a producer left a hole) ends every wait on it.
//
// Ordering guarantees:
//  * Before a put's command is published, the producing thread's earlier writes (the data it puts) are made
//    visible at system scope, so the proxy and the transport read what the kernel wrote.
//  * A signal update sent by putWithSignal / signal becomes visible at the receiver only after the data of
//    that put and of every earlier operation on the same ring to the same peer is in place.
//  * When wait(id, v) returns kOk the signal had reached v with acquire semantics at system scope: the data
//    whose arrival the signal announced is visible to the waiting thread. Other threads of the block see it
//    after a __syncthreads() (or another fence/barrier) following the wait.
//  * flush() returning kOk means every operation this thread (this copy of the handle) enqueued so far
//    completed at the source: its source memory may be overwritten. It says nothing about the remote side;
//    use a signal for that.
// Many producers: commands from one ring are taken out in ring order by one proxy thread, so a kernel that issues
// commands from many blocks should spread its warps over the device rings, e.g. warp w on
// Context::deviceChannel(peer, w % Context::numDeviceRings()); the guarantees above hold per ring, so a signal
// must go on the ring of the puts it announces. Consecutive puts on a ring whose source and destination ranges
// continue each other are sent as one transport write.
// Warp-cooperative forms (…Warp) are called by every lane of a converged warp with the same arguments; one
// elected lane enqueues and the others return kOk at once, so the warp need not wait for the ring (the elected
// lane's return value is the enqueue status; flushWarp gives every lane the leader's command errors, waitWarp the
// peer's failure).
// Lanes are numbered by %laneid, so any block shape works.
// Registers: a kernel that calls the put forms takes 72 to 128 registers a thread on sm_90 when the compiler is free
// to choose (gdx's test and benchmark kernels), all that a block of 512 threads may have and twice what one of 1024
// may (64). A kernel of more than 256 threads should declare __launch_bounds__(threads): without it the launch can
// fail with cudaErrorLaunchOutOfResources, which only cudaGetLastError() after the launch reports (the kernel never
// runs, and its peer's waits time out).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/copy.hpp"
#include "gdx/device/impl/direct.hpp"
#include "gdx/device/impl/put_commands.hpp"
#include "gdx/device/impl/ring.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/status.hpp"

namespace gdx {

/// A destination window of the peer and a source window of this rank, resolved once for a run of puts
/// (ChannelDeviceHandle::bind), as MSCCL++'s memory channels bind their memory when they are made. On the direct
/// path it holds both windows' addresses and lengths, so a put that takes it loads nothing from the DirectPeer table:
/// after a wait's acquire those loads are an L2 round trip of their own on every put (about 0.5 us of an 8-byte
/// put+signal's 3.0 us one way on H100). Elsewhere (`dst` null) the puts go through the proxy with the window ids.
/// Made in device code, by the handle that uses it: bind() is a device function (an address table read on the host
/// would be the host's view, and a pair left unresolved would send every put through the proxy, where a direct-path
/// signal could overtake it), and a BoundWindows of one handle names that handle's peer's memory, not another's.
/// Valid while both windows stay registered, like the handle itself.
struct BoundWindows {
  uint32_t dstWindow = 0, srcWindow = 0;
  char* dst = nullptr;        ///< the peer's window dstWindow mapped here (direct path); null: through the proxy
  const char* src = nullptr;  ///< this rank's window srcWindow as kernels address it
  uint64_t dstBytes = 0, srcBytes = 0;
};
static_assert(std::is_trivially_copyable<BoundWindows>::value, "kept in registers and passed by value");

struct ChannelDeviceHandle {
  RingDeviceHandle ring;
  uint64_t* signals;  ///< this rank's signal array as the GPU sees it
  uint32_t* failure;  ///< `peer`'s failure word (a Status), kOk while it is healthy
  uint32_t numSignals;
  uint32_t peer;
  uint64_t lastPosition;     ///< highest ring position this copy of the handle used; ~0: none
  const DirectPeer* direct;  ///< device table of the direct path to `peer`; null: every operation is proxied
  uint64_t* deviceSignals;   ///< this rank's device signal array (direct-path updates land here); may be null
  int32_t forwardTo;         ///< relayed handle: the destination rank (`peer` is the relay); -1: not relayed
  /// First ring position this copy used since its last flush (~0: none); flush() checks faults from there on.
  mutable uint64_t flushFrom = ~uint64_t{0};
  /// The peer's device signal array mapped here and its length (DirectPeer::peerSignals), used while `direct` is set:
  /// in the handle (a kernel parameter or registers) a direct-path signal needs no load from the table.
  uint64_t* directSignals = nullptr;
  uint32_t directNumSignals = 0;

#if defined(__CUDACC__)
  /// A field of the DirectPeer table through the read-only data cache. The Context writes the table before the
  /// kernels that use an entry start (setup, window registration) and never while one runs, so the cache cannot be
  /// stale. Volatile, so that the compiler issues each load where it is written: the callers load every field they
  /// need before checking any, and a non-volatile load may be sunk past the first check, which makes the loads one
  /// L2 round trip after another (after a wait's acquire, L1 holds none of them).
  template <typename T>
  GDX_DEVICE_INLINE static T tableField(const T* p) {
    static_assert(sizeof(T) == 8 || sizeof(T) == 4, "DirectPeer fields are pointers and integers");
    T out;
    if constexpr (sizeof(T) == 8) {
      unsigned long long v;
      asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(v) : "l"(p));
      memcpy(&out, &v, 8);
    } else {
      unsigned v;
      asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
      memcpy(&out, &v, 4);
    }
    return out;
  }
  /// Where a direct-path put (and its signal) goes. Every field of the DirectPeer table it needs is loaded before any
  /// of them is looked at: the loads are independent and share one round trip to L2 (after a wait's acquire L1 holds
  /// none of them), where checking each before loading the next cost a round trip each.
  struct DirectRoute {
    char* dst;
    const char* src;
    uint64_t* signal;  ///< the peer's signal word; null without a signal
    int path;          ///< 1: direct, 0: through the proxy, -1: the range lies outside a direct-path window
  };
  GDX_DEVICE_INLINE DirectRoute directRoute(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                            uint64_t bytes, bool withSignal, uint32_t signalId) const {
    if (!direct || !w.dst || !w.src) return DirectRoute{nullptr, nullptr, nullptr, 0};
    const uint64_t dn = w.dstBytes, sn = w.srcBytes;
    if (dstOffset > dn || bytes > dn - dstOffset || srcOffset > sn || bytes > sn - srcOffset)
      return DirectRoute{nullptr, nullptr, nullptr, -1};
    uint64_t* signal = withSignal ? directSignalWord(signalId) : nullptr;
    if (withSignal && !signal) return DirectRoute{nullptr, nullptr, nullptr, 0};
    return DirectRoute{w.dst + dstOffset, w.src + srcOffset, signal, 1};
  }
  /// The peer's signal word on the direct path; null when the signal goes through the proxy.
  GDX_DEVICE_INLINE uint64_t* directSignalWord(uint32_t signalId) const {
    return direct && directSignals && signalId < directNumSignals ? directSignals + signalId : nullptr;
  }
  /// Release at system scope: the data this thread wrote (and what it saw through a barrier) is visible first.
  GDX_DEVICE_INLINE static void directSignal(uint64_t* w, uint64_t value, SignalOp op) {
    if (op == SignalOp::kAdd)
      atomicFetchAdd(w, value, kRelease);
    else
      atomicStore(w, value, kRelease);
  }
#endif

#if defined(__CUDACC__)
  /// The windows `dstWindow` (the peer's) and `srcWindow` (this rank's) resolved for the puts that take a
  /// BoundWindows: on the direct path the four DirectPeer fields are loaded here, together, once.
  GDX_DEVICE_INLINE BoundWindows bind(uint32_t dstWindow, uint32_t srcWindow) const {
    BoundWindows w{dstWindow, srcWindow};
    if (direct && dstWindow < kMaxWindows && srcWindow < kMaxWindows) {
      // Taken as they are: directRoute sends a pair with a null address through the proxy.
      w.dst = tableField(&direct->peerBase[dstWindow]);
      w.src = tableField(&direct->localBase[srcWindow]);
      w.dstBytes = tableField(&direct->peerBytes[dstWindow]);
      w.srcBytes = tableField(&direct->localBytes[srcWindow]);
    }
    return w;
  }
#endif
  /// The window-id forms' pair: bound on the device; on the host (the proxy path only) the ids alone.
  GDX_HOST_DEVICE_INLINE BoundWindows windowPair(uint32_t dstWindow, uint32_t srcWindow) const {
#if GDX_DEVICE_COMPILE
    return bind(dstWindow, srcWindow);
#else
    return BoundWindows{dstWindow, srcWindow};
#endif
  }

  GDX_HOST_DEVICE_INLINE Status enqueue(const Command& c) {
    uint64_t pos;
    Status s = ring.push(c, &pos);
    if (s == Status::kOk) {
      lastPosition = pos;
      if (flushFrom == ~uint64_t{0}) flushFrom = pos;
    }
    return s;
  }

  /// True when [offset, offset + bytes) can be named in a command (the proxy checks it against the window).
  GDX_HOST_DEVICE_INLINE static bool addressable(uint64_t offset, uint64_t bytes) {
    return offset <= kMaxWindowOffset && (bytes == 0 || bytes - 1 <= kMaxWindowOffset - offset);
  }

  /// Copies `bytes` from local window `srcWindow` at `srcOffset` to window `dstWindow` of the peer at
  /// `dstOffset`. Larger than kMaxCommandBytes: several commands. Zero bytes: nothing to do.
  GDX_HOST_DEVICE_INLINE Status put(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                    uint64_t bytes) {
    return put(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes);
  }
  /// put() between windows bound once (bind): no table load on the direct path.
  GDX_HOST_DEVICE_INLINE Status put(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    if (w.dstWindow >= kMaxUserWindows || w.srcWindow >= kMaxUserWindows || !addressable(dstOffset, bytes) ||
        !addressable(srcOffset, bytes))
      return Status::kInvalidArgument;
#if GDX_DEVICE_COMPILE
    {
      const DirectRoute r = directRoute(w, dstOffset, srcOffset, bytes, false, 0);
      if (r.path < 0) return Status::kInvalidArgument;
      if (r.path > 0) {
        copySingleThread(r.dst, r.src, bytes);
        return Status::kOk;
      }
    }
#endif
    return enqueuePut(w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, nullptr);
  }

  /// Proxy-path commands of a put (put_commands.hpp), with `signal` on the last piece when given.
  GDX_HOST_DEVICE_INLINE Status enqueuePut(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                           uint64_t srcOffset, uint64_t bytes, const SignalUpdateArgs* signal) {
    const PutTarget target{peer, forwardTo, dstWindow, dstOffset, srcWindow, srcOffset};
    return pushPutCommands(ring, target, bytes, signal, &lastPosition, &flushFrom);
  }

  /// The proxy path of put (withSignal false) and putWithSignal, for the cooperative forms once their direct path
  /// declined: the same checks and commands as put() / putWithSignal() without their single-thread copy, whose
  /// registers would otherwise be reserved in every kernel that uses a warp or block form.
  GDX_HOST_DEVICE_INLINE Status proxyPut(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                         uint64_t bytes, bool withSignal, uint32_t signalId, uint64_t value,
                                         SignalOp op) {
    if (dstWindow >= kMaxUserWindows || srcWindow >= kMaxUserWindows || signalId >= kMaxSignals ||
        !addressable(dstOffset, bytes) || !addressable(srcOffset, bytes))
      return Status::kInvalidArgument;
    if (!withSignal) return enqueuePut(dstWindow, dstOffset, srcWindow, srcOffset, bytes, nullptr);
    if (bytes == 0) return signal(signalId, value, op);
    const SignalUpdateArgs update{signalId, value, op};
    return enqueuePut(dstWindow, dstOffset, srcWindow, srcOffset, bytes, &update);
  }

  /// put(), then `op` on the peer's signal `signalId` once the data is in place there. Zero bytes: only the
  /// signal (a MoE sender still tells an expert that no tokens are coming).
  GDX_HOST_DEVICE_INLINE Status putWithSignal(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                              uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return putWithSignal(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes, signalId, value, op);
  }
  /// putWithSignal() between windows bound once (bind): no table load on the direct path.
  GDX_HOST_DEVICE_INLINE Status putWithSignal(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                              uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    if (w.dstWindow >= kMaxUserWindows || w.srcWindow >= kMaxUserWindows || signalId >= kMaxSignals ||
        !addressable(dstOffset, bytes) || !addressable(srcOffset, bytes))
      return Status::kInvalidArgument;
    if (bytes == 0) return signal(signalId, value, op);
#if GDX_DEVICE_COMPILE
    {
      const DirectRoute r = directRoute(w, dstOffset, srcOffset, bytes, true, signalId);
      if (r.path < 0) return Status::kInvalidArgument;
      if (r.path > 0) {
        copySingleThread(r.dst, r.src, bytes);
        directSignal(r.signal, value, op);
        return Status::kOk;
      }
    }
#endif
    const SignalUpdateArgs update{signalId, value, op};
    return enqueuePut(w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, &update);
  }

  /// Sets or adds to the peer's signal `signalId`, after every earlier operation of this ring to the peer.
  GDX_HOST_DEVICE_INLINE Status signal(uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd) {
    if (signalId >= kMaxSignals) return Status::kInvalidArgument;
#if GDX_DEVICE_COMPILE
    if (uint64_t* w = directSignalWord(signalId)) {
      directSignal(w, value, op);
      return Status::kOk;
    }
#endif
    return enqueue(Command::signal(peer, signalId, value, op, forwardTo));
  }

  /// Atomically adds `value` to the 64-bit word at `dstOffset` (8-byte aligned) of the peer's `dstWindow`.
  GDX_HOST_DEVICE_INLINE Status atomicAdd(uint32_t dstWindow, uint64_t dstOffset, uint64_t value) {
    if (dstWindow >= kMaxUserWindows || dstOffset % 8 != 0 || !addressable(dstOffset, 8) || forwardTo >= 0)
      return Status::kInvalidArgument;
#if GDX_DEVICE_COMPILE
    char* base = direct ? tableField(&direct->peerBase[dstWindow]) : nullptr;
    const uint64_t limit = direct ? tableField(&direct->peerBytes[dstWindow]) : 0;  // loaded beside base, not after
    if (base) {
      if (dstOffset + 8 > limit) return Status::kInvalidArgument;
      atomicFetchAdd(reinterpret_cast<uint64_t*>(base + dstOffset), value, kRelaxed);
      return Status::kOk;
    }
#endif
    return enqueue(Command::atomicAdd(peer, dstWindow, dstOffset, value));
  }

  /// Waits until this rank's signal `signalId` >= `value` (bounded; see the header comment).
  GDX_HOST_DEVICE_INLINE Status wait(uint32_t signalId, uint64_t value) const {
    if (signalId >= numSignals) return Status::kInvalidArgument;
    // A direct-path handle polls its device word (local memory) on every try and host memory (the host signal,
    // the error words: PCIe round trips) on every 32nd only, so the poll of the word the peer raises is rarely
    // stuck behind a PCIe read; a proxied handle polls the host word on every try and the error words on every
    // 16th. The error words are loaded before the signals' acquire loads (which hold back later loads), so all the
    // PCIe reads of a try overlap.
    const bool directWait = direct && deviceSignals;
    const uint64_t every = directWait ? 31 : 15;
    uint64_t start = 0;
    for (uint64_t spins = 0;; ++spins) {
      const bool check = (spins & every) == every;
      uint32_t f = 0, e = 0;
      if (check) {
        f = atomicLoad(failure, kRelaxed);
        e = atomicLoad(ring.error, kRelaxed);
      }
      // Acquire loads, not relaxed loads and a fence: a system-scope fence costs more than the whole poll of the
      // local device word.
      const bool pollHost = !directWait || check;
      const bool pollDevice = deviceSignals && (direct || (spins & 7) == 7);
      const uint64_t h = pollHost ? atomicLoad(&signals[signalId], kAcquire) : 0;
      const uint64_t d = pollDevice ? atomicLoad(&deviceSignals[signalId], kAcquire) : 0;
      if (h >= value || d >= value) return Status::kOk;
      if (check) {
        if (f != 0) return static_cast<Status>(f);
        if (e != 0) return static_cast<Status>(e);
        uint64_t now = nowNs();
        if (start == 0) start = now;
        if (now - start > ring.timeoutNs) return Status::kTimeout;
      }
      // The local device word is cheap to poll: a direct wait spins without sleeping for its first few hundred
      // tries (tens of microseconds), which is what a signal's latency depends on.
      if (!directWait || spins > 256) spinPause(spins);
    }
  }

  /// Waits until every operation this handle enqueued completed at the source (bounded); kProxyError or the
  /// transport's status when one of them (since this copy's last flush) was refused or failed, kPeerFailed at once
  /// when the peer failed. Each failure is reported by one flush of the copy: the next flush looks at later commands.
  GDX_HOST_DEVICE_INLINE Status flush() const {
    if (lastPosition == ~uint64_t{0} || flushFrom == ~uint64_t{0}) return Status::kOk;
    const Status s = ring.waitCompleted(lastPosition, flushFrom, peer, failure);
    if (s != Status::kTimeout) flushFrom = ~uint64_t{0};
    return s;
  }

  /// Current value of this rank's signal `signalId`.
  GDX_HOST_DEVICE_INLINE uint64_t signalValue(uint32_t signalId) const {
    uint64_t h = atomicLoad(&signals[signalId], kAcquire);
    uint64_t d = deviceSignals ? atomicLoad(&deviceSignals[signalId], kAcquire) : 0;
    return h > d ? h : d;
  }

#if defined(__CUDACC__)
  /// The lowest active lane of the calling threads; it enqueues for the warp.
  GDX_DEVICE_INLINE static unsigned leaderLane(unsigned mask) {
    return __ffs(mask) - 1;
  }
  /// Runs `op` on the leader lane only. The other lanes do not wait for it and get kOk: the leader's return
  /// value is the enqueue status, and a failure the proxy finds later reaches every lane through flushWarp (the
  /// worst of the lanes' flushes: the leader's reports it).
  template <typename Op>
  GDX_DEVICE_INLINE static Status onLeader(Op&& op) {
    const unsigned mask = __activemask();
    __syncwarp(mask);  // the lanes' writes (the data to send) are ordered before the leader's release fence
    return ptx::laneId() == leaderLane(mask) ? op() : Status::kOk;
  }
  /// Direct path, cooperative: every calling thread copies its share, then a barrier (`sync`), then `leader`
  /// signals. Returns -1 (nothing done: proxy path), else the status.
  template <typename Sync>
  GDX_DEVICE_INLINE int directCooperative(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                          bool withSignal, uint32_t signalId, uint64_t value, SignalOp op, uint64_t tid,
                                          uint64_t nthreads, Sync&& sync) {
    if (w.dstWindow >= kMaxUserWindows || w.srcWindow >= kMaxUserWindows || signalId >= kMaxSignals)
      return int(Status::kInvalidArgument);
    const DirectRoute r = directRoute(w, dstOffset, srcOffset, bytes, withSignal, signalId);
    if (r.path < 0) return int(Status::kInvalidArgument);
    if (r.path == 0) return -1;
    copyCooperative(r.dst, r.src, bytes, tid, nthreads);
    if (withSignal) {
      sync();
      if (tid == 0) directSignal(r.signal, value, op);
    }
    return int(Status::kOk);
  }
  GDX_DEVICE_INLINE Status putWarp(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                   uint64_t bytes) {
    return putWithSignalWarpImpl(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes, false, 0, 0,
                                 SignalOp::kAdd);
  }
  GDX_DEVICE_INLINE Status putWarp(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    return putWithSignalWarpImpl(w, dstOffset, srcOffset, bytes, false, 0, 0, SignalOp::kAdd);
  }
  GDX_DEVICE_INLINE Status putWithSignalWarp(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                             uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                             SignalOp op = SignalOp::kAdd) {
    return putWithSignalWarpImpl(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes, true, signalId, value,
                                 op);
  }
  GDX_DEVICE_INLINE Status putWithSignalWarp(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                             uint64_t bytes, uint32_t signalId, uint64_t value,
                                             SignalOp op = SignalOp::kAdd) {
    return putWithSignalWarpImpl(w, dstOffset, srcOffset, bytes, true, signalId, value, op);
  }
  GDX_DEVICE_INLINE Status putWithSignalWarpImpl(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                                 uint64_t bytes, bool withSignal, uint32_t signalId, uint64_t value,
                                                 SignalOp op) {
    const unsigned mask = __activemask();
    int r = directCooperative(w, dstOffset, srcOffset, bytes, withSignal, signalId, value, op,
                              __popc(mask & ((1u << ptx::laneId()) - 1)), __popc(mask), [&] { __syncwarp(mask); });
    if (r >= 0) return static_cast<Status>(r);
    return onLeader([&] {
      return proxyPut(w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, withSignal, signalId, value, op);
    });
  }
  /// Block-cooperative forms: every thread of the block calls with the same arguments (they contain
  /// __syncthreads). Direct path: the block copies, then thread 0 signals. Proxy path: thread (0,0,0) enqueues;
  /// the others get kOk.
  GDX_DEVICE_INLINE Status putBlock(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                    uint64_t bytes) {
    return putWithSignalBlockImpl(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes, false, 0, 0,
                                  SignalOp::kAdd);
  }
  GDX_DEVICE_INLINE Status putBlock(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    return putWithSignalBlockImpl(w, dstOffset, srcOffset, bytes, false, 0, 0, SignalOp::kAdd);
  }
  GDX_DEVICE_INLINE Status putWithSignalBlock(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                              uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return putWithSignalBlockImpl(windowPair(dstWindow, srcWindow), dstOffset, srcOffset, bytes, true, signalId, value,
                                  op);
  }
  GDX_DEVICE_INLINE Status putWithSignalBlock(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                              uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return putWithSignalBlockImpl(w, dstOffset, srcOffset, bytes, true, signalId, value, op);
  }
  GDX_DEVICE_INLINE Status putWithSignalBlockImpl(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                                  uint64_t bytes, bool withSignal, uint32_t signalId, uint64_t value,
                                                  SignalOp op) {
    const uint64_t tid = threadIdx.x + blockDim.x * (threadIdx.y + uint64_t(blockDim.y) * threadIdx.z);
    const uint64_t n = uint64_t(blockDim.x) * blockDim.y * blockDim.z;
    int r = directCooperative(w, dstOffset, srcOffset, bytes, withSignal, signalId, value, op, tid, n,
                              [] { __syncthreads(); });
    if (r >= 0) return static_cast<Status>(r);
    __syncthreads();  // the block's writes (the data to send) are ordered before the enqueue's release fence
    if (tid != 0) return Status::kOk;
    return proxyPut(w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, withSignal, signalId, value, op);
  }
  GDX_DEVICE_INLINE Status signalWarp(uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd) {
    return onLeader([&] { return signal(signalId, value, op); });
  }
  GDX_DEVICE_INLINE Status atomicAddWarp(uint32_t dstWindow, uint64_t dstOffset, uint64_t value) {
    return onLeader([&] { return atomicAdd(dstWindow, dstOffset, value); });
  }
  /// Every lane waits; one lane polls host memory (one PCIe read per poll instead of 32) and the warp barrier
  /// after it makes what the signal announced visible to every lane.
  GDX_DEVICE_INLINE Status waitWarp(uint32_t signalId, uint64_t value) const {
    const unsigned mask = __activemask();
    Status s = ptx::laneId() == leaderLane(mask) ? wait(signalId, value) : Status::kOk;
    s = static_cast<Status>(__shfl_sync(mask, static_cast<uint32_t>(s), leaderLane(mask)));
    __syncwarp(mask);
    return s;
  }
  /// Every lane's own operations, whichever form issued them, are complete at the source when this returns kOk
  /// (the lanes' reads of the completion counter coalesce into one). The worst status of the lanes is returned.
  GDX_DEVICE_INLINE Status flushWarp() const {
    const unsigned mask = __activemask();
    return static_cast<Status>(__reduce_max_sync(mask, static_cast<unsigned>(flush())));
  }
#endif
};

static_assert(std::is_trivially_copyable<ChannelDeviceHandle>::value, "handles are passed to kernels by value");

}  // namespace gdx
