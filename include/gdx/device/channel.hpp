// ChannelDeviceHandle: what a CUDA kernel receives (by value) to issue one-sided operations to one peer.
// Two paths, chosen per peer when the Context is set up (and logged at GDX_LOG_LEVEL=INFO):
//  * proxy path: every operation is a command enqueued on a command ring that a proxy thread drains; see
//    impl/ring.hpp for the ring protocol and proxy.hpp for what the proxy does with each command.
//  * direct path (a peer GPU of the same host that this GPU can address, `direct` set): put (with or without a
//    Signal) / signal / atomicAdd between GPU-addressable windows are done by the calling threads themselves, with SM
//    loads and stores into the peer's IPC-mapped window and system-scope release atomics on the peer's device
//    signal array (impl/direct.hpp). A put whose source or destination window is not on the direct path
//    (a host window that CUDA cannot address, a host window on the peer) still goes through the proxy.
//    Direct-path operations are complete when the call returns (flush() has nothing to wait for); a range
//    outside the window returns kInvalidArgument at once instead of a later kProxyError. The single-thread
//    forms copy with one thread, 8 loads of 16 bytes in flight (when source and destination agree modulo 16):
//    about one microsecond per KiB; anything past a few KiB belongs to the warp (device::Warp) or block
//    (device::Block) forms, which move 32 or blockDim times as much per round trip.
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
//    after it, see impl/ring.hpp), and later commands and flushes work. The proxy's message says which command.
//  * Only what breaks the ring itself (its proxy thread stopped, a producer left a hole) ends every wait on it.
//
// Ordering guarantees:
//  * Before a put's command is published, the producing thread's earlier writes (the data it puts) are made
//    visible at system scope, so the proxy and the transport read what the kernel wrote.
//  * A signal update sent by a put with a Signal / signal becomes visible at the receiver only after the data of
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
// Cooperation (device/coop.hpp): put takes the threads that call it together as its last argument, device::Thread
// (the default), device::Warp or device::Block, as NCCL's Coop types and MSCCL++'s threadId/numThreads do. The warp
// form is called by every lane of the warp (all 32, or those of a block's partial last warp) with the same arguments,
// whether or not they arrive together; on the proxy path lane 0 enqueues and the others return kOk at once, so the
// warp need not wait for the ring (lane 0's return value is the enqueue status; flushWarp gives every lane lane 0's
// command errors, waitWarp the peer's failure). The block form likewise, with thread (0,0,0) enqueuing. On the direct
// path the group copies, then one thread signals.
// Lanes are numbered by %laneid, so any block shape works. putWithSignal, putWarp, putWithSignalWarp, putBlock and
// putWithSignalBlock are the same operations under their former names.
// Registers: a kernel that calls put takes 72 to 128 registers a thread on sm_90 when the compiler is free
// to choose (gdx's test and benchmark kernels), all that a block of 512 threads may have and twice what one of 1024
// may (64). A kernel of more than 256 threads should declare __launch_bounds__(threads): without it the launch can
// fail with cudaErrorLaunchOutOfResources, which only cudaGetLastError() after the launch reports (the kernel never
// runs, and its peer's waits time out).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/coop.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/direct.hpp"
#include "gdx/device/impl/ring.hpp"
#include "gdx/status.hpp"
#include "gdx/types.hpp"

namespace gdx {

namespace device {
/// The signal a put raises at the peer once its data is in place there: `op` (add or set) with `value` on the peer's
/// signal `id`.
struct Signal {
  uint32_t id;
  uint64_t value;
  SignalOp op = SignalOp::kAdd;
};
}  // namespace device

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

/// The operations a kernel issues to one peer. The fields are the handle's bytes, filled by the Context
/// (Context::deviceChannel) and copied as they are (the Python package passes them to kernels): kernels use the
/// operations below, whose implementation lives in device/impl/channel_funcs.hpp.
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
  /// The windows `dstWindow` (the peer's) and `srcWindow` (this rank's) resolved for the puts that take a
  /// BoundWindows: on the direct path the four DirectPeer fields are loaded here, together, once.
  GDX_DEVICE_INLINE BoundWindows bind(uint32_t dstWindow, uint32_t srcWindow) const;
#endif

  /// Copies `bytes` from local window `srcWindow` at `srcOffset` to window `dstWindow` of the peer at `dstOffset`,
  /// by the threads of `coop` (Thread, Warp or Block; device/coop.hpp). Larger than kMaxCommandBytes: several
  /// commands. Zero bytes: nothing to do. The Warp and Block forms are device code.
  template <typename Coop = device::Thread, typename = detail::IfChannelCoop<Coop>>
  GDX_HOST_DEVICE_INLINE Status put(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                    uint64_t bytes, Coop coop = {});
  /// put(), then `signal.op` with `signal.value` on the peer's signal `signal.id` once the data is in place there.
  /// Zero bytes: only the signal (a MoE sender still tells an expert that no tokens are coming).
  template <typename Coop = device::Thread, typename = detail::IfChannelCoop<Coop>>
  GDX_HOST_DEVICE_INLINE Status put(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                    uint64_t bytes, device::Signal signal, Coop coop = {});
  /// put() between windows bound once (bind): no table load on the direct path.
  template <typename Coop = device::Thread, typename = detail::IfChannelCoop<Coop>>
  GDX_HOST_DEVICE_INLINE Status put(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                    Coop coop = {});
  template <typename Coop = device::Thread, typename = detail::IfChannelCoop<Coop>>
  GDX_HOST_DEVICE_INLINE Status put(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                    device::Signal signal, Coop coop = {});

  /// Sets or adds to the peer's signal `signalId`, after every earlier operation of this ring to the peer.
  GDX_HOST_DEVICE_INLINE Status signal(uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd);

  /// Atomically adds `value` to the 64-bit word at `dstOffset` (8-byte aligned) of the peer's `dstWindow`.
  GDX_HOST_DEVICE_INLINE Status atomicAdd(uint32_t dstWindow, uint64_t dstOffset, uint64_t value);

  /// Waits until this rank's signal `signalId` >= `value` (bounded; see the header comment).
  GDX_HOST_DEVICE_INLINE Status wait(uint32_t signalId, uint64_t value) const;

  /// Waits until every operation this handle enqueued completed at the source (bounded); kProxyError or the
  /// transport's status when one of them (since this copy's last flush) was refused or failed, kPeerFailed at once
  /// when the peer failed. Each failure is reported by one flush of the copy: the next flush looks at later commands.
  GDX_HOST_DEVICE_INLINE Status flush() const;

  /// Current value of this rank's signal `signalId`.
  GDX_HOST_DEVICE_INLINE uint64_t signalValue(uint32_t signalId) const;

#if defined(__CUDACC__)
  /// signal() and atomicAdd() by every lane of the warp: lane 0 issues, the others return kOk.
  GDX_DEVICE_INLINE Status signalWarp(uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd);
  GDX_DEVICE_INLINE Status atomicAddWarp(uint32_t dstWindow, uint64_t dstOffset, uint64_t value);
  /// Every lane waits; one lane polls host memory (one PCIe read per poll instead of 32) and the warp barrier
  /// after it makes what the signal announced visible to every lane.
  GDX_DEVICE_INLINE Status waitWarp(uint32_t signalId, uint64_t value) const;
  /// Every lane's own operations, whichever form issued them, are complete at the source when this returns kOk
  /// (the lanes' reads of the completion counter coalesce into one). The worst status of the lanes is returned.
  GDX_DEVICE_INLINE Status flushWarp() const;
#endif

  // The put family under its former names: put with a Signal and with a Warp or Block.
  GDX_HOST_DEVICE_INLINE Status putWithSignal(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                              uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return put(dstWindow, dstOffset, srcWindow, srcOffset, bytes, device::Signal{signalId, value, op});
  }
  GDX_HOST_DEVICE_INLINE Status putWithSignal(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                              uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return put(w, dstOffset, srcOffset, bytes, device::Signal{signalId, value, op});
  }
#if defined(__CUDACC__)
  GDX_DEVICE_INLINE Status putWarp(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                   uint64_t bytes) {
    return put(dstWindow, dstOffset, srcWindow, srcOffset, bytes, device::Warp{});
  }
  GDX_DEVICE_INLINE Status putWarp(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    return put(w, dstOffset, srcOffset, bytes, device::Warp{});
  }
  GDX_DEVICE_INLINE Status putWithSignalWarp(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                             uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                             SignalOp op = SignalOp::kAdd) {
    return put(dstWindow, dstOffset, srcWindow, srcOffset, bytes, device::Signal{signalId, value, op}, device::Warp{});
  }
  GDX_DEVICE_INLINE Status putWithSignalWarp(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                             uint64_t bytes, uint32_t signalId, uint64_t value,
                                             SignalOp op = SignalOp::kAdd) {
    return put(w, dstOffset, srcOffset, bytes, device::Signal{signalId, value, op}, device::Warp{});
  }
  GDX_DEVICE_INLINE Status putBlock(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow, uint64_t srcOffset,
                                    uint64_t bytes) {
    return put(dstWindow, dstOffset, srcWindow, srcOffset, bytes, device::Block{});
  }
  GDX_DEVICE_INLINE Status putBlock(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    return put(w, dstOffset, srcOffset, bytes, device::Block{});
  }
  GDX_DEVICE_INLINE Status putWithSignalBlock(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                              uint64_t srcOffset, uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return put(dstWindow, dstOffset, srcWindow, srcOffset, bytes, device::Signal{signalId, value, op}, device::Block{});
  }
  GDX_DEVICE_INLINE Status putWithSignalBlock(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                              uint64_t bytes, uint32_t signalId, uint64_t value,
                                              SignalOp op = SignalOp::kAdd) {
    return put(w, dstOffset, srcOffset, bytes, device::Signal{signalId, value, op}, device::Block{});
  }
#endif
};

static_assert(std::is_trivially_copyable<ChannelDeviceHandle>::value, "handles are passed to kernels by value");

}  // namespace gdx

#include "gdx/device/impl/channel_funcs.hpp"
