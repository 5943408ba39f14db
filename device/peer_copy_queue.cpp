// Host side of PeerCopyQueue (include/gdx/peer_copy_queue.hpp); the protocol it shares with the persistent
// kernel is described in device/copy_queue_layout.hpp.
#include "gdx/peer_copy_queue.hpp"

#include <atomic>
#include <sstream>

#include "base/host_buffer.hpp"
#include "base/log.hpp"
#include "device/copy_queue_layout.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "base/cuda_check.hpp"
#include "base/device_guard.hpp"
#endif

namespace gdx {

PeerCopyQueue::Options PeerCopyQueue::Options::fromEnv() {
  Options o;
  o.blocks = static_cast<unsigned>(envInt("GDX_COPY_QUEUE_BLOCKS", o.blocks));
  o.capacity = static_cast<uint32_t>(envInt("GDX_COPY_QUEUE_DEPTH", o.capacity));
  o.chunkBytes = static_cast<uint64_t>(envInt("GDX_COPY_QUEUE_CHUNK", static_cast<int64_t>(o.chunkBytes)));
  o.idleNs = static_cast<uint64_t>(envInt("GDX_COPY_QUEUE_IDLE_US", static_cast<int64_t>(o.idleNs / 1000))) * 1000;
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

#if defined(GDX_HAVE_CUDA)
namespace {

copy_queue::Shared& sharedOf(const std::unique_ptr<HostBuffer>& b) {
  return *static_cast<copy_queue::Shared*>(b->data());
}

}  // namespace

PeerCopyQueue::PeerCopyQueue(int device, const Options& options) : device_(device), options_(options) {
  if (options_.blocks == 0 || options_.blocks > 1024)
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue: blocks (GDX_COPY_QUEUE_BLOCKS) " +
                                                 std::to_string(options_.blocks) + " must be in 1..1024");
  if (options_.capacity < 2 || options_.capacity > (1u << 24))
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue: capacity (GDX_COPY_QUEUE_DEPTH) " +
                                                 std::to_string(options_.capacity) + " must be in 2..2^24");
  // Rounded up to a power of two: the kernel finds a ticket's slot with a mask (copy_queue_layout.hpp).
  uint32_t rounded = 2;
  while (rounded < options_.capacity) rounded <<= 1;  // at most 2^24, checked above
  options_.capacity = rounded;
  if (options_.chunkBytes < 16 || options_.chunkBytes % 16 != 0 || options_.chunkBytes > (uint64_t{1} << 31))
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue: chunkBytes (GDX_COPY_QUEUE_CHUNK) " +
                                                 std::to_string(options_.chunkBytes) +
                                                 " must be a multiple of 16 in 16..2 GiB");
  if (options_.timeoutNs == 0)
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue: timeoutNs (GDX_TIMEOUT_MS) must be positive");
  DeviceGuard guard(device_);
  // A persistent kernel whose blocks were not all resident would wait for itself.
  const unsigned resident = copy_queue::maxCopyBlocks(device_);
  if (options_.blocks > resident) {
    GDX_WARN("PeerCopyQueue on device " << device_ << ": " << options_.blocks
                                        << " copy blocks cannot all be resident, using " << resident);
    options_.blocks = resident;
  }
  slots_ = std::make_unique<HostBuffer>(sizeof(copy_queue::Slot) * options_.capacity, -1, true);
  shared_ = std::make_unique<HostBuffer>(sizeof(copy_queue::Shared), -1, true);
  if (!slots_->gpuMapped() || !shared_->gpuMapped())
    throw Error(ErrorCode::kCuda,
                "PeerCopyQueue: host memory could not be mapped for device " + std::to_string(device_));
  // The work ring holds every unit the uncompleted transfers can have: capacity transfers of at most `blocks`
  // chunks each (copy_queue_layout.hpp).
  workShift_ = 0;
  while ((uint64_t{1} << workShift_) < uint64_t{options_.capacity} * options_.blocks) ++workShift_;
  if (workShift_ > 24)
    throw Error(ErrorCode::kInvalidArgument,
                "PeerCopyQueue: capacity * blocks must be at most 2^24 (device " + std::to_string(device_) + ")");
  const copy_queue::DeviceLayout layout = copy_queue::deviceLayout(options_.capacity, uint64_t{1} << workShift_);
  GDX_CUDA_CHECK(cudaMalloc(&state_, layout.total));
  cudaStream_t stream = nullptr;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  // On the queue's own stream, so the launches that read the counters come after it; a device-wide synchronise
  // here would wait for whatever else runs on the GPU (a kernel waiting for this queue's transfers: a deadlock).
  GDX_CUDA_CHECK(cudaMemsetAsync(state_, 0, layout.total, stream));
  GDX_CUDA_CHECK(copy_queue::loadKernel());
  cudaEvent_t event = nullptr;
  GDX_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  finished_ = event;
  idle_ = std::thread([this] { idleLoop(); });
}

PeerCopyQueue::~PeerCopyQueue() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    closing_ = true;
    if (running_) {
      try {
        lock.unlock();
        waitCompleted(submitted_);
        lock.lock();
      } catch (const Error& e) {
        lock.lock();
        GDX_ERROR("PeerCopyQueue on device " << device_ << ": stopping with transfers pending: " << e.what());
      }
      try {
        stopLocked();
      } catch (const Error& e) {
        GDX_ERROR("PeerCopyQueue on device " << device_ << ": " << e.what());
      }
    }
  }
  wake_.notify_all();
  if (idle_.joinable()) idle_.join();
  DeviceGuard guard(device_);
  if (finished_) cudaEventDestroy(static_cast<cudaEvent_t>(finished_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (state_) cudaFree(state_);
}

uint64_t PeerCopyQueue::submit(const void* src, void* dst, uint64_t bytes, uint64_t* signal, uint64_t value,
                               SignalOp op) {
  if (bytes > 0 && (src == nullptr || dst == nullptr))
    throw Error(ErrorCode::kInvalidArgument,
                "PeerCopyQueue::submit: null source or destination for " + std::to_string(bytes) + " bytes");
  if (reinterpret_cast<uintptr_t>(signal) % 8 != 0)
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue::submit: signal word not 8-byte aligned");
  // Each field travels in 56 bits beside its slot tag (copy_queue_layout.hpp); CUDA addresses use far fewer.
  constexpr uint64_t kMax = copy_queue::kPayloadMask;
  if (bytes > kMax || reinterpret_cast<uintptr_t>(src) > kMax || reinterpret_cast<uintptr_t>(dst) > kMax ||
      reinterpret_cast<uintptr_t>(signal) > kMax)
    throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue::submit: size or address beyond 56 bits");

  std::unique_lock<std::mutex> lock(mutex_);
  if (closing_) throw Error(ErrorCode::kShutdown, "PeerCopyQueue::submit: the queue is being destroyed");
  if (!running_) launchLocked();
  const uint64_t ticket = submitted_;
  // Slot `ticket % capacity` is free once the transfer `capacity` tickets back completed.
  const uint64_t start = nowNs();
  for (uint64_t spins = 0; ticket >= completed() + options_.capacity; ++spins) {
    if ((spins & 1023) == 1023) kernelFinished("while waiting for a free slot");
    if (nowNs() - start > options_.timeoutNs) {
      std::ostringstream os;
      os << "PeerCopyQueue::submit on device " << device_ << ": no free slot after " << options_.timeoutNs / 1000000
         << " ms (ticket " << ticket << ", completed " << completed() << ", capacity " << options_.capacity << ")";
      throw Error(ErrorCode::kTimeout, os.str());
    }
    spinPause(spins);
  }
  copy_queue::Slot& s = static_cast<copy_queue::Slot*>(slots_->data())[copy_queue::slotOf(ticket, options_.capacity)];
  // What the caller wrote before submitting (the data to copy) is visible before any word of the slot; the poller
  // takes the slot once all six words carry this lap's tag, whatever order they arrive in.
  std::atomic_thread_fence(std::memory_order_release);
  const uint64_t tag = copy_queue::slotTag(ticket, options_.capacity) << copy_queue::kTagShift;
  const uint64_t words[copy_queue::kSlotWords] = {reinterpret_cast<uintptr_t>(src),
                                                  reinterpret_cast<uintptr_t>(dst),
                                                  bytes,
                                                  reinterpret_cast<uintptr_t>(signal),
                                                  (value & 0xFFFFFFFFull) | uint64_t{static_cast<uint8_t>(op)} << 32,
                                                  value >> 32};
  for (unsigned i = 0; i < copy_queue::kSlotWords; ++i) atomicStore(&s.word[i], tag | words[i], kRelaxed);
  submitted_ = ticket + 1;
  lastSubmitNs_ = nowNs();
  return ticket;
}

uint64_t PeerCopyQueue::submitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

uint64_t PeerCopyQueue::completed() const {
  return atomicLoad(&sharedOf(shared_).completed, kAcquire);
}

bool PeerCopyQueue::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

void PeerCopyQueue::waitCompleted(uint64_t count, uint64_t timeoutNs) const {
  if (timeoutNs == 0) timeoutNs = options_.timeoutNs;
  const uint64_t start = nowNs();
  for (uint64_t spins = 0; completed() < count; ++spins) {
    if ((spins & 1023) == 1023) kernelFinished("while waiting for completions");
    if (nowNs() - start > timeoutNs) {
      std::ostringstream os;
      os << "PeerCopyQueue::waitCompleted on device " << device_ << ": waited " << timeoutNs / 1000000 << " ms for "
         << count << " completed transfers, saw " << completed() << " (fault flag "
         << atomicLoad(&sharedOf(shared_).fault, kRelaxed) << ")";
      throw Error(ErrorCode::kTimeout, os.str());
    }
    spinPause(spins);
  }
}

void PeerCopyQueue::launchLocked() {
  DeviceGuard guard(device_);
  copy_queue::Shared& shared = sharedOf(shared_);
  atomicStore(&shared.stop, 0u, kRelease);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  char* base = static_cast<char*>(state_);
  const copy_queue::DeviceLayout layout = copy_queue::deviceLayout(options_.capacity, uint64_t{1} << workShift_);
  // Every transfer of the previous launch completed: its counters, its work entries and the units its blocks
  // claimed without finding work are forgotten, and this launch counts units and tickets afresh.
  GDX_CUDA_CHECK(cudaMemsetAsync(base, 0, layout.desc, stream));
  copy_queue::KernelParams p{};
  p.slots = static_cast<const copy_queue::Slot*>(slots_->devicePtr());
  p.shared = static_cast<copy_queue::Shared*>(shared_->devicePtr());
  p.control = reinterpret_cast<copy_queue::Control*>(base);
  p.doneSeq = reinterpret_cast<uint64_t*>(base + layout.doneSeq);
  p.chunksDone = reinterpret_cast<uint32_t*>(base + layout.chunksDone);
  p.work = reinterpret_cast<copy_queue::Work*>(base + layout.work);
  p.desc = reinterpret_cast<copy_queue::Desc*>(base + layout.desc);
  p.minChunkBytes = options_.chunkBytes;
  p.firstTicket = submitted_;
  p.capacity = options_.capacity;
  p.copyBlocks = options_.blocks;
  p.workShift = workShift_;
  GDX_CUDA_CHECK(copy_queue::launchKernel(p, options_.blocks, stream));
  GDX_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(finished_), stream));
  running_ = true;
  wake_.notify_all();  // the idle watch starts counting
  GDX_DEBUG("PeerCopyQueue on device " << device_ << ": kernel launched at ticket " << submitted_);
}

void PeerCopyQueue::stopLocked() {
  atomicStore(&sharedOf(shared_).stop, 1u, kRelease);
  const uint64_t start = nowNs();
  for (uint64_t spins = 0;; ++spins) {
    if (kernelFinished("while stopping")) break;
    if (nowNs() - start > options_.timeoutNs) {
      std::ostringstream os;
      os << "PeerCopyQueue on device " << device_ << ": the kernel did not leave within "
         << options_.timeoutNs / 1000000 << " ms of being stopped (submitted " << submitted_ << ", completed "
         << completed() << ")";
      throw Error(ErrorCode::kTimeout, os.str());
    }
    spinPause(spins);
  }
  running_ = false;
}

bool PeerCopyQueue::kernelFinished(const char* what) const {
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(finished_));
  if (rc == cudaSuccess) return true;
  if (rc == cudaErrorNotReady) return false;
  throw CudaError(std::string("PeerCopyQueue kernel on device ") + std::to_string(device_) + " " + what, rc,
                  cudaGetErrorString(rc), __FILE__, __LINE__);
}

void PeerCopyQueue::idleLoop() {
  // This thread's CUDA calls (the stop's event queries) are for device_: selected once, or the runtime would make
  // device 0's context for the thread, on another rank's GPU.
  DeviceGuard guard(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!closing_) {
    if (!running_) {
      wake_.wait(lock);
      continue;
    }
    wake_.wait_for(lock, std::chrono::nanoseconds(options_.idleNs));
    if (closing_ || !running_) continue;
    if (completed() == submitted_ && nowNs() - lastSubmitNs_ >= options_.idleNs) {
      try {
        stopLocked();
      } catch (const Error& e) {
        GDX_ERROR(e.what());
        running_ = false;
      }
    }
  }
}

#else  // no CUDA

PeerCopyQueue::PeerCopyQueue(int device, const Options& options) : device_(device), options_(options) {
  throw Error(ErrorCode::kInvalidArgument, "PeerCopyQueue: gdx was built without CUDA");
}
PeerCopyQueue::~PeerCopyQueue() = default;
uint64_t PeerCopyQueue::submit(const void*, void*, uint64_t, uint64_t*, uint64_t, SignalOp) {
  return 0;
}
uint64_t PeerCopyQueue::submitted() const {
  return 0;
}
uint64_t PeerCopyQueue::completed() const {
  return 0;
}
void PeerCopyQueue::waitCompleted(uint64_t, uint64_t) const {}
bool PeerCopyQueue::running() const {
  return false;
}
void PeerCopyQueue::launchLocked() {}
void PeerCopyQueue::stopLocked() {}
void PeerCopyQueue::idleLoop() {}
bool PeerCopyQueue::kernelFinished(const char*) const {
  return true;
}

#endif

}  // namespace gdx
