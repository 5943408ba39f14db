#include "base/command_ring.hpp"

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include "base/cuda_check.hpp"
#endif

namespace gdx {
namespace {
// Control block after the slots: every counter on its own 128-byte line so that producers hammering head do
// not slow the consumer's tail and completion stores (and PCIe reads from the GPU stay one line each).
constexpr size_t kLine = 128;
constexpr size_t kHeadOffset = 0 * kLine;
constexpr size_t kCachedTailOffset = 1 * kLine;
constexpr size_t kTailOffset = 2 * kLine;
constexpr size_t kCompletedOffset = 3 * kLine;
constexpr size_t kErrorOffset = 4 * kLine;
constexpr size_t kControlBytes = 5 * kLine;  // the fault records follow

uint64_t checkedCapacity(uint64_t c) {
  if (c < 2 || (c & (c - 1)) != 0)
    throw Error(ErrorCode::kInvalidArgument, "ring capacity " + std::to_string(c) + " is not a power of two >= 2");
  return c;
}
}  // namespace

CommandRing::CommandRing(const Options& o)
    : capacity_(checkedCapacity(o.capacity)),
      timeoutNs_(o.timeoutNs),
      memory_(capacity_ * sizeof(Command) + kControlBytes + size_t{o.numPeers} * sizeof(RingFault), o.numaNode,
              /*mapForGpu=*/true) {
  auto* base = static_cast<char*>(memory_.data());
  slots_ = reinterpret_cast<Command*>(base);
  char* control = base + capacity_ * sizeof(Command);
  head_ = reinterpret_cast<uint64_t*>(control + kHeadOffset);
  cachedTail_ = reinterpret_cast<uint64_t*>(control + kCachedTailOffset);
  tail_ = reinterpret_cast<uint64_t*>(control + kTailOffset);
  completed_ = reinterpret_cast<uint64_t*>(control + kCompletedOffset);
  error_ = reinterpret_cast<uint32_t*>(control + kErrorOffset);
  faults_ = o.numPeers ? reinterpret_cast<RingFault*>(control + kControlBytes) : nullptr;
  numPeers_ = o.numPeers;
  if (o.deviceProducers) {
#if defined(GDX_HAVE_CUDA)
    if (!memory_.gpuMapped())
      throw Error(ErrorCode::kInvalidArgument, "a ring for GPU producers needs a GPU and host-mapped memory");
    void* p = nullptr;
    GDX_CUDA_CHECK(cudaMalloc(&p, 2 * kLine));
    GDX_CUDA_CHECK(cudaMemset(p, 0, 2 * kLine));
    deviceCounters_ = static_cast<uint64_t*>(p);
#else
    throw Error(ErrorCode::kInvalidArgument, "a ring for GPU producers needs gdx built with CUDA");
#endif
  }
}

CommandRing::~CommandRing() {
#if defined(GDX_HAVE_CUDA)
  if (deviceCounters_) {
    cudaError_t rc = cudaFree(deviceCounters_);
    if (rc != cudaSuccess) GDX_WARN("cudaFree of ring counters failed: " << cudaGetErrorString(rc));
  }
#endif
}

RingDeviceHandle CommandRing::hostHandle() const {
  if (deviceCounters_) throw Error(ErrorCode::kInvalidArgument, "this ring takes commands from GPU threads only");
  return RingDeviceHandle{slots_, head_,     cachedTail_, tail_,   completed_,
                          error_, capacity_, timeoutNs_,  faults_, numPeers_};
}

RingDeviceHandle CommandRing::deviceHandle() const {
  if (!deviceCounters_) throw Error(ErrorCode::kInvalidArgument, "this ring takes commands from host threads only");
  // The GPU reaches the host-mapped block through its own address for it.
  return RingDeviceHandle{memory_.deviceAddressOf(slots_),
                          deviceCounters_,
                          deviceCounters_ + kLine / sizeof(uint64_t),
                          memory_.deviceAddressOf(tail_),
                          memory_.deviceAddressOf(completed_),
                          memory_.deviceAddressOf(error_),
                          capacity_,
                          timeoutNs_,
                          faults_ ? memory_.deviceAddressOf(faults_) : nullptr,
                          numPeers_};
}

uint64_t CommandRing::reserved() const {
  if (!deviceCounters_) return atomicLoad(head_, kAcquire);
#if defined(GDX_HAVE_CUDA)
  // Not the legacy default stream, which would wait for every kernel: one that is still producing into this ring
  // (or waiting for it) must not make the read wait. Closing reports only, so a stream per call is fine.
  cudaStream_t stream = nullptr;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t head = 0;
  cudaError_t rc = cudaMemcpyAsync(&head, deviceCounters_, sizeof head, cudaMemcpyDeviceToHost, stream);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  GDX_CUDA_CHECK(rc);
  return head;
#else
  return 0;
#endif
}

uint64_t CommandRing::completedPositions() const {
  return atomicLoad(completed_, kAcquire) & ~kCompletedHasFaults;
}

bool CommandRing::readSlot(uint64_t pos, Command* out) const {
  const Command* slot = &slots_[pos & (capacity_ - 1)];
  Command c;
  // Word 0 is stored last by producers (release), so reading it first with acquire makes word 1 current too;
  // the lap check on both words still catches a producer that publishes them in the other order.
  c.word[0] = atomicLoad(const_cast<uint64_t*>(&slot->word[0]), kAcquire);
  c.word[1] = atomicLoad(const_cast<uint64_t*>(&slot->word[1]), kAcquire);
  if (!c.lapsAgree(RingDeviceHandle::lapOf(pos, capacity_))) return false;
  *out = c;
  return true;
}

size_t CommandRing::poll(Command* out, size_t max) {
  size_t n = 0;
  while (n < max) {
    Command c;
    if (!readSlot(localTail_, &c)) break;
    if (slotsFor(c.opcode()) == 2) {
      Command s;
      if (n + 2 > max || !readSlot(localTail_ + 1, &s)) break;
      out[n++] = c;
      out[n++] = s;
      localTail_ += 2;
    } else {
      out[n++] = c;
      localTail_ += 1;
    }
  }
  return n;
}

void CommandRing::publishTail() {
  atomicStore(tail_, localTail_, kRelease);
}

void CommandRing::publishCompleted(uint64_t upTo) {
  atomicStore(completed_, upTo | (hasFaults_ ? kCompletedHasFaults : 0), kRelease);
}

void CommandRing::recordFault(uint32_t peer, uint64_t position, Status status) {
  if (peer >= numPeers_) {
    setError(status);
    return;
  }
  RingFault& f = faults_[peer];
  // The status first, then the position (release): a flush that sees the position sees this status or a later one.
  atomicStore(&f.status, static_cast<uint32_t>(status), kRelaxed);
  if (position + 1 > atomicLoad(&f.lastFailed, kRelaxed)) atomicStore(&f.lastFailed, position + 1, kRelease);
  hasFaults_ = true;
}

RingFault CommandRing::fault(uint32_t peer) const {
  if (peer >= numPeers_) return RingFault{};
  return RingFault{atomicLoad(&faults_[peer].lastFailed, kAcquire), atomicLoad(&faults_[peer].status, kRelaxed), 0};
}

void CommandRing::setError(Status status) {
  setErrorOnce(error_, status);
}

Status CommandRing::error() const {
  return static_cast<Status>(atomicLoad(error_, kAcquire));
}

}  // namespace gdx
