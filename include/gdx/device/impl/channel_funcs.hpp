// The inline implementation of ChannelDeviceHandle (device/channel.hpp declares it and states its contracts): the
// operations' bodies and the helpers they share, which are not part of the API (gdx::detail).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/device/coop.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/copy.hpp"
#include "gdx/device/impl/direct.hpp"
#include "gdx/device/impl/poll.hpp"
#include "gdx/device/impl/ptx.hpp"
#include "gdx/device/impl/put_commands.hpp"
#include "gdx/device/impl/ring.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/status.hpp"

namespace gdx::detail {

#if defined(__CUDACC__)
/// A field of the DirectPeer table through the read-only data cache. The Context writes the table before the kernels
/// that use an entry start (setup, window registration) and never while one runs, so the cache cannot be stale.
/// Volatile, so that the compiler issues each load where it is written: the callers load every field they need
/// before checking any, and a non-volatile load may be sunk past the first check, which makes the loads one L2 round
/// trip after another (after a wait's acquire, L1 holds none of them).
template <typename T>
GDX_DEVICE_INLINE T tableField(const T* p) {
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

/// Where a direct-path put (and its signal) goes.
struct DirectRoute {
  char* dst;
  const char* src;
  uint64_t* signal;  ///< the peer's signal word; null without a signal
  int path;          ///< 1: direct, 0: through the proxy, -1: the range lies outside a direct-path window
};

/// The peer's signal word on the direct path; null when the signal goes through the proxy.
GDX_DEVICE_INLINE uint64_t* directSignalWord(const ChannelDeviceHandle& h, uint32_t signalId) {
  return h.direct && h.directSignals && signalId < h.directNumSignals ? h.directSignals + signalId : nullptr;
}

/// Every field of the DirectPeer table a put needs was loaded by bind(), before any of them is looked at: the loads
/// are independent and share one round trip to L2 (after a wait's acquire L1 holds none of them), where checking each
/// before loading the next cost a round trip each.
GDX_DEVICE_INLINE DirectRoute directRoute(const ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset,
                                          uint64_t srcOffset, uint64_t bytes, bool withSignal, uint32_t signalId) {
  if (!h.direct || !w.dst || !w.src) return DirectRoute{nullptr, nullptr, nullptr, 0};
  const uint64_t dn = w.dstBytes, sn = w.srcBytes;
  if (dstOffset > dn || bytes > dn - dstOffset || srcOffset > sn || bytes > sn - srcOffset)
    return DirectRoute{nullptr, nullptr, nullptr, -1};
  uint64_t* signal = withSignal ? directSignalWord(h, signalId) : nullptr;
  if (withSignal && !signal) return DirectRoute{nullptr, nullptr, nullptr, 0};
  return DirectRoute{w.dst + dstOffset, w.src + srcOffset, signal, 1};
}

/// Release at system scope: the data this thread wrote (and what it saw through a barrier) is visible first.
GDX_DEVICE_INLINE void directSignal(uint64_t* w, uint64_t value, SignalOp op) {
  if (op == SignalOp::kAdd)
    atomicFetchAdd(w, value, kRelease);
  else
    atomicStore(w, value, kRelease);
}

/// Runs `op` on lane 0 of the warp only (device::Warp: every lane of the warp calls). The other lanes do not wait for
/// it and get kOk: lane 0's return value is the enqueue status, and a failure the proxy finds later reaches every lane
/// through flushWarp (the worst of the lanes' flushes: lane 0's reports it).
template <typename Op>
GDX_DEVICE_INLINE Status onLeader(Op&& op) {
  __syncwarp(device::Warp::lanes());  // the lanes' writes (the data to send) are ordered before lane 0's release fence
  return ptx::laneId() == 0 ? op() : Status::kOk;
}
#endif

/// The window-id forms' pair: bound on the device; on the host (the proxy path only) the ids alone.
GDX_HOST_DEVICE_INLINE BoundWindows windowPair(const ChannelDeviceHandle& h, uint32_t dstWindow, uint32_t srcWindow) {
#if GDX_DEVICE_COMPILE
  return h.bind(dstWindow, srcWindow);
#else
  (void)h;
  return BoundWindows{dstWindow, srcWindow};
#endif
}

GDX_HOST_DEVICE_INLINE Status enqueue(ChannelDeviceHandle& h, const Command& c) {
  uint64_t pos;
  Status s = h.ring.push(c, &pos);
  if (s == Status::kOk) {
    h.lastPosition = pos;
    if (h.flushFrom == ~uint64_t{0}) h.flushFrom = pos;
  }
  return s;
}

/// True when [offset, offset + bytes) can be named in a command (the proxy checks it against the window).
GDX_HOST_DEVICE_INLINE bool addressable(uint64_t offset, uint64_t bytes) {
  return offset <= kMaxWindowOffset && (bytes == 0 || bytes - 1 <= kMaxWindowOffset - offset);
}

/// Proxy-path commands of a put (put_commands.hpp), with `signal` on the last piece when given.
GDX_HOST_DEVICE_INLINE Status enqueuePut(ChannelDeviceHandle& h, uint32_t dstWindow, uint64_t dstOffset,
                                         uint32_t srcWindow, uint64_t srcOffset, uint64_t bytes,
                                         const SignalUpdateArgs* signal) {
  const PutTarget target{h.peer, h.forwardTo, dstWindow, dstOffset, srcWindow, srcOffset};
  return pushPutCommands(h.ring, target, bytes, signal, &h.lastPosition, &h.flushFrom);
}

/// The proxy path of a put, for the cooperative forms once their direct path declined: the same checks and commands
/// as the single-thread put without its copy, whose registers would otherwise be reserved in every kernel that uses a
/// warp or block form.
GDX_HOST_DEVICE_INLINE Status proxyPut(ChannelDeviceHandle& h, uint32_t dstWindow, uint64_t dstOffset,
                                       uint32_t srcWindow, uint64_t srcOffset, uint64_t bytes, bool withSignal,
                                       uint32_t signalId, uint64_t value, SignalOp op) {
  if (dstWindow >= kMaxUserWindows || srcWindow >= kMaxUserWindows || signalId >= kMaxSignals ||
      !addressable(dstOffset, bytes) || !addressable(srcOffset, bytes))
    return Status::kInvalidArgument;
  if (!withSignal) return enqueuePut(h, dstWindow, dstOffset, srcWindow, srcOffset, bytes, nullptr);
  if (bytes == 0) return h.signal(signalId, value, op);
  const SignalUpdateArgs update{signalId, value, op};
  return enqueuePut(h, dstWindow, dstOffset, srcWindow, srcOffset, bytes, &update);
}

/// A put by one thread: on the direct path it copies alone (device::copy with Thread) and signals.
template <bool kWithSignal>
GDX_HOST_DEVICE_INLINE Status putThread(ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset,
                                        uint64_t srcOffset, uint64_t bytes, const device::Signal& signal) {
  if (w.dstWindow >= kMaxUserWindows || w.srcWindow >= kMaxUserWindows || (kWithSignal && signal.id >= kMaxSignals) ||
      !addressable(dstOffset, bytes) || !addressable(srcOffset, bytes))
    return Status::kInvalidArgument;
  if (kWithSignal && bytes == 0) return h.signal(signal.id, signal.value, signal.op);
#if GDX_DEVICE_COMPILE
  {
    const DirectRoute r = directRoute(h, w, dstOffset, srcOffset, bytes, kWithSignal, signal.id);
    if (r.path < 0) return Status::kInvalidArgument;
    if (r.path > 0) {
      device::copy(device::Thread{}, r.dst, r.src, bytes);
      if (kWithSignal) directSignal(r.signal, signal.value, signal.op);
      return Status::kOk;
    }
  }
#endif
  if (!kWithSignal) return enqueuePut(h, w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, nullptr);
  const SignalUpdateArgs update{signal.id, signal.value, signal.op};
  return enqueuePut(h, w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, &update);
}

#if defined(__CUDACC__)
/// Direct path, cooperative: every thread of `group` copies its share, then a barrier (`sync`), then its first thread
/// signals. Returns -1 (nothing done: proxy path), else the status.
template <typename Sync>
GDX_DEVICE_INLINE int directCooperative(const ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset,
                                        uint64_t srcOffset, uint64_t bytes, bool withSignal,
                                        const device::Signal& signal, device::Group group, Sync&& sync) {
  if (w.dstWindow >= kMaxUserWindows || w.srcWindow >= kMaxUserWindows || signal.id >= kMaxSignals)
    return int(Status::kInvalidArgument);
  const DirectRoute r = directRoute(h, w, dstOffset, srcOffset, bytes, withSignal, signal.id);
  if (r.path < 0) return int(Status::kInvalidArgument);
  if (r.path == 0) return -1;
  device::copy(group, r.dst, r.src, bytes);
  if (withSignal) {
    sync();
    if (group.threadRank == 0) directSignal(r.signal, signal.value, signal.op);
  }
  return int(Status::kOk);
}

/// A put by every lane of the warp: the lanes copy on the direct path; lane 0 enqueues on the proxy path.
template <bool kWithSignal>
GDX_DEVICE_INLINE Status putWarp(ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                 uint64_t bytes, const device::Signal& signal) {
  const device::Warp warp;
  const device::Group lanes{warp.rank(), warp.size()};
  int r = directCooperative(h, w, dstOffset, srcOffset, bytes, kWithSignal, signal, lanes, [&] { warp.sync(); });
  if (r >= 0) return static_cast<Status>(r);
  return onLeader([&] {
    return proxyPut(h, w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, kWithSignal, signal.id, signal.value,
                    signal.op);
  });
}

/// A put by a block (it contains __syncthreads): the block copies on the direct path; thread (0,0,0) enqueues on the
/// proxy path, the others get kOk.
template <bool kWithSignal>
GDX_DEVICE_INLINE Status putBlock(ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                  uint64_t bytes, const device::Signal& signal) {
  const device::Block block;
  const device::Group threads{block.rank(), block.size()};
  int r = directCooperative(h, w, dstOffset, srcOffset, bytes, kWithSignal, signal, threads, [] { __syncthreads(); });
  if (r >= 0) return static_cast<Status>(r);
  __syncthreads();  // the block's writes (the data to send) are ordered before the enqueue's release fence
  if (threads.threadRank != 0) return Status::kOk;
  return proxyPut(h, w.dstWindow, dstOffset, w.srcWindow, srcOffset, bytes, kWithSignal, signal.id, signal.value,
                  signal.op);
}
#endif

/// The put of every form: Thread here, Warp and Block (device code) through their cooperative paths.
template <bool kWithSignal, typename Coop>
GDX_HOST_DEVICE_INLINE Status put(ChannelDeviceHandle& h, const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                  uint64_t bytes, const device::Signal& signal) {
  if constexpr (std::is_same<Coop, device::Thread>::value) {
    return putThread<kWithSignal>(h, w, dstOffset, srcOffset, bytes, signal);
  } else {
#if GDX_DEVICE_COMPILE
    if constexpr (std::is_same<Coop, device::Warp>::value)
      return putWarp<kWithSignal>(h, w, dstOffset, srcOffset, bytes, signal);
    else
      return putBlock<kWithSignal>(h, w, dstOffset, srcOffset, bytes, signal);
#else
    // The cooperative forms are device code; host code that names them gets an error, not a hang.
    return Status::kInvalidArgument;
#endif
  }
}

}  // namespace gdx::detail

namespace gdx {

#if defined(__CUDACC__)
GDX_DEVICE_INLINE BoundWindows ChannelDeviceHandle::bind(uint32_t dstWindow, uint32_t srcWindow) const {
  BoundWindows w{dstWindow, srcWindow};
  if (direct && dstWindow < kMaxWindows && srcWindow < kMaxWindows) {
    // Taken as they are: directRoute sends a pair with a null address through the proxy.
    w.dst = detail::tableField(&direct->peerBase[dstWindow]);
    w.src = detail::tableField(&direct->localBase[srcWindow]);
    w.dstBytes = detail::tableField(&direct->peerBytes[dstWindow]);
    w.srcBytes = detail::tableField(&direct->localBytes[srcWindow]);
  }
  return w;
}
#endif

template <typename Coop, typename>
GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::put(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                                       uint64_t srcOffset, uint64_t bytes, Coop) {
  return detail::put<false, Coop>(*this, detail::windowPair(*this, dstWindow, srcWindow), dstOffset, srcOffset, bytes,
                                  device::Signal{0, 0, SignalOp::kAdd});
}
template <typename Coop, typename>
GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::put(uint32_t dstWindow, uint64_t dstOffset, uint32_t srcWindow,
                                                       uint64_t srcOffset, uint64_t bytes, device::Signal signal,
                                                       Coop) {
  return detail::put<true, Coop>(*this, detail::windowPair(*this, dstWindow, srcWindow), dstOffset, srcOffset, bytes,
                                 signal);
}
template <typename Coop, typename>
GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::put(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                                       uint64_t bytes, Coop) {
  return detail::put<false, Coop>(*this, w, dstOffset, srcOffset, bytes, device::Signal{0, 0, SignalOp::kAdd});
}
template <typename Coop, typename>
GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::put(const BoundWindows& w, uint64_t dstOffset, uint64_t srcOffset,
                                                       uint64_t bytes, device::Signal signal, Coop) {
  return detail::put<true, Coop>(*this, w, dstOffset, srcOffset, bytes, signal);
}

GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::signal(uint32_t signalId, uint64_t value, SignalOp op) {
  if (signalId >= kMaxSignals) return Status::kInvalidArgument;
#if GDX_DEVICE_COMPILE
  if (uint64_t* w = detail::directSignalWord(*this, signalId)) {
    detail::directSignal(w, value, op);
    return Status::kOk;
  }
#endif
  return detail::enqueue(*this, Command::signal(peer, signalId, value, op, forwardTo));
}

GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::atomicAdd(uint32_t dstWindow, uint64_t dstOffset, uint64_t value) {
  if (dstWindow >= kMaxUserWindows || dstOffset % 8 != 0 || !detail::addressable(dstOffset, 8) || forwardTo >= 0)
    return Status::kInvalidArgument;
#if GDX_DEVICE_COMPILE
  char* base = direct ? detail::tableField(&direct->peerBase[dstWindow]) : nullptr;
  const uint64_t limit = direct ? detail::tableField(&direct->peerBytes[dstWindow]) : 0;  // loaded beside base
  if (base) {
    if (dstOffset + 8 > limit) return Status::kInvalidArgument;
    atomicFetchAdd(reinterpret_cast<uint64_t*>(base + dstOffset), value, kRelaxed);
    return Status::kOk;
  }
#endif
  return detail::enqueue(*this, Command::atomicAdd(peer, dstWindow, dstOffset, value));
}

GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::wait(uint32_t signalId, uint64_t value) const {
  if (signalId >= numSignals) return Status::kInvalidArgument;
  // A direct-path handle polls its device word (local memory) on every try and host memory (the host signal, the
  // error words: PCIe round trips) on every 32nd only, so the poll of the word the peer raises is rarely stuck behind
  // a PCIe read; a proxied handle polls the host word on every try and the error words on every 16th. The error words
  // are loaded before the signals' acquire loads (which hold back later loads), so all the PCIe reads of a try
  // overlap.
  const bool directWait = direct && deviceSignals;
  const uint64_t every = directWait ? 31 : 15;
  return detail::pollBounded(
      ring.timeoutNs, every, every,
      [&](uint64_t spins, Status& s) {
        const bool check = (spins & every) == every;
        const bool pollHost = !directWait || check;
        const bool pollDevice = deviceSignals && (direct || (spins & 7) == 7);
        uint32_t f = 0, e = 0;
        if (check) {
          f = atomicLoad(failure, kRelaxed);
          e = atomicLoad(ring.error, kRelaxed);
        }
        // Acquire loads, not relaxed loads and a fence: a system-scope fence costs more than the whole poll of the
        // local device word.
        const uint64_t h = pollHost ? atomicLoad(&signals[signalId], kAcquire) : 0;
        const uint64_t d = pollDevice ? atomicLoad(&deviceSignals[signalId], kAcquire) : 0;
        if (h >= value || d >= value) return true;
        // The error words, read above with the poll, are looked at once it failed.
        if (f != 0) {
          s = static_cast<Status>(f);
          return true;
        }
        if (e != 0) {
          s = static_cast<Status>(e);
          return true;
        }
        return false;
      },
      [](Status&) { return false; }, [] { return Status::kTimeout; },
      // The local device word is cheap to poll: a direct wait spins without sleeping for its first few hundred tries
      // (tens of microseconds), which is what a signal's latency depends on.
      [&](uint64_t spins) {
        if (!directWait || spins > 256) spinPause(spins);
      });
}

GDX_HOST_DEVICE_INLINE Status ChannelDeviceHandle::flush() const {
  if (lastPosition == ~uint64_t{0} || flushFrom == ~uint64_t{0}) return Status::kOk;
  const Status s = ring.waitCompleted(lastPosition, flushFrom, peer, failure);
  if (s != Status::kTimeout) flushFrom = ~uint64_t{0};
  return s;
}

GDX_HOST_DEVICE_INLINE uint64_t ChannelDeviceHandle::signalValue(uint32_t signalId) const {
  uint64_t h = atomicLoad(&signals[signalId], kAcquire);
  uint64_t d = deviceSignals ? atomicLoad(&deviceSignals[signalId], kAcquire) : 0;
  return h > d ? h : d;
}

#if defined(__CUDACC__)
GDX_DEVICE_INLINE Status ChannelDeviceHandle::signalWarp(uint32_t signalId, uint64_t value, SignalOp op) {
  return detail::onLeader([&] { return signal(signalId, value, op); });
}
GDX_DEVICE_INLINE Status ChannelDeviceHandle::atomicAddWarp(uint32_t dstWindow, uint64_t dstOffset, uint64_t value) {
  return detail::onLeader([&] { return atomicAdd(dstWindow, dstOffset, value); });
}
GDX_DEVICE_INLINE Status ChannelDeviceHandle::waitWarp(uint32_t signalId, uint64_t value) const {
  const unsigned mask = device::Warp::lanes();
  Status s = ptx::laneId() == 0 ? wait(signalId, value) : Status::kOk;
  s = static_cast<Status>(__shfl_sync(mask, static_cast<uint32_t>(s), 0));
  __syncwarp(mask);
  return s;
}
GDX_DEVICE_INLINE Status ChannelDeviceHandle::flushWarp() const {
  return static_cast<Status>(__reduce_max_sync(device::Warp::lanes(), static_cast<unsigned>(flush())));
}
#endif

}  // namespace gdx
