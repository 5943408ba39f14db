// The loopback backend of gdx::Transport, for a world of one: the thinnest transport there is, so that a benchmark
// of kernel -> ring -> proxy -> transport -> same GPU measures the rest of the path.
//
// post() validates a write with the checks every backend shares (transport/common/; everything that can be wrong is
// refused with kInvalidArgument before anything happens) plus the receiver's, since the receiver is this transport too.
// Then it performs the write at once in the calling thread: memmove between host windows (a window may be written from
// itself, so the ranges may overlap), cudaMemcpyAsync on the lane's own stream plus a bounded wait when either window
// is GPU memory. Then, for a write-with-immediate, it calls the ImmHandler from that same thread, and finally queues
// the Completion that poll() hands back. postAtomic() performs the atomic right there with the system-scope helpers of
// gdx/atomic.hpp (release), and refuses GPU windows. postMessage() hands the message to the MessageHandler from that
// same thread and queues its Completion, as it does for an immediate.
//
// Ordering: a lane is used by one thread, and each of its operations is complete (data in place, atomic
// performed) before post()/postAtomic() returns, in posting order. So every earlier write and atomic of the lane
// is in place when an immediate is announced or an atomic performed: the contract of transport.hpp holds
// trivially, per lane and even across the lanes of whoever synchronizes with the posting threads.
//
// There is no thread of its own. A failed GPU copy marks the one peer (this rank) failed, as a TCP transport
// thread does when staging fails: the PeerFailureHandler runs once, and the op and every later one complete with
// kPeerFailed.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/error.hpp"
#include "transport/common/cuda_staging.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/common/window_table.hpp"
#include "transport/transport.hpp"

namespace gdx {

LoopbackTransportOptions LoopbackTransportOptions::fromEnv() {
  LoopbackTransportOptions o;
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

namespace loopback {
namespace {

using common::checkRange;
using common::kAtomicWordBytes;

constexpr int kRank = 0;  ///< a world of one
/// Windows are addressed by id and offset only (common::windowKey()).
constexpr char kKeyScheme[] = "loopback";

class LoopbackTransport;

class LoopbackLane : public TransportLane {
 public:
  LoopbackLane(LoopbackTransport& transport, int index, uint64_t timeoutNs)
      : t_(transport), index_(index), copier_(timeoutNs) {}
  void post(const WriteOp& op) override;
  void postAtomic(const AtomicOp& op) override;
  void postMessage(const MessageOp& op) override;
  size_t poll(Completion* out, size_t max) override;
  size_t inFlight() const override { return inFlight_.load(std::memory_order_relaxed); }

 private:
  /// "loopback transport rank 0 lane L", the start of the lane's errors.
  std::string who() const;
  /// The receiver's checks of [offset, offset + bytes) in window `window`, done by the sender since the receiver is
  /// this very transport: the window as registered here; null with `*why` when it is not or the range exceeds it.
  const common::LocalWindow* target(uint32_t window, uint64_t offset, uint64_t bytes, std::string* why) const;
  void complete(uint64_t cookie, Status status) {
    done_.push_back(Completion{cookie, status, kRank});
    // One thread posts and polls, so a plain store suffices (no locked read-modify-write); the atomic only lets
    // other threads read inFlight() for diagnostics.
    inFlight_.store(inFlight_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  LoopbackTransport& t_;
  const int index_;
  std::deque<Completion> done_;
  std::atomic<size_t> inFlight_{0};
  common::CudaCopier copier_;  ///< the lane's streams (one per device, created on first use)
};

class LoopbackTransport : public common::TransportBase {
 public:
  explicit LoopbackTransport(const LoopbackTransportOptions& options) : options_(options) {
    if (options.timeoutNs == 0)
      throw Error(ErrorCode::kInvalidArgument, "loopback transport: timeoutNs must be positive");
    static std::atomic<uint64_t> instances{0};
    address_ = "loopback:" + std::to_string(::getpid()) + ":" + std::to_string(instances.fetch_add(1));
    windows_.setPeers(1);
  }
  ~LoopbackTransport() override { shutdown(); }

  std::string name() const override { return "loopback"; }
  std::string localAddress() override { return address_; }

  void connect(const std::vector<std::string>& addresses, int lanes) override {
    if (connectStarted_) throw Error(ErrorCode::kInvalidArgument, who() + ": connect() may be called once");
    if (addresses.size() != 1 || addresses[0] != address_)
      throw Error(ErrorCode::kInvalidArgument, who() +
                                                   ": connect() takes exactly one address, this transport's own ('" +
                                                   address_ + "'), got " + std::to_string(addresses.size()) +
                                                   (addresses.empty() ? "" : " starting with '" + addresses[0] + "'"));
    if (lanes < 1 || lanes > 1024)
      throw Error(ErrorCode::kInvalidArgument,
                  who() + ": lane count " + std::to_string(lanes) + " must be in [1, 1024]");
    if (stopping_.load()) throw Error(ErrorCode::kShutdown, who() + ": connect() after shutdown()");
    connectStarted_ = true;
    for (int l = 0; l < lanes; ++l) lanes_.push_back(std::make_unique<LoopbackLane>(*this, l, options_.timeoutNs));
    connected_ = true;
  }
  int numLanes() const override { return connected_ ? static_cast<int>(lanes_.size()) : 0; }
  TransportLane& lane(int index) override {
    if (!connected_ || index < 0 || index >= static_cast<int>(lanes_.size()))
      throw Error(ErrorCode::kInvalidArgument, who() + ": lane " + std::to_string(index) + " does not exist (" +
                                                   std::to_string(lanes_.size()) + " lanes connected)");
    return *lanes_[index];
  }

  std::string registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) override {
    std::string w = who() + ": window " + std::to_string(id);
    common::LocalWindow window = common::cpuWindow(w, base, bytes, kind);
    std::unique_lock<std::shared_mutex> lock(windows_.mutex());
    windows_.addLocal(id, window, w);
    return common::windowKey(kKeyScheme, id, bytes, kind == MemoryKind::kCuda, base);
  }
  void deregisterWindow(uint32_t id) override {
    std::unique_lock<std::shared_mutex> lock(windows_.mutex());
    windows_.removeLocal(id, who());
  }
  void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) override {
    if (peer != kRank)
      throw Error(ErrorCode::kInvalidArgument, who() + ": remote window " + std::to_string(id) + " of unknown peer " +
                                                   std::to_string(peer) + " (world size 1)");
    common::RemoteWindow window = common::parseWindowKey(who(), kKeyScheme, peer, id, bytes, key);
    std::unique_lock<std::shared_mutex> lock(windows_.mutex());
    windows_.setRemote(kRank, id, window);
  }

  Status peerStatus(int peer) const override {
    if (peer != kRank) return Status::kInvalidArgument;
    if (failed_.load()) return Status::kPeerFailed;
    return stopping_.load() ? Status::kShutdown : Status::kOk;
  }

  void shutdown() override { stopping_.store(true); }

 private:
  friend class LoopbackLane;

  static std::string who() { return "loopback transport rank " + std::to_string(kRank); }

  /// kOk, or what every op posted now completes with instead of being performed.
  Status refusal() const {
    if (failed_.load(std::memory_order_relaxed)) return Status::kPeerFailed;
    return stopping_.load(std::memory_order_relaxed) ? Status::kShutdown : Status::kOk;
  }

  void failPeer(const std::string& why) {
    if (failed_.exchange(true)) return;
    GDX_ERROR(who() << ": failed: " << why);
    failureHandler_.notify(kRank, why);
  }

  const LoopbackTransportOptions options_;
  std::string address_;
  bool connectStarted_ = false;
  bool connected_ = false;
  std::vector<std::unique_ptr<LoopbackLane>> lanes_;

  common::WindowTable<> windows_;  ///< remote windows: those of peer kRank, i.e. this transport's own again

  std::atomic<bool> stopping_{false};
  std::atomic<bool> failed_{false};
};

std::string LoopbackLane::who() const {
  return LoopbackTransport::who() + " lane " + std::to_string(index_);
}

const common::LocalWindow* LoopbackLane::target(uint32_t window, uint64_t offset, uint64_t bytes,
                                                std::string* why) const {
  const common::LocalWindow* w = t_.windows_.local(window);
  if (w == nullptr) {
    *why = "remote window " + std::to_string(window) + " is not registered here";
    return nullptr;
  }
  std::string bad = checkRange(offset, bytes, w->bytes);
  if (bad.empty()) return w;
  *why = "remote window " + std::to_string(window) + " as registered: " + bad;
  return nullptr;
}

void LoopbackLane::post(const WriteOp& op) {
  std::string bad = common::checkWriteOp(op, t_.connected_, 1);
  if (!bad.empty()) common::refuseWrite(who(), op, bad);
  const char* src = nullptr;
  char* dst = nullptr;
  int device = -1;  // >= 0: a GPU window is involved; the copy runs on the lane's stream of this device
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    const common::LocalWindow* local = t_.windows_.findWrite(op, &bad).local;
    const common::LocalWindow* dstWindow = local ? target(op.remoteWindow, op.remoteOffset, op.bytes, &bad) : nullptr;
    if (!dstWindow) common::refuseWrite(who(), op, bad);
    src = local->base + op.localOffset;
    dst = dstWindow->base + op.remoteOffset;
    if (dstWindow->kind == MemoryKind::kCuda)
      device = dstWindow->device;
    else if (local->kind == MemoryKind::kCuda)
      device = local->device;
  }
  Status status = t_.refusal();
  if (status == Status::kOk) {
    if (device < 0) {
      std::memmove(dst, src, op.bytes);
    } else {
      std::string why = copier_.copy(dst, src, op.bytes, device);
      if (!why.empty()) {
        t_.failPeer("lane " + std::to_string(index_) + ": " + why);
        status = Status::kPeerFailed;
      }
    }
  }
  // As in the other backends, a throwing handler is reported and does not fail the write.
  if (status == Status::kOk && op.withImm)
    common::announce(t_.immHandler_, RemoteWrite{kRank, op.remoteWindow, op.remoteOffset, op.bytes, op.imm},
                     [this] { return who(); });
  complete(op.cookie, status);
}

void LoopbackLane::postAtomic(const AtomicOp& op) {
  std::string bad = common::checkAtomicOp(op, t_.connected_, 1);
  if (!bad.empty()) common::refuseAtomic(who(), op, bad);
  uint64_t* word = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    const common::LocalWindow* w = nullptr;
    if (t_.windows_.findAtomicTarget(op, "loopback", &bad))
      w = target(op.remoteWindow, op.remoteOffset, kAtomicWordBytes, &bad);
    if (!w) common::refuseAtomic(who(), op, bad);
    if (w->kind == MemoryKind::kCuda) common::refuseAtomic(who(), op, common::gpuAtomicRefusal("loopback"));
    char* p = w->base + op.remoteOffset;
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0)
      common::refuseAtomic(who(), op,
                           "the word is not 8-byte aligned in memory (the window starts at an unaligned address)");
    word = reinterpret_cast<uint64_t*>(p);
  }
  Status status = t_.refusal();
  if (status == Status::kOk) {
    // Release: whoever acquires the word sees every write this lane performed before (and, as everything here
    // happens in the posting thread, everything that thread did before).
    if (op.kind == SignalOp::kAdd)
      atomicFetchAdd(word, op.value, kRelease);
    else
      atomicStore(word, op.value, kRelease);
  }
  complete(op.cookie, status);
}

void LoopbackLane::postMessage(const MessageOp& op) {
  std::string bad = common::checkMessageOp(op, t_.connected_, 1);
  if (!bad.empty()) common::refuseMessage(who(), op, bad);
  Status status = t_.refusal();
  if (status == Status::kOk) {
    // Every earlier op of this lane is complete already (see the ordering note above).
    RemoteMessage m;
    m.peer = kRank;
    m.bytes = op.bytes;
    std::memcpy(m.data, op.data, op.bytes);
    common::deliverMessage(t_.messageHandler_, m, [this] { return who(); });
  }
  complete(op.cookie, status);
}

size_t LoopbackLane::poll(Completion* out, size_t max) {
  const size_t n = common::takeCompletions(done_, out, max);
  inFlight_.store(inFlight_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  return n;
}

}  // namespace
}  // namespace loopback

std::unique_ptr<Transport> makeLoopbackTransport(const LoopbackTransportOptions& options) {
  return std::make_unique<loopback::LoopbackTransport>(options);
}

}  // namespace gdx
