// The RDMA verbs backend of gdx::Transport (rdma-core libibverbs).
//
// Connections: one RC queue pair per (lane, peer), itself included (a world of one writes through a QP connected
// to itself). The QPs of VerbsTransportOptions::lanes lanes are created at construction, so localAddress() can
// carry their numbers: a header (rank, world, lanes, LID, GID, MTU) and then, for every (lane, peer), the QPN and
// PSN of the QP this rank uses towards that peer. QP (lane l, peer p) of rank r connects to QP (l, r) of rank p.
//
// Sending (the lane's thread only): post() validates against the local and the remote window, splits a write into
// work requests of at most the port's message size, the last one RDMA_WRITE_WITH_IMM when asked, and queues them
// on the QP's software backlog; the backlog is posted (one ibv_post_send per chain) while the QP has fewer than
// `sendDepth` work requests outstanding, so the send queue never overflows. Signalling is selective: every
// `signalEvery`-th work request, the last of every ibv_post_send chain and every RDMA read are signalled. Each QP
// keeps its posted work requests in order (sequence number in wr_id); a completion retires every work request up
// to the one it names (RC completes a send queue in order; errors and flushes are reported for unsignalled work
// requests too), and an op completes once all its work requests retired. Ops that wait in the backlog are posted
// as completions free slots. An idle QP to another rank gets a zero-byte RDMA write every kHeartbeatNs (to the
// first known host window of the peer): a peer that died without a word is thus noticed by the retry error (or
// the completion timeout) even by a rank that only waits.
//
// Staged windows: a GPU window that can be registered neither through dmabuf nor peermem (Soft-RoCE, no
// nvidia-peermem) is staged, and so is every window with stageAllWindows (testing). Its key carries the address
// and rkey of the owner's receive staging area: a credit word per (lane, sender) and then kStageSlots slots of
// kStageSlotBytes per (lane, sender). A write into a staged remote window is cut into slot-sized chunks; each is
// an RDMA_WRITE into the next slot of the ring (lane, this rank) followed by a control SEND naming the slot, the
// window, the offset and (for the last chunk) the immediate. The receiver thread copies the slot into the window
// (cudaMemcpyAsync plus a bounded wait, or memcpy for host memory), then bumps the credit word, then announces the
// immediate: all in QP order, so the data is in place before this or a later immediate is announced or a later
// atomic applied. The sender knows a slot is free when the credit word, which it fetches with an RDMA read when
// it runs out, says so. A write from a staged local window is first copied into one of the lane's kStageSlots
// registered send slots (freed when the work request that reads it retires). post() waits for slots and credits
// (bounded by timeoutNs, making progress on the lane meanwhile).
//
// Receiving: every QP keeps `recvDepth` receives posted, each with a kRecvSlotBytes slot of one registered buffer. One
// thread per transport polls the shared receive CQ (busy for a while, then blocking on a completion channel with a
// short timeout so shutdown stays bounded). An IBV_WC_RECV_RDMA_WITH_IMM becomes an ImmHandler call (RC delivers
// in order, so the write's data and every earlier write of that QP are in place); every consumed receive is
// reposted. The QPs' rnr_retry is infinite (verbs_resources.cpp), so a SEND that finds no receive posted waits for
// the repost instead of failing.
//
// Control messages (postMessage): an IBV_WR_SEND of a MessageRecord (8-byte header and the message's bytes, inline
// when the QP allows it, else from the lane's registered control slots) on the lane's RC QP to the peer. It
// arrives as IBV_WC_RECV in the QP's order, after every earlier write (and staged chunk, and software atomic) of the
// QP, and the receiver thread hands it to the MessageHandler. Messages count as work requests like any other, so
// the completion timeout and the heartbeats watch them too.
//
// Atomics: by default in software, ordered like everything else: an IBV_WR_SEND of a 24-byte control record
// (window, kind, offset, value) arrives as IBV_WC_RECV (never as an immediate, so no imm bit pattern is taken from
// signal_imm.hpp) in the QP's order, and the receiver thread validates it and performs it with a system-scope
// release atomic. With nativeAtomics (GDX_IB_NATIVE_ATOMICS=1) and a device that supports atomics, kAdd is an
// IBV_WR_ATOMIC_FETCH_AND_ADD into the lane's scratch word instead; the NIC then performs it, which is only
// correct when nothing else (a software kSet, an immediate-carried signal update) touches the same word, since
// those are performed by the CPU later than the NIC's own processing.
//
// Failure: a completion with an error status (send or receive side) marks its peer failed with the status string
// and the rank, moves every QP to that peer into the error state (so outstanding work flushes), and runs the
// PeerFailureHandler once. Later and backlogged ops complete with kPeerFailed.
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "gdx/detail/atomic.hpp"
#include "gdx/detail/clock.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/detail/transport.hpp"
#include "rdma/common/cuda_staging.hpp"
#include "rdma/common/delivery.hpp"
#include "rdma/common/op_checks.hpp"
#include "rdma/verbs/verbs_resources.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace gdx {

VerbsTransportOptions VerbsTransportOptions::fromEnv(int rank, int worldSize) {
  VerbsTransportOptions o;
  o.rank = rank;
  o.worldSize = worldSize;
  o.lanes = static_cast<int>(envInt("GDX_PROXY_THREADS", o.lanes));
  o.hca = envString("GDX_IB_HCA", "");
  o.gidIndex = static_cast<int>(envInt("GDX_IB_GID_INDEX", o.gidIndex));
  o.serviceLevel = static_cast<int>(envInt("GDX_IB_SL", o.serviceLevel));
  o.trafficClass = static_cast<int>(envInt("GDX_IB_TC", o.trafficClass));
  o.sendDepth = static_cast<int>(envInt("GDX_IB_SEND_DEPTH", o.sendDepth));
  o.recvDepth = static_cast<int>(envInt("GDX_IB_RECV_DEPTH", o.recvDepth));
  o.timeout = static_cast<int>(envInt("GDX_IB_TIMEOUT", o.timeout));
  o.retryCount = static_cast<int>(envInt("GDX_IB_RETRY_CNT", o.retryCount));
  o.nativeAtomics = envInt("GDX_IB_NATIVE_ATOMICS", 0) != 0;
  o.signalEvery = static_cast<int>(envInt("GDX_IB_SIGNAL_EVERY", o.signalEvery));
  o.stageAllWindows = envInt("GDX_IB_FORCE_STAGING", 0) != 0;
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

namespace verbs {
namespace {

using common::checkRange;

constexpr uint32_t kAddressMagic = 0x56584447;  // "GDXV"
constexpr uint64_t kWordBytes = 8;
/// A receive's buffer and a lane's control send slot: room for a ControlRecord or a MessageRecord.
constexpr size_t kRecvSlotBytes = 128;
constexpr size_t kControlSlotBytes = 128;
constexpr uint32_t kMaxChunk = 1u << 30;
constexpr uint32_t kStageSlots = 4;
constexpr uint64_t kStageSlotBytes = 1 << 20;
constexpr uint64_t kHeartbeatNs = 100ull * 1000 * 1000;
/// A heartbeat unanswered this long (or timeoutNs / 4, if less) fails the peer: it is posted to an idle QP, so
/// nothing queues before it, and some devices (Soft-RoCE) keep retrying a vanished peer far longer.
constexpr uint64_t kHeartbeatTimeoutNs = 2000ull * 1000 * 1000;
constexpr uint32_t kNoOp = 0xffffffffu;
constexpr uint64_t kSeqMask = (uint64_t{1} << 40) - 1;

struct AddressHeader {
  uint32_t magic;
  uint32_t rank;
  uint32_t world;
  uint32_t lanes;
  uint16_t lid;
  uint8_t mtu;
  uint8_t ethernet;
  uint8_t gid[16];
};
struct AddressEntry {
  uint32_t qpn;
  uint32_t psn;
};
/// A window's key as registerWindow() returns it.
struct WindowKey {
  uint64_t addr;
  uint64_t bytes;
  uint32_t rkey;
  uint32_t cuda;
  uint64_t stagingAddr;  ///< staged windows: the owner's receive staging area
  uint32_t stagingRkey;
  uint32_t stagingLanes;  ///< lanes the owner's staging area has rings for
  uint32_t staged;
  uint32_t reserved;
};
/// Control kinds: SignalOp values, then staged chunks.
constexpr uint32_t kControlStaged = 2;
constexpr uint32_t kControlStagedImm = 3;
/// A software atomic or a staged chunk as it travels in an IBV_WR_SEND.
struct ControlRecord {
  uint32_t window;
  uint32_t kind;
  uint64_t offset;
  uint64_t value;  ///< atomics: the operand; staged chunks: the byte count
  uint32_t slot;   ///< staged chunks: the slot of the ring (lane, sender)
  uint32_t imm;    ///< kControlStagedImm: the immediate announced once the chunk is in place
};
static_assert(sizeof(ControlRecord) <= kRecvSlotBytes && sizeof(ControlRecord) <= kControlSlotBytes, "slot size");
/// The control kind of a MessageRecord.
constexpr uint32_t kControlMessage = 4;
/// A control message as it travels in an IBV_WR_SEND: the header and then only `bytes` bytes of data. `kind` lies
/// where a ControlRecord has it, so the receiver tells the two apart by it (their lengths may coincide).
struct MessageRecord {
  uint32_t bytes;  ///< 1..kMaxMessageBytes
  uint32_t kind;   ///< kControlMessage
  uint8_t data[kMaxMessageBytes];
};
constexpr uint32_t kMessageHeaderBytes = offsetof(MessageRecord, data);
static_assert(offsetof(MessageRecord, kind) == offsetof(ControlRecord, kind), "the kind must be where both have it");
static_assert(sizeof(MessageRecord) <= kRecvSlotBytes && sizeof(MessageRecord) <= kControlSlotBytes, "slot size");

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;
AlignedBuffer alignedBuffer(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  char* p = static_cast<char*>(std::aligned_alloc(4096, rounded));
  if (!p) throw SystemError("aligned_alloc", ENOMEM, __FILE__, __LINE__);
  std::memset(p, 0, rounded);
  return AlignedBuffer(p);
}

class VerbsTransport;

/// One work request not yet handed to the QP.
struct PendingWr {
  uint32_t op = 0;
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  uint64_t local = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;
  uint64_t add = 0;
  int32_t sendSlot = -1;   ///< the lane's staging send slot this work request reads, freed when it retires
  uint8_t what = 0;        ///< PostedWr::kOp, kCreditRead or kHeartbeat
  uint32_t sendBytes = 0;  ///< > 0: an IBV_WR_SEND of the first sendBytes bytes of `send` (a control record)
  alignas(8) uint8_t send[sizeof(MessageRecord)] = {};
};

/// Makes `w` an IBV_WR_SEND of the `bytes` bytes of `record` (a ControlRecord or a MessageRecord).
void setSend(PendingWr& w, const void* record, uint32_t bytes) {
  w.opcode = IBV_WR_SEND;
  w.sendBytes = bytes;
  std::memcpy(w.send, record, bytes);
}

/// A work request handed to the QP and not yet retired.
struct PostedWr {
  enum : uint8_t { kOp = 0, kCreditRead = 1, kHeartbeat = 2 };
  uint64_t seq = 0;
  uint32_t op = kNoOp;
  int32_t sendSlot = -1;
  uint8_t what = kOp;
};

struct QpSlot {
  UniqueQp qp;
  uint32_t psn = 0;
  uint32_t controlNext = 0;     ///< next control slot, in posting order
  uint32_t sinceSignal = 0;     ///< unsignalled work requests posted since the last signalled one
  uint64_t nextSeq = 0;         ///< sequence number of the next posted work request
  uint64_t progressNs = 0;      ///< when the QP last completed work, or got work while idle
  uint64_t lastPostNs = 0;      ///< when work was last posted (heartbeats go to QPs idle for kHeartbeatNs)
  uint64_t heartbeatNs = 0;     ///< when the heartbeat now outstanding was queued; 0: none
  std::deque<PostedWr> posted;  ///< in posting order; its size is what the QP has outstanding
  std::deque<PendingWr> backlog;
  // Staging towards this peer's staged windows: chunks sent into its ring (this lane, this rank), and the
  // number it has consumed as last read from its credit word.
  uint64_t stagedSent = 0;
  uint64_t stagedFreed = 0;
  bool creditReadPending = false;
};

struct OpSlot {
  uint64_t cookie = 0;
  int peer = -1;
  uint32_t remaining = 0;
  Status status = Status::kOk;
};

class VerbsLane : public TransportLane {
 public:
  VerbsLane(VerbsTransport& t, int index);
  void post(const WriteOp& op) override;
  void postAtomic(const AtomicOp& op) override;
  void postMessage(const MessageOp& op) override;
  size_t poll(Completion* out, size_t max) override;
  size_t inFlight() const override { return inFlight_.load(std::memory_order_relaxed); }

  ibv_qp* qp(int peer) const { return qps_[peer].qp.get(); }
  uint32_t psn(int peer) const { return qps_[peer].psn; }
  uint32_t maxInline() const { return maxInline_; }
  /// shutdown(): destroys the QPs and completes every pending op with kShutdown.
  void abandon();

 private:
  std::string who() const;
  uint32_t newOp(uint64_t cookie, int peer, uint32_t workRequests);
  void finishWr(uint32_t op, Status status);
  void failedNow(uint64_t cookie, int peer);
  void flush(int peer);
  void failBacklog(int peer);
  /// Reaps the send CQ, checks the completion timeouts, sends heartbeats and posts backlogs.
  void progress();
  void retire(int peer, const PostedWr& w, Status status);
  /// Makes progress until `ready()` or the peer failed or timeoutNs passed (the peer is then failed); true if ready.
  template <class Ready>
  bool progressUntil(int peer, const char* what, Ready ready);
  /// A free staging send slot (allocating the slots on first use), or -1 when the peer failed meanwhile.
  int32_t acquireSendSlot(int peer, std::string* why);
  void postStaged(const WriteOp& op, uint32_t id, const char* localBase, bool localStaged, int localDevice,
                  MemoryKind localKind, uint32_t lkey, const WindowKey& remote);
  void queueHeartbeat(int peer, uint64_t now);

  VerbsTransport& t_;
  const int index_;
  // Declared in creation order; destroyed in reverse (QPs, CQ, memory regions, buffers).
  AlignedBuffer buffer_;  ///< [0, 64): atomic scratch; [64, creditEnd_): credit words read; then control slots
  UniqueMr mr_;
  size_t creditEnd_ = 64;
  AlignedBuffer sendStaging_;  ///< kStageSlots x kStageSlotBytes, allocated on first use
  UniqueMr sendStagingMr_;
  bool sendSlotBusy_[kStageSlots] = {};
  uint32_t sendSlotNext_ = 0;
  common::CudaCopier copier_;
  UniqueCq sendCq_;
  std::vector<QpSlot> qps_;
  uint32_t maxInline_ = 0;
  std::vector<OpSlot> ops_;
  std::vector<uint32_t> freeOps_;
  std::deque<Completion> done_;
  std::atomic<size_t> inFlight_{0};
};

class VerbsTransport : public Transport {
 public:
  explicit VerbsTransport(const VerbsTransportOptions& options);
  ~VerbsTransport() override { shutdown(); }

  std::string name() const override { return "verbs"; }
  std::string localAddress() override { return address_; }
  void connect(const std::vector<std::string>& addresses, int lanes) override;
  int numLanes() const override { return connected_ ? numLanes_ : 0; }
  TransportLane& lane(int index) override {
    if (!connected_ || index < 0 || index >= numLanes_)
      throw Error(ErrorCode::kInvalidArgument, who() + ": lane " + std::to_string(index) + " does not exist (" +
                                                   std::to_string(numLanes()) + " lanes connected)");
    return *lanes_[index];
  }

  std::string registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) override;
  void deregisterWindow(uint32_t id) override;
  void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) override;

  void setImmHandler(ImmHandler handler) override { immHandler_ = std::move(handler); }
  void setMessageHandler(MessageHandler handler) override { messageHandler_ = std::move(handler); }
  void setPeerFailureHandler(PeerFailureHandler handler) override {
    std::lock_guard<std::mutex> lock(failureMutex_);
    failureHandler_ = std::move(handler);
  }
  Status peerStatus(int peer) const override {
    if (peer < 0 || peer >= world_) return Status::kInvalidArgument;
    if (peerFailed_[peer].load()) return Status::kPeerFailed;
    return stopping_.load() ? Status::kShutdown : Status::kOk;
  }
  void shutdown() override;

 private:
  friend class VerbsLane;
  struct LocalWindow {
    char* base = nullptr;
    uint64_t bytes = 0;
    MemoryKind kind = MemoryKind::kHost;
    bool staged = false;
    int device = -1;  ///< CUDA device of a GPU window
    UniqueMr mr;
  };
  struct RemoteWindow {
    WindowKey key{};
  };

  std::string who() const { return "verbs transport rank " + std::to_string(rank_); }
  bool failed(int peer) const { return peerFailed_[peer].load(std::memory_order_acquire); }
  void failPeer(int peer, const std::string& why);
  void receiverLoop();
  void onReceive(const ibv_wc& wc);
  /// Acts on a received SEND of `bytes` bytes at `data` (a control record or a message); "" or why it is malformed.
  std::string applySend(int lane, int peer, const char* data, uint32_t bytes);
  void deliver(int peer, const MessageRecord& r);
  void applyControl(int peer, const ControlRecord& r);
  void applyStaged(int lane, int peer, const ControlRecord& r);
  /// The receive staging area (allocated by the first staged window; windowsMutex_ held exclusively).
  void ensureStagingArea();
  void postReceive(int lane, int peer, uint32_t slot);
  UniqueMr registerCuda(void* base, size_t bytes, int access, std::string* how);

  const VerbsTransportOptions options_;
  const int rank_;
  const int world_;
  PortInfo port_;
  PathOptions path_;
  int sendDepth_ = 0;
  int recvDepth_ = 0;
  bool nativeAtomics_ = false;
  std::string address_;

  // Verbs objects in creation order (destroyed in reverse): device, PD, channel, receive CQ, receive buffer and
  // its MR, windows' MRs, lanes (their CQs and QPs).
  UniqueContext ctx_;
  UniquePd pd_;
  UniqueChannel channel_;
  UniqueCq recvCq_;
  AlignedBuffer recvBuffer_;
  UniqueMr recvMr_;
  // Receive staging area: [lanes][world] credit words (consumed chunks), rounded to a page, then
  // [lanes][world][kStageSlots] slots of kStageSlotBytes. Allocated with the first staged window.
  AlignedBuffer staging_;
  UniqueMr stagingMr_;
  size_t stagingHeader_ = 0;
  common::CudaCopier rxCopier_;  ///< used by the receiver thread only
  mutable std::shared_mutex windowsMutex_;
  std::unordered_map<uint32_t, LocalWindow> windows_;
  std::vector<std::unordered_map<uint32_t, RemoteWindow>> remoteWindows_;
  std::vector<std::unique_ptr<VerbsLane>> lanes_;

  ImmHandler immHandler_;
  MessageHandler messageHandler_;
  std::mutex failureMutex_;
  PeerFailureHandler failureHandler_;
  std::unique_ptr<std::atomic<bool>[]> peerFailed_;

  bool connectStarted_ = false;
  bool connected_ = false;
  int numLanes_ = 0;
  std::thread receiver_;
  std::atomic<bool> rxStop_{false};
  std::atomic<bool> stopping_{false};
  std::mutex shutdownMutex_;
  bool shutDown_ = false;
};

// ---- transport ---------------------------------------------------------------------------------------------

VerbsTransport::VerbsTransport(const VerbsTransportOptions& o)
    : options_(o), rank_(o.rank), world_(o.worldSize), rxCopier_(o.timeoutNs) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw Error(ErrorCode::kInvalidArgument, "verbs transport: rank " + std::to_string(rank_) + " of world " +
                                                 std::to_string(world_) + " is not valid");
  if (o.lanes < 1 || o.lanes > 64)
    throw Error(ErrorCode::kInvalidArgument, who() + ": lanes " + std::to_string(o.lanes) + " not in [1, 64]");
  if (o.sendDepth < 1 || o.recvDepth < 1 || o.signalEvery < 1 || o.timeoutNs == 0)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": sendDepth, recvDepth, signalEvery and timeoutNs must be positive");
  peerFailed_.reset(new std::atomic<bool>[world_]);
  for (int p = 0; p < world_; ++p) peerFailed_[p].store(false);
  remoteWindows_.resize(world_);

  ctx_ = openPort(o.hca, o.gidIndex, &port_);
  const ibv_device_attr& dev = port_.device_attr;
  sendDepth_ = std::min(o.sendDepth, dev.max_qp_wr);
  recvDepth_ = std::min(o.recvDepth, dev.max_qp_wr);
  nativeAtomics_ = o.nativeAtomics && dev.atomic_cap != IBV_ATOMIC_NONE;
  path_.port = port_.port;
  path_.gidIndex = port_.gidIndex;
  path_.ethernet = port_.ethernet;
  path_.serviceLevel = o.serviceLevel;
  path_.trafficClass = o.trafficClass;
  path_.timeout = o.timeout;
  path_.retryCount = o.retryCount;
  path_.maxRdAtomic = std::max(1, std::min({dev.max_qp_rd_atom, dev.max_qp_init_rd_atom, 16}));

  pd_.reset(ibv_alloc_pd(ctx_.get()));
  if (!pd_) throw VerbsError("ibv_alloc_pd", errno, __FILE__, __LINE__);
  channel_.reset(ibv_create_comp_channel(ctx_.get()));
  if (!channel_) throw VerbsError("ibv_create_comp_channel", errno, __FILE__, __LINE__);
  const size_t qpsTotal = static_cast<size_t>(o.lanes) * world_;
  const int recvCqe = static_cast<int>(std::min<size_t>(qpsTotal * recvDepth_, dev.max_cqe));
  recvCq_.reset(ibv_create_cq(ctx_.get(), recvCqe, nullptr, channel_.get(), 0));
  if (!recvCq_) throw VerbsError("ibv_create_cq (receive, " + std::to_string(recvCqe) + ")", errno, __FILE__, __LINE__);
  recvBuffer_ = alignedBuffer(qpsTotal * recvDepth_ * kRecvSlotBytes);
  recvMr_.reset(
      ibv_reg_mr(pd_.get(), recvBuffer_.get(), qpsTotal * recvDepth_ * kRecvSlotBytes, IBV_ACCESS_LOCAL_WRITE));
  if (!recvMr_) throw VerbsError("ibv_reg_mr (receive slots)", errno, __FILE__, __LINE__);
  for (int l = 0; l < o.lanes; ++l) lanes_.push_back(std::make_unique<VerbsLane>(*this, l));

  AddressHeader h{};
  h.magic = kAddressMagic;
  h.rank = static_cast<uint32_t>(rank_);
  h.world = static_cast<uint32_t>(world_);
  h.lanes = static_cast<uint32_t>(o.lanes);
  h.lid = port_.lid;
  h.mtu = static_cast<uint8_t>(port_.mtu);
  h.ethernet = port_.ethernet ? 1 : 0;
  std::memcpy(h.gid, port_.gid.raw, 16);
  address_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  for (int l = 0; l < o.lanes; ++l)
    for (int p = 0; p < world_; ++p) {
      AddressEntry e{lanes_[l]->qp(p)->qp_num, lanes_[l]->psn(p)};
      address_.append(reinterpret_cast<const char*>(&e), sizeof e);
    }
  GDX_INFO(who() << ": device " << port_.device << " port " << port_.port << ", GID index " << port_.gidIndex << " ("
                 << gidString(port_.gid) << "), " << (port_.ethernet ? "RoCE v2" : "InfiniBand")
                 << (port_.ethernet ? "" : " LID " + std::to_string(port_.lid)) << ", MTU " << (128 << port_.mtu)
                 << ", send depth " << sendDepth_ << ", max inline " << lanes_[0]->maxInline() << ", atomics "
                 << (nativeAtomics_ ? "native fetch-and-add" : "software (receiver thread)"));
}

void VerbsTransport::connect(const std::vector<std::string>& addresses, int lanes) {
  if (connectStarted_) throw Error(ErrorCode::kInvalidArgument, who() + ": connect() may be called once");
  if (static_cast<int>(addresses.size()) != world_)
    throw Error(ErrorCode::kInvalidArgument, who() + ": connect() got " + std::to_string(addresses.size()) +
                                                 " addresses for a world of " + std::to_string(world_));
  if (lanes < 1 || lanes > options_.lanes)
    throw Error(ErrorCode::kInvalidArgument, who() + ": " + std::to_string(lanes) + " lanes requested, " +
                                                 std::to_string(options_.lanes) +
                                                 " prepared (VerbsTransportOptions::lanes / GDX_PROXY_THREADS)");
  if (stopping_.load()) throw Error(ErrorCode::kShutdown, who() + ": connect() after shutdown()");
  connectStarted_ = true;
  std::vector<AddressHeader> headers(world_);
  for (int p = 0; p < world_; ++p) {
    const std::string& a = addresses[p];
    AddressHeader& h = headers[p];
    if (a.size() >= sizeof h) std::memcpy(&h, a.data(), sizeof h);
    if (a.size() < sizeof h || h.magic != kAddressMagic || h.rank != static_cast<uint32_t>(p) ||
        h.world != static_cast<uint32_t>(world_) || h.lanes < static_cast<uint32_t>(lanes) ||
        a.size() != sizeof h + size_t{h.lanes} * world_ * sizeof(AddressEntry) || (h.ethernet != 0) != port_.ethernet)
      throw Error(ErrorCode::kProtocol, who() + ": the address of rank " + std::to_string(p) +
                                            " is not a verbs address of this world with " + std::to_string(lanes) +
                                            " lanes (" + std::to_string(a.size()) + " bytes)");
  }
  for (int l = 0; l < lanes; ++l)
    for (int p = 0; p < world_; ++p) {
      ibv_qp* qp = lanes_[l]->qp(p);
      toInit(qp, port_.port);
      for (int s = 0; s < recvDepth_; ++s) postReceive(l, p, static_cast<uint32_t>(s));
      const AddressHeader& h = headers[p];
      AddressEntry e;
      std::memcpy(&e, addresses[p].data() + sizeof h + (size_t{static_cast<uint32_t>(l)} * world_ + rank_) * sizeof e,
                  sizeof e);
      QpAddress remote;
      remote.qpn = e.qpn;
      remote.psn = e.psn;
      remote.lid = h.lid;
      std::memcpy(remote.gid.raw, h.gid, 16);
      remote.mtu = static_cast<ibv_mtu>(std::min<int>(h.mtu, port_.mtu));
      toRtr(qp, remote, path_);
      toRts(qp, lanes_[l]->psn(p), path_);
    }
  numLanes_ = lanes;
  receiver_ = std::thread([this] { receiverLoop(); });
  connected_ = true;
}

void VerbsTransport::postReceive(int lane, int peer, uint32_t slot) {
  const size_t qpIndex = static_cast<size_t>(lane) * world_ + peer;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recvBuffer_.get() + (qpIndex * recvDepth_ + slot) * kRecvSlotBytes);
  sge.length = kRecvSlotBytes;
  sge.lkey = recvMr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = (static_cast<uint64_t>(qpIndex) << 32) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  GDX_IBV_CHECK(ibv_post_recv(lanes_[lane]->qp(peer), &wr, &bad));
}

void VerbsTransport::receiverLoop() {
  ibv_wc wc[32];
  int idle = 0;
  bool armed = false;
  while (!rxStop_.load(std::memory_order_acquire)) {
    int n = ibv_poll_cq(recvCq_.get(), 32, wc);
    if (n < 0) {
      GDX_ERROR(who() << ": ibv_poll_cq (receive) failed; receiver stops");
      for (int p = 0; p < world_; ++p) failPeer(p, "polling the receive completion queue failed");
      return;
    }
    for (int i = 0; i < n; ++i) onReceive(wc[i]);
    if (n > 0) {
      idle = 0;
      continue;
    }
    if (++idle < 2000) continue;
    if (!armed) {
      if (ibv_req_notify_cq(recvCq_.get(), 0) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      armed = true;
      continue;  // poll once more: a completion may have arrived before the CQ was armed
    }
    pollfd pfd{channel_->fd, POLLIN, 0};
    if (::poll(&pfd, 1, 20) > 0) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      if (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
    }
    armed = false;
    idle = 0;
  }
}

void VerbsTransport::onReceive(const ibv_wc& wc) {
  const size_t qpIndex = wc.wr_id >> 32;
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  const int lane = static_cast<int>(qpIndex / world_), peer = static_cast<int>(qpIndex % world_);
  if (wc.status != IBV_WC_SUCCESS) {
    if (!stopping_.load())
      failPeer(peer, "lane " + std::to_string(lane) + ": a receive from rank " + std::to_string(peer) +
                         " completed with status '" + ibv_wc_status_str(wc.status) + "' (vendor error " +
                         std::to_string(wc.vendor_err) + ")");
    return;
  }
  if (failed(peer)) return;
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    if (immHandler_) {
      try {
        immHandler_(RemoteWrite{peer, kUnknownRemoteWindow, 0, wc.byte_len, ntohl(wc.imm_data)});
      } catch (const std::exception& e) {
        GDX_ERROR(who() << ": the immediate handler threw: " << e.what());
      }
    }
  } else {
    const char* data = recvBuffer_.get() + (qpIndex * recvDepth_ + slot) * kRecvSlotBytes;
    std::string bad = wc.opcode == IBV_WC_RECV ? applySend(lane, peer, data, wc.byte_len) : "an unexpected opcode";
    if (!bad.empty()) {
      failPeer(peer, "lane " + std::to_string(lane) + ": rank " + std::to_string(peer) +
                         " sent an unexpected message (opcode " + std::to_string(wc.opcode) + ", " +
                         std::to_string(wc.byte_len) + " bytes): " + bad);
      return;
    }
  }
  try {
    postReceive(lane, peer, slot);
  } catch (const Error& e) {
    if (!stopping_.load()) failPeer(peer, std::string("reposting a receive: ") + e.what());
  }
}

std::string VerbsTransport::applySend(int lane, int peer, const char* data, uint32_t bytes) {
  uint32_t kind = kNoOp;
  if (bytes >= kMessageHeaderBytes) std::memcpy(&kind, data + offsetof(ControlRecord, kind), sizeof kind);
  if (kind == kControlMessage) {
    MessageRecord r{};
    std::memcpy(&r, data, std::min<size_t>(bytes, sizeof r));
    if (r.bytes == 0 || r.bytes > kMaxMessageBytes || bytes != kMessageHeaderBytes + r.bytes)
      return "a message record claiming " + std::to_string(r.bytes) + " bytes";
    deliver(peer, r);
    return "";
  }
  if (bytes != sizeof(ControlRecord)) return "neither a control record nor a message";
  ControlRecord r;
  std::memcpy(&r, data, sizeof r);
  if (r.kind == kControlStaged || r.kind == kControlStagedImm)
    applyStaged(lane, peer, r);
  else
    applyControl(peer, r);
  return "";
}

void VerbsTransport::deliver(int peer, const MessageRecord& r) {
  RemoteMessage m;
  m.peer = peer;
  m.bytes = r.bytes;
  std::memcpy(m.data, r.data, r.bytes);
  common::deliverMessage(messageHandler_, m, who());
}

void VerbsTransport::applyControl(int peer, const ControlRecord& r) {
  std::string bad;
  uint64_t* word = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(windowsMutex_);
    auto it = windows_.find(r.window);
    if (r.kind > static_cast<uint32_t>(SignalOp::kSet)) {
      bad = "unknown atomic kind " + std::to_string(r.kind);
    } else if (it == windows_.end()) {
      bad = "window " + std::to_string(r.window) + " is not registered here";
    } else if (it->second.kind != MemoryKind::kHost) {
      bad = "window " + std::to_string(r.window) + " is GPU memory";
    } else {
      bad = checkRange(r.offset, kWordBytes, it->second.bytes);
      char* p = it->second.base + r.offset;
      if (bad.empty() && reinterpret_cast<uintptr_t>(p) % kWordBytes != 0) bad = "the word is not 8-byte aligned";
      if (bad.empty()) word = reinterpret_cast<uint64_t*>(p);
    }
    if (word) {
      // Performed under the shared lock so the window cannot be deregistered meanwhile.
      if (r.kind == static_cast<uint32_t>(SignalOp::kAdd))
        atomicFetchAdd(word, r.value, kRelease);
      else
        atomicStore(word, r.value, kRelease);
      return;
    }
  }
  failPeer(peer, "rank " + std::to_string(peer) + " sent a malformed atomic: " + bad);
}

void VerbsTransport::ensureStagingArea() {
  if (staging_) return;
  stagingHeader_ = (static_cast<size_t>(options_.lanes) * world_ * kWordBytes + 4095) / 4096 * 4096;
  const size_t bytes = stagingHeader_ + static_cast<size_t>(options_.lanes) * world_ * kStageSlots * kStageSlotBytes;
  AlignedBuffer b = alignedBuffer(bytes);
  UniqueMr mr(
      ibv_reg_mr(pd_.get(), b.get(), bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  if (!mr)
    throw VerbsError("ibv_reg_mr (receive staging, " + std::to_string(bytes) + " bytes)", errno, __FILE__, __LINE__);
  staging_ = std::move(b);
  stagingMr_ = std::move(mr);
  GDX_INFO(who() << ": receive staging area of " << bytes << " bytes (" << kStageSlots << " slots of "
                 << kStageSlotBytes << " bytes per lane and peer)");
}

void VerbsTransport::applyStaged(int lane, int peer, const ControlRecord& r) {
  std::string bad;
  bool announce = false;
  RemoteWrite announced{};
  {
    std::shared_lock<std::shared_mutex> lock(windowsMutex_);
    auto it = windows_.find(r.window);
    if (it == windows_.end() || !it->second.staged) {
      bad = "window " + std::to_string(r.window) + " is not a staged window here";
    } else if (!staging_ || lane >= options_.lanes || r.slot >= kStageSlots || r.value == 0 ||
               r.value > kStageSlotBytes) {
      bad = "slot " + std::to_string(r.slot) + " / " + std::to_string(r.value) + " bytes is not a staging slot";
    } else {
      bad = checkRange(r.offset, r.value, it->second.bytes);
    }
    if (bad.empty()) {
      const size_t ring = static_cast<size_t>(lane) * world_ + peer;
      const char* src = staging_.get() + stagingHeader_ + (ring * kStageSlots + r.slot) * kStageSlotBytes;
      char* dst = it->second.base + r.offset;
      // Copied under the shared lock so the window cannot be deregistered meanwhile.
      if (it->second.kind == MemoryKind::kCuda)
        bad = rxCopier_.copy(dst, src, r.value, it->second.device);
      else
        std::memcpy(dst, src, r.value);
      if (bad.empty()) {
        // The slot may be reused: the sender reads this word (RDMA read) before it writes the slot again.
        atomicFetchAdd(reinterpret_cast<uint64_t*>(staging_.get()) + ring, uint64_t{1}, kRelease);
        announce = r.kind == kControlStagedImm;
        announced = RemoteWrite{peer, r.window, r.offset, r.value, r.imm};
      } else {
        bad = "copying a staged chunk into window " + std::to_string(r.window) + ": " + bad;
      }
    }
  }
  if (!bad.empty()) {
    failPeer(peer, "rank " + std::to_string(peer) + " sent a bad staged chunk: " + bad);
    return;
  }
  if (announce && immHandler_) {
    try {
      immHandler_(announced);
    } catch (const std::exception& e) {
      GDX_ERROR(who() << ": the immediate handler threw: " << e.what());
    }
  }
}

void VerbsTransport::failPeer(int peer, const std::string& why) {
  if (peerFailed_[peer].exchange(true)) return;
  for (auto& l : lanes_)
    if (int rc = l->qp(peer) ? toError(l->qp(peer)) : 0; rc != 0)
      GDX_WARN(who() << ": moving the QP to rank " << peer << " to the error state failed: " << std::strerror(rc));
  if (stopping_.load()) return;
  GDX_ERROR(who() << ": rank " << peer << " failed: " << why);
  PeerFailureHandler handler;
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    handler = failureHandler_;
  }
  if (handler) handler(peer, why);
}

void VerbsTransport::shutdown() {
  std::lock_guard<std::mutex> lock(shutdownMutex_);
  if (shutDown_) return;
  shutDown_ = true;
  stopping_.store(true);
  rxStop_.store(true, std::memory_order_release);
  if (receiver_.joinable()) receiver_.join();
  // Destroying the QPs is the goodbye: a peer still writing sees its work requests fail and marks this rank failed.
  // The lanes stay (a caller may still hold one); everything they had pending completes with kShutdown.
  for (int p = 0; p < world_; ++p) peerFailed_[p].store(true);
  for (auto& l : lanes_) l->abandon();
  {
    std::unique_lock<std::shared_mutex> wl(windowsMutex_);
    windows_.clear();
  }
}

UniqueMr VerbsTransport::registerCuda(void* base, size_t bytes, int access, std::string* how) {
#if defined(GDX_HAVE_CUDA)
  using GetHandleFn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess && fn) {
    const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + bytes + page - 1) & ~(page - 1);
    int fd = -1;
    if (reinterpret_cast<GetHandleFn>(fn)(&fd, static_cast<CUdeviceptr>(start), end - start,
                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS) {
      UniqueMr mr(ibv_reg_dmabuf_mr(pd_.get(), reinterpret_cast<uintptr_t>(base) - start, bytes,
                                    reinterpret_cast<uint64_t>(base), fd, access));
      int err = errno;
      ::close(fd);
      if (mr) {
        *how = "dmabuf";
        return mr;
      }
      *how = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(err);
    } else {
      *how = "cuMemGetHandleForAddressRange failed";
    }
  } else {
    *how = "no cuMemGetHandleForAddressRange in the driver";
  }
  UniqueMr mr(ibv_reg_mr(pd_.get(), base, bytes, access));
  if (mr) {
    *how = "peermem";
    return mr;
  }
  *how += std::string("; ibv_reg_mr (peermem): ") + std::strerror(errno);
  return nullptr;
#else
  (void)base, (void)bytes, (void)access;
  *how = "gdx was built without CUDA";
  return nullptr;
#endif
}

std::string VerbsTransport::registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
  std::string w = who() + ": window " + std::to_string(id);
  if (kind != MemoryKind::kHost && kind != MemoryKind::kCuda)
    throw Error(ErrorCode::kInvalidArgument, w + ": unknown memory kind");
  if (base == nullptr && bytes > 0) throw Error(ErrorCode::kInvalidArgument, w + ": null base");
  {
    std::shared_lock<std::shared_mutex> lock(windowsMutex_);
    if (windows_.count(id)) throw Error(ErrorCode::kInvalidArgument, w + " is already registered");
  }
  LocalWindow win;
  win.base = static_cast<char*>(base);
  win.bytes = bytes;
  win.kind = kind;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (port_.device_attr.atomic_cap != IBV_ATOMIC_NONE) access |= IBV_ACCESS_REMOTE_ATOMIC;
  if (kind == MemoryKind::kCuda) {
    if (!common::cudaStagingBuiltIn())
      throw Error(ErrorCode::kInvalidArgument,
                  w + ": GPU memory (MemoryKind::kCuda) needs gdx built with CUDA; this build has no CUDA");
    win.device = common::cudaWindowDevice(base, bytes, w);  // throws unless it is CUDA memory
  }
  if (options_.stageAllWindows) {
    win.staged = true;
  } else if (bytes > 0) {
    if (kind == MemoryKind::kHost) {
      win.mr.reset(ibv_reg_mr(pd_.get(), base, bytes, access));
      if (!win.mr)
        throw VerbsError("ibv_reg_mr (" + w + ", " + std::to_string(bytes) + " bytes)", errno, __FILE__, __LINE__);
    } else {
      std::string how;
      win.mr = registerCuda(base, bytes, access, &how);
      if (win.mr) {
        GDX_INFO(w << ": GPU memory registered through " << how);
      } else {
        win.staged = true;
        GDX_INFO(w << ": GPU memory cannot be registered with " << port_.device << " (" << how
                   << "); it is staged through registered host buffers");
      }
    }
  }
  std::unique_lock<std::shared_mutex> lock(windowsMutex_);
  if (win.staged) ensureStagingArea();
  WindowKey key{};
  key.addr = reinterpret_cast<uint64_t>(base);
  key.bytes = bytes;
  key.rkey = win.mr ? win.mr->rkey : 0;
  key.cuda = kind == MemoryKind::kCuda ? 1u : 0u;
  if (win.staged) {
    key.staged = 1;
    key.stagingAddr = reinterpret_cast<uint64_t>(staging_.get());
    key.stagingRkey = stagingMr_->rkey;
    key.stagingLanes = static_cast<uint32_t>(options_.lanes);
  }
  if (!windows_.emplace(id, std::move(win)).second)
    throw Error(ErrorCode::kInvalidArgument, w + " is already registered");
  return std::string(reinterpret_cast<const char*>(&key), sizeof key);
}

void VerbsTransport::deregisterWindow(uint32_t id) {
  std::unique_lock<std::shared_mutex> lock(windowsMutex_);
  if (windows_.erase(id) == 0)
    throw Error(ErrorCode::kInvalidArgument, who() + ": window " + std::to_string(id) + " is not registered");
}

void VerbsTransport::addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) {
  if (peer < 0 || peer >= world_)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": remote window " + std::to_string(id) + " of unknown peer " + std::to_string(peer));
  WindowKey k{};
  if (key.size() == sizeof k) std::memcpy(&k, key.data(), sizeof k);
  if (key.size() != sizeof k || k.bytes != bytes)
    throw Error(ErrorCode::kInvalidArgument, who() + ": the key of window " + std::to_string(id) + " of rank " +
                                                 std::to_string(peer) + " is not a verbs key for " +
                                                 std::to_string(bytes) + " bytes");
  std::unique_lock<std::shared_mutex> lock(windowsMutex_);
  remoteWindows_[peer][id] = RemoteWindow{k};
}

// ---- lane -----------------------------------------------------------------------------------------------------

VerbsLane::VerbsLane(VerbsTransport& t, int index) : t_(t), index_(index), copier_(t.options_.timeoutNs) {
  creditEnd_ = 64 + (static_cast<size_t>(t.world_) * kWordBytes + 63) / 64 * 64;
  const size_t bufferBytes = creditEnd_ + static_cast<size_t>(t.world_) * t.sendDepth_ * kControlSlotBytes;
  buffer_ = alignedBuffer(bufferBytes);
  mr_.reset(ibv_reg_mr(t.pd_.get(), buffer_.get(), bufferBytes, IBV_ACCESS_LOCAL_WRITE));
  if (!mr_) throw VerbsError("ibv_reg_mr (lane scratch)", errno, __FILE__, __LINE__);
  const int cqe = std::min(t.world_ * t.sendDepth_, t.port_.device_attr.max_cqe);
  sendCq_.reset(ibv_create_cq(t.ctx_.get(), cqe, nullptr, nullptr, 0));
  if (!sendCq_) throw VerbsError("ibv_create_cq (send, " + std::to_string(cqe) + ")", errno, __FILE__, __LINE__);
  std::random_device rd;
  qps_.resize(t.world_);
  for (int p = 0; p < t.world_; ++p) {
    ibv_qp_init_attr a{};
    a.send_cq = sendCq_.get();
    a.recv_cq = t.recvCq_.get();
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 0;
    a.cap.max_send_wr = static_cast<uint32_t>(t.sendDepth_);
    a.cap.max_recv_wr = static_cast<uint32_t>(t.recvDepth_);
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    // Room for a control message of any length inline; else what the device allows (0: no inline sends).
    for (uint32_t inlineBytes : {uint32_t{sizeof(MessageRecord)}, uint32_t{64}, uint32_t{0}}) {
      a.cap.max_inline_data = inlineBytes;
      qps_[p].qp.reset(ibv_create_qp(t.pd_.get(), &a));
      if (qps_[p].qp) break;
    }
    if (!qps_[p].qp) throw VerbsError("ibv_create_qp (RC)", errno, __FILE__, __LINE__);
    maxInline_ = a.cap.max_inline_data;
    qps_[p].psn = rd() & 0xffffff;
  }
  ops_.reserve(1024);
}

std::string VerbsLane::who() const {
  return t_.who() + " lane " + std::to_string(index_);
}

uint32_t VerbsLane::newOp(uint64_t cookie, int peer, uint32_t workRequests) {
  uint32_t i;
  if (!freeOps_.empty()) {
    i = freeOps_.back();
    freeOps_.pop_back();
  } else {
    i = static_cast<uint32_t>(ops_.size());
    ops_.emplace_back();
  }
  ops_[i] = OpSlot{cookie, peer, workRequests, Status::kOk};
  inFlight_.fetch_add(1, std::memory_order_relaxed);
  return i;
}

void VerbsLane::failedNow(uint64_t cookie, int peer) {
  inFlight_.fetch_add(1, std::memory_order_relaxed);
  done_.push_back(Completion{cookie, t_.stopping_.load() ? Status::kShutdown : Status::kPeerFailed, peer});
}

void VerbsLane::finishWr(uint32_t i, Status status) {
  OpSlot& op = ops_[i];
  if (status != Status::kOk && op.status == Status::kOk) op.status = status;
  if (--op.remaining > 0) return;
  done_.push_back(Completion{op.cookie, op.status, op.peer});
  freeOps_.push_back(i);
}

void VerbsLane::post(const WriteOp& op) {
  auto invalid = [&](const std::string& what) {
    std::ostringstream os;
    os << who() << ": write to peer " << op.peer << " (local window " << op.localWindow << " offset " << op.localOffset
       << ", remote window " << op.remoteWindow << " offset " << op.remoteOffset << ", " << op.bytes
       << " bytes): " << what;
    throw Error(ErrorCode::kInvalidArgument, os.str());
  };
  if (!t_.connected_) invalid("the transport is not connected");
  if (op.peer < 0 || op.peer >= t_.world_) invalid("unknown peer (world size " + std::to_string(t_.world_) + ")");
  if (op.bytes == 0) invalid("zero-byte write");
  uint64_t local = 0, remote = 0;
  uint32_t lkey = 0, rkey = 0;
  bool localStaged = false;
  int localDevice = -1;
  MemoryKind localKind = MemoryKind::kHost;
  WindowKey remoteKey{};
  {
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    auto l = t_.windows_.find(op.localWindow);
    if (l == t_.windows_.end()) invalid("local window " + std::to_string(op.localWindow) + " is not registered");
    std::string bad = checkRange(op.localOffset, op.bytes, l->second.bytes);
    if (!bad.empty()) invalid("local window " + std::to_string(op.localWindow) + ": " + bad);
    auto r = t_.remoteWindows_[op.peer].find(op.remoteWindow);
    if (r == t_.remoteWindows_[op.peer].end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " of peer " + std::to_string(op.peer) +
              " is not known");
    bad = checkRange(op.remoteOffset, op.bytes, r->second.key.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + ": " + bad);
    remoteKey = r->second.key;
    if (remoteKey.staged && static_cast<uint32_t>(index_) >= remoteKey.stagingLanes)
      invalid("the remote window is staged and peer " + std::to_string(op.peer) + " has no staging ring for lane " +
              std::to_string(index_));
    local = reinterpret_cast<uint64_t>(l->second.base) + op.localOffset;
    localStaged = l->second.staged;
    localDevice = l->second.device;
    localKind = l->second.kind;
    lkey = l->second.mr ? l->second.mr->lkey : 0;
    remote = remoteKey.addr + op.remoteOffset;
    rkey = remoteKey.rkey;
  }
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  if (localStaged || remoteKey.staged) {
    const uint64_t n = (op.bytes + kStageSlotBytes - 1) / kStageSlotBytes;
    const uint32_t id = newOp(op.cookie, op.peer, static_cast<uint32_t>(n * (remoteKey.staged ? 2 : 1)));
    return postStaged(op, id, reinterpret_cast<const char*>(local), localStaged, localDevice, localKind, lkey,
                      remoteKey);
  }
  const uint32_t chunk = std::min<uint32_t>(kMaxChunk, t_.port_.maxMsgBytes ? t_.port_.maxMsgBytes : kMaxChunk);
  const uint32_t n = static_cast<uint32_t>((op.bytes + chunk - 1) / chunk);
  const uint32_t id = newOp(op.cookie, op.peer, n);
  QpSlot& q = qps_[op.peer];
  for (uint32_t c = 0; c < n; ++c) {
    PendingWr w;
    w.op = id;
    const uint64_t off = uint64_t{c} * chunk;
    w.length = static_cast<uint32_t>(std::min<uint64_t>(chunk, op.bytes - off));
    w.local = local + off;
    w.lkey = lkey;
    w.remote = remote + off;
    w.rkey = rkey;
    const bool last = c + 1 == n;
    w.opcode = last && op.withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    w.imm = op.imm;
    q.backlog.push_back(w);
  }
  flush(op.peer);
}

template <class Ready>
bool VerbsLane::progressUntil(int peer, const char* what, Ready ready) {
  const uint64_t start = nowNs();
  for (uint64_t spins = 0;; ++spins) {
    if (ready()) return true;
    if (t_.failed(peer) || t_.stopping_.load(std::memory_order_relaxed)) return false;
    if (nowNs() - start > t_.options_.timeoutNs) {
      t_.failPeer(peer, "lane " + std::to_string(index_) + ": waited " + std::to_string((nowNs() - start) / 1000000) +
                            " ms for " + what + " of rank " + std::to_string(peer) + " (status timeout)");
      return false;
    }
    progress();
    if (spins > 1000) std::this_thread::yield();
  }
}

int32_t VerbsLane::acquireSendSlot(int peer, std::string* why) {
  if (!sendStaging_) {
    const size_t bytes = kStageSlots * kStageSlotBytes;
    AlignedBuffer b = alignedBuffer(bytes);
    UniqueMr mr(ibv_reg_mr(t_.pd_.get(), b.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
    if (!mr) {
      *why = std::string("ibv_reg_mr (staging send slots): ") + std::strerror(errno);
      return -1;
    }
    sendStaging_ = std::move(b);
    sendStagingMr_ = std::move(mr);
  }
  auto freeSlot = [&] {
    for (uint32_t k = 0; k < kStageSlots; ++k)
      if (!sendSlotBusy_[(sendSlotNext_ + k) % kStageSlots]) return true;
    return false;
  };
  if (!progressUntil(peer, "a free staging send slot", freeSlot)) return -1;
  for (uint32_t k = 0;; ++k) {
    const uint32_t s = (sendSlotNext_ + k) % kStageSlots;
    if (sendSlotBusy_[s]) continue;
    sendSlotBusy_[s] = true;
    sendSlotNext_ = (s + 1) % kStageSlots;
    return static_cast<int32_t>(s);
  }
}

void VerbsLane::postStaged(const WriteOp& op, uint32_t id, const char* localBase, bool localStaged, int localDevice,
                           MemoryKind localKind, uint32_t lkey, const WindowKey& remote) {
  QpSlot& q = qps_[op.peer];
  const uint64_t n = (op.bytes + kStageSlotBytes - 1) / kStageSlotBytes;
  const uint32_t perChunk = remote.staged ? 2 : 1;
  for (uint64_t c = 0; c < n; ++c) {
    const uint64_t off = c * kStageSlotBytes;
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kStageSlotBytes, op.bytes - off));
    const bool last = c + 1 == n;
    std::string why;
    PendingWr w;
    w.op = id;
    w.length = len;
    w.local = reinterpret_cast<uint64_t>(localBase + off);
    w.lkey = lkey;
    if (localStaged) {
      w.sendSlot = acquireSendSlot(op.peer, &why);
      if (w.sendSlot >= 0) {
        char* slot = sendStaging_.get() + static_cast<size_t>(w.sendSlot) * kStageSlotBytes;
        if (localKind == MemoryKind::kCuda)
          why = copier_.copy(slot, localBase + off, len, localDevice);
        else
          std::memcpy(slot, localBase + off, len);
        w.local = reinterpret_cast<uint64_t>(slot);
        w.lkey = sendStagingMr_->lkey;
        if (!why.empty()) {
          sendSlotBusy_[w.sendSlot] = false;
          w.sendSlot = -1;
        }
      }
    }
    uint64_t ringSlot = 0;
    if (why.empty() && (!localStaged || w.sendSlot >= 0) && remote.staged) {
      // A slot of the peer's ring (this lane, this rank) is free once the peer consumed the chunk kStageSlots back.
      auto credit = [&] {
        if (q.stagedSent - q.stagedFreed < kStageSlots) return true;
        if (!q.creditReadPending) {
          PendingWr r;
          r.op = kNoOp;
          r.what = PostedWr::kCreditRead;
          r.opcode = IBV_WR_RDMA_READ;
          r.local = reinterpret_cast<uint64_t>(buffer_.get() + 64 + static_cast<size_t>(op.peer) * kWordBytes);
          r.length = kWordBytes;
          r.lkey = mr_->lkey;
          r.remote = remote.stagingAddr + (static_cast<uint64_t>(index_) * t_.world_ + t_.rank_) * kWordBytes;
          r.rkey = remote.stagingRkey;
          q.creditReadPending = true;
          q.backlog.push_back(r);
          flush(op.peer);
        }
        return false;
      };
      if (progressUntil(op.peer, "a staging credit", credit)) {
        ringSlot = q.stagedSent++ % kStageSlots;
      } else {
        why = "no staging credit";
      }
    }
    if (!why.empty() || (localStaged && w.sendSlot < 0)) {
      if (w.sendSlot >= 0) sendSlotBusy_[w.sendSlot] = false;
      if (!t_.failed(op.peer) && !t_.stopping_.load())
        t_.failPeer(op.peer, "lane " + std::to_string(index_) + ": staging a write to rank " + std::to_string(op.peer) +
                                 ": " + why);
      // The chunks not queued complete with the failure (they were counted in the op).
      const Status s = t_.stopping_.load() ? Status::kShutdown : Status::kPeerFailed;
      for (uint64_t k = c; k < n; ++k)
        for (uint32_t j = 0; j < perChunk; ++j) finishWr(id, s);
      return flush(op.peer);
    }
    if (remote.staged) {
      const uint64_t ring = static_cast<uint64_t>(index_) * t_.world_ + t_.rank_;
      const uint64_t header = (uint64_t{remote.stagingLanes} * t_.world_ * kWordBytes + 4095) / 4096 * 4096;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.remote = remote.stagingAddr + header + (ring * kStageSlots + ringSlot) * kStageSlotBytes;
      w.rkey = remote.stagingRkey;
      q.backlog.push_back(w);
      PendingWr ctl;
      ctl.op = id;
      const ControlRecord record{op.remoteWindow,
                                 last && op.withImm ? kControlStagedImm : kControlStaged,
                                 op.remoteOffset + off,
                                 len,
                                 static_cast<uint32_t>(ringSlot),
                                 op.imm};
      setSend(ctl, &record, sizeof record);
      q.backlog.push_back(ctl);
    } else {
      w.opcode = last && op.withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      w.imm = op.imm;
      w.remote = remote.addr + op.remoteOffset + off;
      w.rkey = remote.rkey;
      q.backlog.push_back(w);
    }
    flush(op.peer);
  }
}

void VerbsLane::postAtomic(const AtomicOp& op) {
  auto invalid = [&](const std::string& what) {
    std::ostringstream os;
    os << who() << ": atomic on peer " << op.peer << " (remote window " << op.remoteWindow << " offset "
       << op.remoteOffset << ", kind " << static_cast<int>(op.kind) << ", value " << op.value << "): " << what;
    throw Error(ErrorCode::kInvalidArgument, os.str());
  };
  if (!t_.connected_) invalid("the transport is not connected");
  if (op.peer < 0 || op.peer >= t_.world_) invalid("unknown peer (world size " + std::to_string(t_.world_) + ")");
  if (op.kind != SignalOp::kAdd && op.kind != SignalOp::kSet) invalid("unknown atomic kind");
  if (op.remoteOffset % kWordBytes != 0) invalid("the offset is not 8-byte aligned");
  PendingWr w;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    auto r = t_.remoteWindows_[op.peer].find(op.remoteWindow);
    if (r == t_.remoteWindows_[op.peer].end())
      invalid("remote window " + std::to_string(op.remoteWindow) + " of peer " + std::to_string(op.peer) +
              " is not known");
    std::string bad = checkRange(op.remoteOffset, kWordBytes, r->second.key.bytes);
    if (!bad.empty()) invalid("remote window " + std::to_string(op.remoteWindow) + ": " + bad);
    if (r->second.key.cuda) invalid("atomics on GPU windows are not supported by the verbs transport");
    w.remote = r->second.key.addr + op.remoteOffset;
    w.rkey = r->second.key.rkey;
    if (t_.nativeAtomics_ && op.kind == SignalOp::kAdd && w.remote % kWordBytes != 0)
      invalid("the word is not 8-byte aligned in memory (the window starts at an unaligned address)");
  }
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  w.op = newOp(op.cookie, op.peer, 1);
  if (t_.nativeAtomics_ && op.kind == SignalOp::kAdd) {
    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.add = op.value;
    w.local = reinterpret_cast<uint64_t>(buffer_.get());  // the scratch word takes the old value
    w.length = kWordBytes;
    w.lkey = mr_->lkey;
  } else {
    const ControlRecord record{op.remoteWindow, static_cast<uint32_t>(op.kind), op.remoteOffset, op.value, 0, 0};
    setSend(w, &record, sizeof record);
  }
  qps_[op.peer].backlog.push_back(w);
  flush(op.peer);
}

void VerbsLane::postMessage(const MessageOp& op) {
  std::string bad = common::checkMessageOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseMessage(who(), op, bad);
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  MessageRecord record{};
  record.bytes = op.bytes;
  record.kind = kControlMessage;
  std::memcpy(record.data, op.data, op.bytes);
  PendingWr w;
  w.op = newOp(op.cookie, op.peer, 1);
  setSend(w, &record, kMessageHeaderBytes + op.bytes);  // only the message's own bytes travel
  qps_[op.peer].backlog.push_back(w);
  flush(op.peer);
}

void VerbsLane::abandon() {
  for (QpSlot& q : qps_) {
    q.qp.reset();
    q.backlog.clear();
    q.posted.clear();
  }
  for (bool& b : sendSlotBusy_) b = false;
  for (uint32_t i = 0; i < ops_.size(); ++i)
    if (ops_[i].remaining > 0) {
      ops_[i].remaining = 1;
      finishWr(i, Status::kShutdown);
    }
}

void VerbsLane::failBacklog(int peer) {
  QpSlot& q = qps_[peer];
  while (!q.backlog.empty()) {
    PendingWr p = q.backlog.front();
    q.backlog.pop_front();
    retire(peer, PostedWr{0, p.op, p.sendSlot, p.what}, Status::kPeerFailed);
  }
}

void VerbsLane::retire(int peer, const PostedWr& w, Status status) {
  if (w.sendSlot >= 0) sendSlotBusy_[w.sendSlot] = false;
  QpSlot& q = qps_[peer];
  if (w.what == PostedWr::kHeartbeat) q.heartbeatNs = 0;
  if (w.what == PostedWr::kCreditRead) {
    q.creditReadPending = false;
    if (status == Status::kOk) {
      const uint64_t consumed = atomicLoad(
          reinterpret_cast<uint64_t*>(buffer_.get() + 64 + static_cast<size_t>(peer) * kWordBytes), kAcquire);
      q.stagedFreed = std::max(q.stagedFreed, std::min(consumed, q.stagedSent));
    }
  }
  if (w.op != kNoOp) finishWr(w.op, status);
}

void VerbsLane::queueHeartbeat(int peer, uint64_t now) {
  QpSlot& q = qps_[peer];
  q.lastPostNs = now;
  PendingWr h;
  {
    // A zero-byte write needs no valid target, but some providers check the rkey anyway: use a window's (or, for a
    // staged one, its staging area's).
    std::shared_lock<std::shared_mutex> lock(t_.windowsMutex_);
    bool found = false;
    for (const auto& [id, r] : t_.remoteWindows_[peer])
      if (r.key.staged ? r.key.stagingRkey != 0 : r.key.rkey != 0) {
        h.remote = r.key.staged ? r.key.stagingAddr : r.key.addr;
        h.rkey = r.key.staged ? r.key.stagingRkey : r.key.rkey;
        found = true;
        break;
      }
    if (!found) return;
  }
  h.op = kNoOp;
  h.what = PostedWr::kHeartbeat;
  h.opcode = IBV_WR_RDMA_WRITE;
  h.length = 0;
  q.heartbeatNs = now;
  q.backlog.push_back(h);
  flush(peer);
}

void VerbsLane::flush(int peer) {
  QpSlot& q = qps_[peer];
  if (t_.failed(peer)) return failBacklog(peer);
  constexpr size_t kBatch = 32;
  ibv_send_wr wrs[kBatch];
  ibv_sge sges[kBatch];
  const uint32_t depth = static_cast<uint32_t>(t_.sendDepth_);
  const uint32_t every = static_cast<uint32_t>(std::min(t_.options_.signalEvery, t_.sendDepth_));
  while (!q.backlog.empty() && q.posted.size() < depth) {
    const size_t n = std::min({kBatch, q.backlog.size(), static_cast<size_t>(depth - q.posted.size())});
    const size_t before = q.posted.size();
    const uint32_t sinceSignal = q.sinceSignal;
    for (size_t i = 0; i < n; ++i) {
      const PendingWr& p = q.backlog[i];
      ibv_send_wr& wr = wrs[i];
      wr = ibv_send_wr{};
      const uint64_t seq = q.nextSeq + i;
      wr.wr_id = (static_cast<uint64_t>(peer) << 40) | (seq & kSeqMask);
      wr.next = i + 1 < n ? &wrs[i + 1] : nullptr;
      wr.sg_list = &sges[i];
      wr.num_sge = p.length > 0 ? 1 : 0;
      wr.opcode = p.opcode;
      // Selective signalling: every `every`-th, the last of the chain and RDMA reads (their result is awaited).
      if (++q.sinceSignal >= every || i + 1 == n || p.opcode == IBV_WR_RDMA_READ) {
        wr.send_flags = IBV_SEND_SIGNALED;
        q.sinceSignal = 0;
      }
      sges[i] = ibv_sge{p.local, p.length, p.lkey};
      if (p.sendBytes > 0) {
        char* slot = buffer_.get() + creditEnd_ +
                     (static_cast<size_t>(peer) * t_.sendDepth_ + q.controlNext++ % t_.sendDepth_) * kControlSlotBytes;
        std::memcpy(slot, p.send, p.sendBytes);
        sges[i] = ibv_sge{reinterpret_cast<uint64_t>(slot), p.sendBytes, mr_->lkey};
        wr.num_sge = 1;
        if (p.sendBytes <= maxInline_) wr.send_flags |= IBV_SEND_INLINE;
      } else if (p.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = p.remote;
        wr.wr.atomic.rkey = p.rkey;
        wr.wr.atomic.compare_add = p.add;
      } else {
        wr.wr.rdma.remote_addr = p.remote;
        wr.wr.rdma.rkey = p.rkey;
        if (p.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htonl(p.imm);
        if (p.opcode != IBV_WR_RDMA_READ && p.length > 0 && p.length <= maxInline_) wr.send_flags |= IBV_SEND_INLINE;
      }
      q.posted.push_back(PostedWr{seq, p.op, p.sendSlot, p.what});
    }
    ibv_send_wr* bad = nullptr;
    try {
      GDX_IBV_CHECK(ibv_post_send(q.qp.get(), wrs, &bad));
    } catch (const VerbsError& e) {
      // Work requests before `bad` were posted; the rest were not and stay in the backlog (failed below).
      size_t posted = 0;
      while (posted < n && &wrs[posted] != bad) ++posted;
      q.posted.erase(q.posted.begin() + static_cast<std::ptrdiff_t>(before + posted), q.posted.end());
      q.sinceSignal = sinceSignal;
      q.nextSeq += posted;
      q.backlog.erase(q.backlog.begin(), q.backlog.begin() + static_cast<std::ptrdiff_t>(posted));
      t_.failPeer(peer,
                  "lane " + std::to_string(index_) + ": posting to rank " + std::to_string(peer) + ": " + e.what());
      return failBacklog(peer);
    }
    const uint64_t now = nowNs();
    if (before == 0) q.progressNs = now;
    q.lastPostNs = now;
    q.nextSeq += n;
    q.backlog.erase(q.backlog.begin(), q.backlog.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

void VerbsLane::progress() {
  if (!t_.connected_ || t_.stopping_.load(std::memory_order_relaxed)) return;
  ibv_wc wc[32];
  int n;
  while ((n = ibv_poll_cq(sendCq_.get(), 32, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      const int peer = static_cast<int>(wc[i].wr_id >> 40);
      const uint64_t seq = wc[i].wr_id & kSeqMask;
      QpSlot& q = qps_[peer];
      q.progressNs = nowNs();
      Status s = Status::kOk;
      if (wc[i].status != IBV_WC_SUCCESS) {
        s = Status::kPeerFailed;
        t_.failPeer(peer, "lane " + std::to_string(index_) + ": a work request to rank " + std::to_string(peer) +
                              " completed with status '" + ibv_wc_status_str(wc[i].status) + "' (vendor error " +
                              std::to_string(wc[i].vendor_err) + ")");
      }
      // Everything posted before the reported work request is done (and succeeded: RC completes in order).
      bool found = false;
      while (!q.posted.empty() && !found) {
        PostedWr w = q.posted.front();
        q.posted.pop_front();
        found = (w.seq & kSeqMask) == seq;
        retire(peer, w, found ? s : Status::kOk);
      }
      if (!found) GDX_ERROR(who() << ": a completion for an unknown work request to rank " << peer);
    }
    if (n < 32) break;
  }
  if (n < 0) GDX_ERROR(who() << ": ibv_poll_cq (send) failed");
  // Bounded waiting: a peer whose queue pair vanished may leave the NIC retrying for long (Soft-RoCE does not
  // always give up at all), so no completion for timeoutNs while work is outstanding fails the peer; moving
  // the QP to the error state then flushes the outstanding work.
  const uint64_t now = nowNs();
  for (int p = 0; p < t_.world_; ++p) {
    QpSlot& q = qps_[p];
    if (t_.failed(p)) {
      if (!q.backlog.empty()) failBacklog(p);
      continue;
    }
    const uint64_t heartbeatTimeout = std::min(kHeartbeatTimeoutNs, t_.options_.timeoutNs / 4);
    if (q.heartbeatNs != 0 && now - q.heartbeatNs > heartbeatTimeout)
      t_.failPeer(p, "lane " + std::to_string(index_) + ": rank " + std::to_string(p) +
                         " did not answer a heartbeat for " + std::to_string((now - q.heartbeatNs) / 1000000) +
                         " ms (status timeout)");
    else if (!q.posted.empty() && now - q.progressNs > t_.options_.timeoutNs)
      t_.failPeer(p, "lane " + std::to_string(index_) + ": no completion from rank " + std::to_string(p) + " for " +
                         std::to_string((now - q.progressNs) / 1000000) + " ms with " +
                         std::to_string(q.posted.size()) + " work requests outstanding (status timeout)");
    else if (!q.backlog.empty())
      flush(p);
    else if (p != t_.rank_ && q.posted.empty() && now - q.lastPostNs > kHeartbeatNs)
      queueHeartbeat(p, now);
  }
}

size_t VerbsLane::poll(Completion* out, size_t max) {
  progress();
  size_t k = std::min(max, done_.size());
  std::copy_n(done_.begin(), k, out);
  done_.erase(done_.begin(), done_.begin() + static_cast<std::ptrdiff_t>(k));
  inFlight_.fetch_sub(k, std::memory_order_relaxed);
  return k;
}

}  // namespace
}  // namespace verbs

std::unique_ptr<Transport> makeVerbsTransport(const VerbsTransportOptions& options) {
  return std::make_unique<verbs::VerbsTransport>(options);
}

}  // namespace gdx
