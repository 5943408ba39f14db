#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "proxy/proxy_thread.hpp"
#include "proxy/write_merger.hpp"

namespace gdx {
namespace {

// The trace event of an operation posted.
TraceEvent postEvent(size_t ring, int peer, uint32_t window, uint64_t offset, uint64_t bytes, uint64_t cookie) {
  TraceEvent e;
  e.ns = nowNs();
  e.kind = TraceKind::kPost;
  e.opcode = 0xff;
  e.ring = static_cast<uint16_t>(ring);
  e.peer = peer;
  e.window = window;
  e.offset = offset;
  e.bytes = bytes;
  e.position = cookie;
  return e;
}

// The remote atomic on the peer's signal word that a signal command (or slot) stands for.
AtomicOp signalAtomicOf(const Command& s) {
  AtomicOp a;
  a.peer = static_cast<int>(s.peer());
  a.remoteWindow = kSignalWindowId;
  a.remoteOffset = uint64_t{s.signalId()} * 8;
  a.kind = s.signalOp();
  a.value = s.value();
  return a;
}

}  // namespace

void Proxy::Posting::write(WriteOp w) {
  w.cookie = cookie();
  t_.lane->post(w);
  if (t_.trace) t_.trace->record(postEvent(ring_, w.peer, w.remoteWindow, w.remoteOffset, w.bytes, w.cookie));
  ++posted_;
  ++writes_;
  bytes_ += w.bytes;
}

void Proxy::Posting::atomic(AtomicOp a) {
  a.cookie = cookie();
  t_.lane->postAtomic(a);
  if (t_.trace) t_.trace->record(postEvent(ring_, a.peer, a.remoteWindow, a.remoteOffset, 8, a.cookie));
  ++posted_;
}

void Proxy::Posting::message(MessageOp m) {
  m.cookie = cookie();
  t_.lane->postMessage(m);
  if (t_.trace) t_.trace->record(postEvent(ring_, m.peer, 0, 0, m.bytes, m.cookie));
  ++posted_;
}

void Proxy::Posting::close(uint64_t endPos) {
  t_.trackers[ring_].open(endPos, posted_);
  t_.bytes.fetch_add(bytes_, std::memory_order_relaxed);
  t_.writes.fetch_add(writes_, std::memory_order_relaxed);
}

// A put: one write, merged with the puts around it when they continue each other (the caller posted what it does
// not continue; the merged write is posted once a command that does not continue it arrives, or at the end of the
// batch). A putWithSignal: its write (merged with the puts before it) with the immediate, or the write and then the
// signal as a remote atomic when the update does not fit the immediate.
void Proxy::postPut(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command& c,
                    const Command* signal, uint64_t lastPosition) {
  merger.add(writeOf(c), lastPosition);
  if (signal) postMerged(t, ring, p, merger, signal);
}

// Posts the pending write (with `signal`, the putWithSignal's signal slot that ends it). When the transport refuses
// it (a window deregistered after the registry's check), its puts fail, recorded as a fault of their peer at the
// last one's position, and the caller goes on with the command at hand, which is not theirs to fail.
void Proxy::postMerged(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command* signal) {
  if (!merger.pending()) return;
  const uint32_t merged = merger.count();
  const uint64_t last = merger.lastPosition();
  WriteOp w = merger.take();
  try {
    if (signal) w.withImm = encodeSignalImm(signal->signalOp(), signal->signalId(), signal->value(), &w.imm);
    p.write(w);
    if (signal && !w.withImm) p.atomic(signalAtomicOf(*signal));
  } catch (const std::exception& e) {
    t.errors.fetch_add(1, std::memory_order_relaxed);
    const uint32_t peer = static_cast<uint32_t>(w.peer);
    recordError(peer, "rank " + std::to_string(registry_.rank()) + " proxy thread " + std::to_string(t.index) +
                          ": posting a write of " + std::to_string(w.bytes) + " bytes to peer " + std::to_string(peer) +
                          " (window " + std::to_string(w.remoteWindow) + " offset " + std::to_string(w.remoteOffset) +
                          ", " + std::to_string(merged) + (merged == 1 ? " put" : " puts merged") +
                          (signal ? " and a signal" : "") + ", the last at ring position " + std::to_string(last) +
                          ") failed: " + e.what());
    ring.recordFault(peer, last, Status::kProxyError);
  }
}

// Relayed: the data goes to the relay (no immediate), then the forward request on the same lane, which the relay
// handles only once that data is in place.
void Proxy::postRelayed(Posting& p, const Command& c, const Command& second) {
  const bool withData = !isSignal(c);
  const MessageOp request = relay_->request(c, second);
  if (withData) p.write(writeOf(c));
  p.message(request);
}

// A signal or an atomicAdd: one remote atomic.
void Proxy::postAtomic(Posting& p, const Command& c) {
  AtomicOp a;
  if (c.opcode() == Opcode::kAtomicAdd) {
    a.peer = static_cast<int>(c.peer());
    a.remoteWindow = c.dstWindow();
    a.remoteOffset = c.dstOffset();
    a.kind = SignalOp::kAdd;
    a.value = c.value();
  } else {
    a = signalAtomicOf(c);
  }
  p.atomic(a);
}

}  // namespace gdx
