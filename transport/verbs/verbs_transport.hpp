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
// thread per transport polls the shared receive CQ (busy for kReceiveSpinNs after the last receive, then blocking on
// the completion channel with a short timeout so shutdown stays bounded). The lanes' send CQs share that channel: a
// lane's caller that has nothing to do but wait for completions arms its send CQ (armCompletion()) and sleeps, and
// the receiver thread, woken by the event, calls the CompletionHandler, so no thread spins on a send CQ. An
// IBV_WC_RECV_RDMA_WITH_IMM becomes an ImmHandler call (RC delivers in order, so the write's data and every earlier
// write of that QP are in place); every consumed receive is reposted. The QPs' rnr_retry is infinite
// (verbs_resources.cpp), so a SEND that finds no receive posted waits for the repost instead of failing.
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
//
// Files: verbs_transport.cpp (construction, options, failure, shutdown), verbs_connect.cpp (the lanes' queue pairs,
// the address blob, connect()), verbs_memory.cpp (window registration and keys), verbs_send.cpp (posting, the
// backlog, signalling, completions), verbs_staging.cpp (staged windows, both ends), verbs_receive.cpp (the receiver
// thread, control records, software atomics, messages), verbs_heartbeat.cpp (idle peers and bounded waiting).
// What the three backends share (checks, window tables, CUDA copies, delivery to the handlers) is in transport/common/.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/common/cuda_staging.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/fault.hpp"
#include "transport/common/window_table.hpp"
#include "transport/transport.hpp"
#include "transport/verbs/heartbeat_clock.hpp"
#include "transport/verbs/verbs_resources.hpp"
#include "transport/verbs/verbs_wire.hpp"

namespace gdx::verbs {

/// A credit word of the staging area (and the size of the lane's credit-read targets).
constexpr uint64_t kWordBytes = 8;
constexpr uint32_t kMaxChunk = 1u << 30;
constexpr uint64_t kHeartbeatNs = 100ull * 1000 * 1000;
/// A heartbeat unanswered this long (or timeoutNs / 4, if less) while nothing arrives from the peer fails it
/// (heartbeat_clock.hpp says how the time is counted): some devices (Soft-RoCE) keep retrying a vanished peer far
/// longer than that.
constexpr uint64_t kHeartbeatTimeoutNs = 2000ull * 1000 * 1000;
constexpr uint32_t kNoOp = 0xffffffffu;
constexpr uint64_t kSeqMask = (uint64_t{1} << 40) - 1;

/// Where the staging rings start in a receive staging area with rings for `lanes` lanes of a world of `world`: after
/// its credit words, rounded up to a page.
inline size_t stagingHeaderBytes(uint64_t lanes, uint64_t world) {
  return (lanes * world * kWordBytes + 4095) / 4096 * 4096;
}

class VerbsTransport;

/// One work request not yet handed to the QP.
struct PendingWr {
  uint32_t op = 0;
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  ibv_sge local{};  ///< the bytes written or read here (length 0: none; a SEND takes `send` instead)
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
void setSend(PendingWr& w, const void* record, uint32_t bytes);

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
  HeartbeatClock heartbeat;     ///< the heartbeat now outstanding, if any, and how long the peer has been silent
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
  VerbsLane(VerbsTransport& t, int index);  // verbs_connect.cpp
  void post(const WriteOp& op) override;
  void postAtomic(const AtomicOp& op) override;
  void postMessage(const MessageOp& op) override;
  size_t poll(Completion* out, size_t max) override;
  size_t inFlight() const override { return inFlight_.load(std::memory_order_relaxed); }
  /// Requests an event for the next send completion (ibv_req_notify_cq); the receiver thread turns it into a call
  /// of the CompletionHandler.
  bool armCompletion() override;

  int index() const { return index_; }
  ibv_qp* qp(int peer) const { return qps_[peer].qp.get(); }
  uint32_t psn(int peer) const { return qps_[peer].psn; }
  uint32_t maxInline() const { return maxInline_; }
  /// shutdown(): destroys the QPs and completes every pending op with kShutdown.
  void abandon();

 private:
  // Posting and completions (verbs_send.cpp).
  std::string who() const;
  uint32_t newOp(uint64_t cookie, int peer, uint32_t workRequests);
  void finishWr(uint32_t op, Status status);
  void failedNow(uint64_t cookie, int peer);
  /// GDX_FAULT's action on this operation to `peer`, applied where it can be here: a drop completes it at once
  /// (true: nothing else to do), a delay sleeps, a close forces the peer's queue pair into the error state; a
  /// corrupt is left to the caller (it damages the operation's local key).
  bool injectFault(int peer, uint64_t cookie, common::FaultAction* action);
  void flush(int peer);
  void failBacklog(int peer);
  /// Reaps the send CQ, then watchPeers(): makes progress on every QP of the lane.
  void progress();
  /// Retires the work requests that the send CQ's completions cover.
  void reapSendCq();
  void retire(int peer, const PostedWr& w, Status status);

  // Staged windows (verbs_staging.cpp).
  /// Makes progress until `ready()` or the peer failed or timeoutNs passed (the peer is then failed); true if ready.
  template <class Ready>
  bool progressUntil(int peer, const char* what, Ready ready);
  /// A free staging send slot (allocating the slots on first use), or -1 when the peer failed meanwhile.
  int32_t acquireSendSlot(int peer, std::string* why);
  void postStaged(const WriteOp& op, uint32_t id, const char* localBase, bool localStaged, int localDevice,
                  MemoryKind localKind, uint32_t lkey, const WindowKey& remote);
  /// Where the lane's credit read of `peer`'s staging area lands (in buffer_).
  uint64_t* creditWord(int peer) const;
  /// A credit read of the peer's staging area retired with `status`: frees the slots the peer has consumed.
  void creditReadDone(int peer, Status status);

  // Liveness (verbs_heartbeat.cpp).
  /// Fails peers whose heartbeat or outstanding work went unanswered too long, posts backlogs and heartbeats.
  void watchPeers(uint64_t now);
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

class VerbsTransport : public common::TransportBase {
 public:
  explicit VerbsTransport(const VerbsTransportOptions& options);
  ~VerbsTransport() override { shutdown(); }

  std::string name() const override { return "verbs"; }
  std::string localAddress() override { return address_; }
  void connect(const std::vector<std::string>& addresses, int lanes) override;
  int numLanes() const override { return connected_ ? numLanes_ : 0; }
  TransportLane& lane(int index) override;

  std::string registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) override;
  void deregisterWindow(uint32_t id) override;
  /// Providers may lack ibv_rereg_mr (rxe does), and which do is known only by trying.
  bool accessFixedAtRegistration() const override { return true; }
  /// kNone: the memory region gets local access only, so the NIC refuses every peer's write into it.
  std::string registerWindowFor(uint32_t id, void* base, size_t bytes, MemoryKind kind, RemoteAccess access) override;
  /// kNone takes remote write (and atomic) access from the window's memory region (ibv_rereg_mr, where the provider
  /// has it: rxe has not), so that the NIC refuses a peer's write into it whatever key the peer presents; kWrite gives
  /// it back. kImmediateWrites stays writable: a NIC cannot tell a write that carries an immediate from one that does
  /// not. Staged windows are written through the staging area, never directly: nothing to change.
  void setRemoteAccess(uint32_t id, RemoteAccess access) override;
  void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) override;

  Status peerStatus(int peer) const override {
    if (peer < 0 || peer >= world_) return Status::kInvalidArgument;
    if (peerFailed_[peer].load()) return Status::kPeerFailed;
    return stopping_.load() ? Status::kShutdown : Status::kOk;
  }
  void shutdown() override;

 private:
  friend class VerbsLane;
  struct LocalWindow : common::LocalWindow {
    bool staged = false;
    UniqueMr mr;
    int mrAccess = 0;  ///< the ibv_access_flags `mr` has now
  };
  struct RemoteWindow : common::RemoteWindow {
    WindowKey key{};
  };

  std::string who() const { return "verbs transport rank " + std::to_string(rank_); }
  /// The ibv_access_flags of a memory region that peers may use as `remote` says (kImmediateWrites: write).
  int accessFlags(RemoteAccess remote) const;
  bool failed(int peer) const { return peerFailed_[peer].load(std::memory_order_acquire); }
  void failPeer(int peer, const std::string& why);

  // Connection setup (verbs_connect.cpp).
  /// The address blob of localAddress(): the header and every lane's QP numbers (lanes_ created).
  std::string makeAddress() const;

  // Memory registration (verbs_memory.cpp).
  UniqueMr registerCuda(void* base, size_t bytes, int access, std::string* how);

  // Receiving (verbs_receive.cpp).
  void receiverLoop();
  /// Takes every event waiting on the completion channel (without blocking): a receive CQ event disarms it (*recvArmed
  /// false), a send CQ event goes to the CompletionHandler with its lane.
  void takeChannelEvents(bool* recvArmed);
  void onReceive(const ibv_wc& wc);
  /// Acts on a received SEND of `bytes` bytes at `data` (a control record or a message); "" or why it is malformed.
  std::string applySend(int lane, int peer, const char* data, uint32_t bytes);
  void deliver(int peer, const MessageRecord& r);
  void applyControl(int peer, const ControlRecord& r);
  void postReceive(int lane, int peer, uint32_t slot);

  // Staged windows, receiving end (verbs_staging.cpp).
  void applyStaged(int lane, int peer, const ControlRecord& r);
  /// The receive staging area (allocated by the first staged window; the windows' lock held exclusively).
  void ensureStagingArea();

  const VerbsTransportOptions options_;
  const int rank_;
  const int world_;
  PortInfo port_;
  PathOptions path_;
  int sendDepth_ = 0;
  int recvDepth_ = 0;
  bool nativeAtomics_ = false;
  common::FaultInjector fault_;  // GDX_FAULT (declared after options_: built from them)
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
  // [lanes][world][kStageSlots] slots of kStageSlotBytes. Allocated with the first staged window, under the
  // windows' lock (exclusive), and read under it (shared).
  AlignedBuffer staging_;
  UniqueMr stagingMr_;
  size_t stagingHeader_ = 0;
  common::CudaCopier rxCopier_;  ///< used by the receiver thread only
  common::WindowTable<LocalWindow, RemoteWindow> windows_;
  std::vector<std::unique_ptr<VerbsLane>> lanes_;

  std::unique_ptr<std::atomic<bool>[]> peerFailed_;
  /// When anything last arrived from each peer (receiver thread; nowNs(), 0: never): proof that it is alive.
  std::unique_ptr<std::atomic<uint64_t>[]> heardNs_;

  bool connectStarted_ = false;
  bool connected_ = false;
  int numLanes_ = 0;
  std::thread receiver_;
  std::atomic<bool> rxStop_{false};
  std::atomic<bool> stopping_{false};
  std::mutex shutdownMutex_;
  bool shutDown_ = false;
};

}  // namespace gdx::verbs
