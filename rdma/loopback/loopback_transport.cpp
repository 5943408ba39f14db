// The loopback backend of gdx::Transport, for a world of one: the thinnest transport there is, so that a benchmark
// of kernel -> ring -> proxy -> transport -> same GPU measures the rest of the path.
//
// post() validates a write exactly as the TCP backend does (everything that can be wrong is refused with
// kInvalidArgument before anything happens), then performs it at once in the calling thread: memmove between host
// windows (a window may be written from itself, so the ranges may overlap), cudaMemcpyAsync on the lane's own
// stream plus a bounded wait when either window is GPU memory. Then, for a write-with-immediate, it calls the
// ImmHandler from that same thread, and finally queues the Completion that poll() hands back. postAtomic()
// performs the atomic right there with the system-scope helpers of gdx/atomic.hpp (release), and refuses GPU
// windows. postMessage() hands the message to the MessageHandler from that same thread and queues its Completion,
// as it does for an immediate.
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

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "gdx/detail/atomic.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/detail/transport.hpp"
#include "rdma/common/cuda_staging.hpp"
#include "rdma/tcp/wire.hpp"

namespace gdx {

LoopbackTransportOptions LoopbackTransportOptions::fromEnv() {
  LoopbackTransportOptions o;
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

namespace loopback {
namespace {

using tcp::checkRange;
using tcp::kAtomicBytes;

constexpr int kRank = 0;  ///< a world of one
constexpr uint64_t kAtomicWordBytes = kAtomicBytes;

std::string windowKey(uint32_t id, uint64_t bytes, bool cuda) {
  return "loopback:" + std::to_string(id) + ":" + std::to_string(bytes) + (cuda ? ":cuda" : "");
}

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

class LoopbackTransport : public Transport {
 public:
  explicit LoopbackTransport(const LoopbackTransportOptions& options) : options_(options) {
    if (options.timeoutNs == 0)
      throw Error(ErrorCode::kInvalidArgument, "loopback transport: timeoutNs must be positive");
    static std::atomic<uint64_t> instances{0};
    address_ = "loopback:" + std::to_string(::getpid()) + ":" + std::to_string(instances.fetch_add(1));
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
    if (kind != MemoryKind::kHost && kind != MemoryKind::kCuda)
      throw Error(ErrorCode::kInvalidArgument, w + ": unknown memory kind");
    if (base == nullptr && bytes > 0) throw Error(ErrorCode::kInvalidArgument, w + ": null base");
    Window win{static_cast<char*>(base), bytes, kind, -1};
    // Throws when the memory is not on a GPU, or when gdx was built without CUDA.
    if (kind == MemoryKind::kCuda) win.device = common::cudaWindowDevice(base, bytes, w);
    std::unique_lock<std::shared_mutex> lock(windowsMutex_);
    if (!windows_.emplace(id, win).second) throw Error(ErrorCode::kInvalidArgument, w + " is already registered");
    return windowKey(id, bytes, kind == MemoryKind::kCuda);
  }
  void deregisterWindow(uint32_t id) override {
    std::unique_lock<std::shared_mutex> lock(windowsMutex_);
    if (windows_.erase(id) == 0)
      throw Error(ErrorCode::kInvalidArgument, who() + ": window " + std::to_string(id) + " is not registered");
  }
  void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) override {
    if (peer != kRank)
      throw Error(ErrorCode::kInvalidArgument, who() + ": remote window " + std::to_string(id) + " of unknown peer " +
                                                   std::to_string(peer) + " (world size 1)");
    const bool cuda = key == windowKey(id, bytes, true);
    if (!key.empty() && !cuda && key != windowKey(id, bytes, false))
      throw Error(ErrorCode::kInvalidArgument, who() + ": key '" + key + "' of peer " + std::to_string(peer) +
                                                   " does not describe window " + std::to_string(id) + " of " +
                                                   std::to_string(bytes) + " bytes");
    std::unique_lock<std::shared_mutex> lock(windowsMutex_);
    remoteWindows_[id] = RemoteWindow{bytes, cuda};
  }

  void setImmHandler(ImmHandler handler) override { immHandler_ = std::move(handler); }
  void setMessageHandler(MessageHandler handler) override { messageHandler_ = std::move(handler); }
  void setPeerFailureHandler(PeerFailureHandler handler) override {
    std::lock_guard<std::mutex> lock(failureMutex_);
    failureHandler_ = std::move(handler);
  }
  Status peerStatus(int peer) const override {
    if (peer != kRank) return Status::kInvalidArgument;
    if (failed_.load()) return Status::kPeerFailed;
    return stopping_.load() ? Status::kShutdown : Status::kOk;
  }

  void shutdown() override { stopping_.store(true); }

 private:
  friend class LoopbackLane;
  struct Window {
    char* base = nullptr;
    uint64_t bytes = 0;
    MemoryKind kind = MemoryKind::kHost;
    int device = -1;
  };
  struct RemoteWindow {
    uint64_t bytes = 0;
    bool cuda = false;
  };

  static std::string who() { return "loopback transport rank " + std::to_string(kRank); }

  /// kOk, or what every op posted now completes with instead of being performed.
  Status refusal() const {
    if (failed_.load(std::memory_order_relaxed)) return Status::kPeerFailed;
    return stopping_.load(std::memory_order_relaxed) ? Status::kShutdown : Status::kOk;
  }

  void failPeer(const std::string& why) {
    if (failed_.exchange(true)) return;
    GDX_ERROR(who() << ": failed: " << why);
    PeerFailureHandler handler;
    {
      std::lock_guard<std::mutex> lock(failureMutex_);
      handler = failureHandler_;
    }
    if (handler) handler(kRank, why);
  }

  const LoopbackTransportOptions options_;
  std::string address_;
  bool connectStarted_ = false;
  bool connected_ = false;
  std::vector<std::unique_ptr<LoopbackLane>> lanes_;

  ImmHandler immHandler_;
  MessageHandler messageHandler_;
  std::mutex failureMutex_;
  PeerFailureHandler failureHandler_;

  mutable std::shared_mutex windowsMutex_;
  std::unordered_map<uint32_t, Window> windows_;
  std::unordered_map<uint32_t, RemoteWindow> remoteWindows_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> failed_{false};
};

void LoopbackLane::post(const WriteOp& op) {
  auto invalid = [&](const std::string& what) {
    std::ostringstream os;
    os << LoopbackTransport::who() << " lane " << index_ << ": write to peer " << op.peer << " (local window "
       << op.localWindow << " offset " << op.localOffset << ", remote window " << op.remoteWindow << " offset "
       << op.remoteOffset << ", " << op.bytes << " bytes): " << what;
    throw Error(ErrorCode::kInvalidArgument, os.str());
  };
  if (!t_.connected_) invalid("the transport is not connected");
  if (op.peer != kRank) invalid("unknown peer (world size 1)");
  if (op.bytes == 0) invalid("zero-byte write");
  const char* src = nullptr;
  char* dst = nullptr;
  int device = -1;  // >= 0: a GPU window is involved; the copy runs on the lane's stream of this device
  {
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    auto local = t_.windows_.find(op.localWindow);
    if (local == t_.windows_.end()) invalid("local window " + std::to_string(op.localWindow) + " is not registered");
    std::string bad = checkRange(op.localOffset, op.bytes, local->second.bytes);
    if (!bad.empty()) invalid("local window " + std::to_string(op.localWindow) + ": " + bad);
    auto remote = t_.remoteWindows_.find(op.remoteWindow);
    if (remote == t_.remoteWindows_.end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " of peer " + std::to_string(kRank) +
              " is not known");
    bad = checkRange(op.remoteOffset, op.bytes, remote->second.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + ": " + bad);
    // The receiver's checks, done here since the receiver is this very object.
    auto target = t_.windows_.find(op.remoteWindow);
    if (target == t_.windows_.end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " is not registered here");
    bad = checkRange(op.remoteOffset, op.bytes, target->second.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + " as registered: " + bad);
    src = local->second.base + op.localOffset;
    dst = target->second.base + op.remoteOffset;
    if (target->second.kind == MemoryKind::kCuda)
      device = target->second.device;
    else if (local->second.kind == MemoryKind::kCuda)
      device = local->second.device;
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
  if (status == Status::kOk && op.withImm && t_.immHandler_) {
    try {
      t_.immHandler_(RemoteWrite{kRank, op.remoteWindow, op.remoteOffset, op.bytes, op.imm});
    } catch (const std::exception& e) {
      // As in the TCP backend, a throwing handler is reported and does not fail the write.
      GDX_ERROR(LoopbackTransport::who() << " lane " << index_ << ": the immediate handler threw: " << e.what());
    }
  }
  complete(op.cookie, status);
}

void LoopbackLane::postAtomic(const AtomicOp& op) {
  auto invalid = [&](const std::string& what) {
    std::ostringstream os;
    os << LoopbackTransport::who() << " lane " << index_ << ": atomic on peer " << op.peer << " (remote window "
       << op.remoteWindow << " offset " << op.remoteOffset << ", kind " << static_cast<int>(op.kind) << ", value "
       << op.value << "): " << what;
    throw Error(ErrorCode::kInvalidArgument, os.str());
  };
  if (!t_.connected_) invalid("the transport is not connected");
  if (op.peer != kRank) invalid("unknown peer (world size 1)");
  if (op.kind != SignalOp::kAdd && op.kind != SignalOp::kSet) invalid("unknown atomic kind");
  if (op.remoteOffset % kAtomicWordBytes != 0) invalid("the offset is not 8-byte aligned");
  uint64_t* word = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    auto remote = t_.remoteWindows_.find(op.remoteWindow);
    if (remote == t_.remoteWindows_.end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " of peer " + std::to_string(kRank) +
              " is not known");
    std::string bad = checkRange(op.remoteOffset, kAtomicWordBytes, remote->second.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + ": " + bad);
    if (remote->second.cuda) invalid("atomics on GPU windows are not supported by the loopback transport");
    auto target = t_.windows_.find(op.remoteWindow);
    if (target == t_.windows_.end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " is not registered here");
    bad = checkRange(op.remoteOffset, kAtomicWordBytes, target->second.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + " as registered: " + bad);
    if (target->second.kind == MemoryKind::kCuda)
      invalid("atomics on GPU windows are not supported by the loopback transport");
    char* p = target->second.base + op.remoteOffset;
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0)
      invalid("the word is not 8-byte aligned in memory (the window starts at an unaligned address)");
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
  std::string bad = t_.connected_ ? tcp::checkMessageOp(op.peer, op.bytes, 1) : "the transport is not connected";
  if (!bad.empty())
    throw Error(ErrorCode::kInvalidArgument, LoopbackTransport::who() + " lane " + std::to_string(index_) +
                                                 ": message to peer " + std::to_string(op.peer) + ": " + bad);
  Status status = t_.refusal();
  if (status == Status::kOk) {
    // Every earlier op of this lane is complete already (see the ordering note above).
    RemoteMessage m;
    m.peer = kRank;
    m.bytes = op.bytes;
    std::memcpy(m.data, op.data, op.bytes);
    tcp::deliverMessage(t_.messageHandler_, m, LoopbackTransport::who() + " lane " + std::to_string(index_));
  }
  complete(op.cookie, status);
}

size_t LoopbackLane::poll(Completion* out, size_t max) {
  size_t n = std::min(max, done_.size());
  std::copy_n(done_.begin(), n, out);
  done_.erase(done_.begin(), done_.begin() + static_cast<std::ptrdiff_t>(n));
  inFlight_.store(inFlight_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  return n;
}

}  // namespace
}  // namespace loopback

std::unique_ptr<Transport> makeLoopbackTransport(const LoopbackTransportOptions& options) {
  return std::make_unique<loopback::LoopbackTransport>(options);
}

}  // namespace gdx
