// The parts of a Proxy (proxy.hpp) that its files share: a proxy thread's state (Proxy::Thread), the operations of
// one drained batch (Proxy::Posting) and what a command stands for. Each file of the Proxy does one job:
// proxy.cpp builds, starts and stops it and keeps its errors and counters; proxy_options.cpp reads and checks its
// options; proxy_commands.cpp checks commands against the registry; proxy_posting.cpp turns them into transport
// operations; proxy_loop.cpp is a thread's loop (drain the rings, reap completions, nap when idle).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/command_ring.hpp"
#include "proxy/completion_tracker.hpp"
#include "proxy/proxy.hpp"
#include "proxy/trace.hpp"
#include "transport/transport.hpp"

namespace gdx {

struct Proxy::Thread {
  /// Commands taken from a ring, and completions reaped from the lane, at a time.
  static constexpr size_t kBatch = 256;
  /// An operation's cookie: its ring (an index into ringIds) above this bit, its tracker entry's sequence below.
  static constexpr int kCookieRingShift = 56;
  static constexpr uint64_t kCookieSeqMask = (uint64_t{1} << kCookieRingShift) - 1;

  int index = 0;
  std::vector<int> ringIds;  // global ring indexes owned by this thread
  std::vector<CompletionTracker> trackers;
  std::vector<uint64_t> published;
  TransportLane* lane = nullptr;
  std::thread thread;
  std::atomic<uint64_t> commands{0}, bytes{0}, errors{0}, batches{0}, writes{0};
  std::atomic<uint64_t> handlingNs{0}, inFlightNs{0};  // Options::timing only
  uint64_t inFlightSince = 0;                          // this thread's: when its lane last went from idle to busy
  Command batch[kBatch];
  Completion done[kBatch];
  std::unique_ptr<TraceBuffer> trace;  // GDX_TRACE only
};

// The operations of one drained batch. They all carry the cookie of the batch's completion-tracker entry, which
// is opened after the batch with the number of operations the lane took: an operation the lane refused (it threw)
// is never counted, so flush() does not wait for it. Completions are reaped by the same thread after the batch,
// so none is counted before its entry exists.
class Proxy::Posting {
 public:
  Posting(Thread& t, size_t ring) : t_(t), ring_(ring), seq_(t.trackers[ring].nextSeq()) {}
  void write(WriteOp w);
  void atomic(AtomicOp a);
  void message(MessageOp m);
  /// Opens the batch's entry: positions up to `endPos` are done once the posted operations complete.
  void close(uint64_t endPos);

 private:
  uint64_t cookie() const { return (static_cast<uint64_t>(ring_) << Thread::kCookieRingShift) | seq_; }
  Thread& t_;
  size_t ring_;
  uint64_t seq_;
  uint32_t posted_ = 0;
  uint32_t writes_ = 0;
  uint64_t bytes_ = 0;
};

/// A signal command, or a pair's signal slot.
inline bool isSignal(const Command& c) {
  return c.opcode() == Opcode::kSignalSet || c.opcode() == Opcode::kSignalAdd;
}

/// The write of a put (or of the first slot of a putWithSignal or relayPut); the caller adds the immediate.
inline WriteOp writeOf(const Command& c) {
  WriteOp w;
  w.peer = static_cast<int>(c.peer());
  w.localWindow = c.srcWindow();
  w.localOffset = c.srcOffset();
  w.remoteWindow = c.dstWindow();
  w.remoteOffset = c.dstOffset();
  w.bytes = c.size();
  return w;
}

/// A command as error messages name it: its opcode, peer and fields.
std::string describe(const Command& c);

}  // namespace gdx
