// The transport interface: one-sided writes with an optional 32-bit immediate, the semantics of an RDMA
// reliable-connected queue pair. Backends live in rdma/ (verbs/, tcp/, loopback/); the proxy sees only this.
//
// Semantics every backend provides:
//  * Windows are registered locally under an id chosen by the caller (the Context); peers learn (id, size,
//    key) through the bootstrap and add them with addRemoteWindow(). A write names windows and offsets, never
//    raw addresses, so both sides bounds-check it: the sender before posting, the receiver before placing.
//  * Writes are posted on a TransportLane (one per proxy thread, like a set of QPs) and are asynchronous. Each
//    posted write produces exactly one Completion on the lane that posted it, once its source buffer may be
//    reused (or once it failed).
//  * Ordering: on one lane, to one peer, a write-with-immediate is announced to the receiver (ImmHandler)
//    only after its own data and the data of every earlier write of that lane to that peer are in place.
//    Writes without an immediate are never announced.
//  * Atomics (postAtomic): a remote 64-bit add or set takes its place in that same per-(lane, peer) order: it is
//    performed only after every earlier write and atomic of the lane to the peer is in place, an immediate posted
//    after it is announced only after it was performed, and it is never announced itself.
//  * Control messages (postMessage): up to kMaxMessageBytes bytes handed to the receiver's MessageHandler. A message
//    takes its place in the same per-(lane, peer) order: it is delivered only after every earlier write and atomic
//    of the lane to the peer is in place and after earlier immediates of the lane to the peer were announced (so it
//    behaves like a write-with-immediate that carries its own payload instead of naming a window).
//  * GPU windows (MemoryKind::kCuda) work in both backends when gdx is built with CUDA; remote atomics on them are
//    refused with kInvalidArgument (a CPU-driven transport cannot update GPU memory atomically).
//  * Failure: a peer that dies, closes without saying goodbye, or sends anything malformed is marked failed;
//    PeerFailureHandler runs once for it, pending and later writes to it complete with Status::kPeerFailed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gdx/config.hpp"
#include "gdx/status.hpp"
#include "gdx/types.hpp"

namespace gdx {

/// One write, as posted by a proxy thread.
struct WriteOp {
  int peer = -1;
  uint32_t localWindow = 0;
  uint64_t localOffset = 0;
  uint32_t remoteWindow = 0;
  uint64_t remoteOffset = 0;
  uint64_t bytes = 0;
  bool withImm = false;
  uint32_t imm = 0;
  uint64_t cookie = 0;  ///< returned unchanged in the Completion
};

/// A remote 64-bit atomic a lane can post (signals and atomicAdd of the device API use them).
struct AtomicOp {
  int peer = -1;
  uint32_t remoteWindow = 0;
  uint64_t remoteOffset = 0;  ///< 8-byte aligned, inside the window
  SignalOp kind = SignalOp::kAdd;
  uint64_t value = 0;
  uint64_t cookie = 0;  ///< returned unchanged in the Completion
};

/// Largest payload of a control message (TransportLane::postMessage).
constexpr size_t kMaxMessageBytes = 64;

/// A small control message (the relay's forward requests use it): delivered to the receiver's MessageHandler.
struct MessageOp {
  int peer = -1;
  uint32_t bytes = 0;  ///< 1..kMaxMessageBytes
  uint8_t data[kMaxMessageBytes] = {};
  uint64_t cookie = 0;  ///< returned unchanged in the Completion
};

/// What a receiver gets for each message.
struct RemoteMessage {
  int peer = -1;
  uint32_t bytes = 0;
  uint8_t data[kMaxMessageBytes] = {};
};

/// Sender-side completion of one WriteOp, AtomicOp or MessageOp.
struct Completion {
  uint64_t cookie = 0;
  Status status = Status::kOk;
  int peer = -1;
};

/// What a receiver learns about an arriving write-with-immediate, once its data is in place.
struct RemoteWrite {
  int peer = -1;
  uint32_t window = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t imm = 0;
};

/// A sending context owned by one proxy thread. Not thread-safe: one thread posts and polls.
class TransportLane {
 public:
  virtual ~TransportLane() = default;
  /// Posts a write; throws gdx::Error(kInvalidArgument) for an unknown peer, an unknown window or a range past
  /// either window's end, before anything is sent. A failed peer gives a Completion with kPeerFailed.
  virtual void post(const WriteOp& op) = 0;
  /// Posts a remote atomic on the 64-bit word at (remoteWindow, remoteOffset) of `peer`. It is performed at
  /// the receiver after every earlier write and atomic of this lane to that peer is in place (the same ordering
  /// as an announced immediate), as a system-scope atomic with release semantics, so a thread (or a GPU kernel
  /// on host-mapped memory) that polls the word and sees the new value also sees the data written before it.
  /// Validation and failure behave as for post(): kInvalidArgument (unknown peer/window, offset past the end or
  /// not 8-byte aligned) is thrown before anything is sent; one Completion per op.
  virtual void postAtomic(const AtomicOp& op) = 0;
  /// Posts a control message to `peer`. It takes its place in the same per-(lane, peer) order as writes and
  /// atomics: it is delivered to the receiver's MessageHandler only after every earlier write and atomic of this
  /// lane to that peer is in place (and, like a write-with-immediate, after earlier immediates of this lane to that
  /// peer were announced). One Completion per message, once the message can no longer be lost by the sender (or
  /// with kPeerFailed). An unknown peer or `bytes` outside 1..kMaxMessageBytes throws gdx::Error(kInvalidArgument)
  /// before anything is sent. A message to this rank itself works like a write to itself.
  virtual void postMessage(const MessageOp& op) = 0;
  /// Moves up to `max` finished writes, atomics and messages into `out`; returns how many.
  virtual size_t poll(Completion* out, size_t max) = 0;
  /// Writes, atomics and messages posted and not yet returned by poll().
  virtual size_t inFlight() const = 0;
  /// Event-driven waiting, for a thread that would otherwise keep polling while work is in flight: asks the backend
  /// to call the transport's CompletionHandler once when a completion may be ready for poll(), from whichever thread
  /// made it ready (a transport thread; over TCP also a poster whose operation completed at once). false when the
  /// backend cannot announce completions (the caller keeps polling). A completion that became ready before the call may
  /// go unannounced: poll once more after a true answer, then sleep.
  virtual bool armCompletion() { return false; }
};

/// What peers may do to a local window (Transport::setRemoteAccess()).
enum class RemoteAccess : uint8_t {
  kWrite,            ///< write it (the default of a registered window)
  kImmediateWrites,  ///< only writes that carry an immediate (each announced to this side once in place)
  kNone,             ///< nothing: the window is only the source of this side's writes
};

class Transport {
 public:
  using ImmHandler = std::function<void(const RemoteWrite&)>;
  using MessageHandler = std::function<void(const RemoteMessage&)>;
  using PeerFailureHandler = std::function<void(int peer, const std::string& why)>;
  using CompletionHandler = std::function<void(int lane)>;

  virtual ~Transport() = default;
  virtual std::string name() const = 0;

  /// This rank's address blob, to be exchanged through the bootstrap before connect().
  virtual std::string localAddress() = 0;
  /// Collective: connects `lanes` lanes to every rank (itself included) from the gathered address blobs
  /// (index = rank). Handlers must be set before.
  virtual void connect(const std::vector<std::string>& addresses, int lanes) = 0;
  virtual int numLanes() const = 0;
  virtual TransportLane& lane(int index) = 0;

  /// Registers local memory as window `id`; returns the key blob peers need to address it.
  virtual std::string registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) = 0;
  virtual void deregisterWindow(uint32_t id) = 0;
  /// registerWindow() with what peers may do to it decided from the start: a backend whose NIC checks access (verbs)
  /// registers the memory without remote access for kNone, which setRemoteAccess() cannot always take away later.
  virtual std::string registerWindowFor(uint32_t id, void* base, size_t bytes, MemoryKind kind, RemoteAccess access) {
    std::string key = registerWindow(id, base, bytes, kind);
    if (access != RemoteAccess::kWrite) setRemoteAccess(id, access);
    return key;
  }
  /// Whether the access a window was registered with may not be changed later (verbs: a provider without
  /// ibv_rereg_mr), so that a window that peers may write later must be registered writable from the start.
  virtual bool accessFixedAtRegistration() const { return false; }
  /// Narrows (or widens again) what peers may do to local window `id`; a write the access does not allow fails the
  /// peer that sent it, and nothing of it is written. Backends that cannot tell such writes apart allow them all
  /// (this default; verbs: ibv_rereg_mr where the provider has it, else registerWindowFor() decides once).
  virtual void setRemoteAccess(uint32_t id, RemoteAccess access) {
    (void)id;
    (void)access;
  }
  /// Records window `id` of `peer` (size and key as that peer's registerWindow returned them).
  virtual void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) = 0;

  /// Called from transport threads for every announced write-with-immediate; must be thread-safe and short.
  virtual void setImmHandler(ImmHandler handler) = 0;
  /// Called from transport threads for every delivered control message; must be thread-safe and short, and be set
  /// before connect(). A message that arrives while no handler is set is dropped (with a WARN naming the peer).
  virtual void setMessageHandler(MessageHandler handler) = 0;
  virtual void setPeerFailureHandler(PeerFailureHandler handler) = 0;
  /// Called from a transport thread when a lane that asked (TransportLane::armCompletion()) may have completions for
  /// poll(); must be thread-safe and short, and be set before connect(). Backends that cannot announce completions
  /// ignore it.
  virtual void setCompletionHandler(CompletionHandler handler) { (void)handler; }
  /// kOk while the connection to `peer` is healthy, else why it is not.
  virtual Status peerStatus(int peer) const = 0;

  /// Says goodbye to every peer and stops transport threads; idempotent, also run by the destructor.
  virtual void shutdown() = 0;
};

/// Options of the TCP backend.
struct TcpTransportOptions {
  int rank = 0;
  int worldSize = 1;
  int socketsPerPeer = 4;        ///< GDX_TCP_SOCKETS
  size_t chunkBytes = 1 << 20;   ///< writes larger than this are split over the sockets (GDX_TCP_CHUNK)
  std::string bindAddress = "";  ///< interface address to listen on; empty: the one MASTER_ADDR routes from
  std::string secret;            ///< the job secret; a connection that does not present it is refused
  uint64_t timeoutNs = kDefaultTimeoutNs;
  std::string fault;  ///< GDX_FAULT: a fault to inject for tests (transport/common/fault.hpp); empty: none
  /// A write, atomic or control message of at most this many bytes (host memory, one chunk) is sent by the posting
  /// thread itself when its socket is idle (nothing queued, its sender thread not sending), saving the hand-off to
  /// the sender thread: latency for callers that post one small message and wait (p2p endpoints), where a proxy
  /// draining a ring is better off handing off. 0 (the default): every chunk goes through the sender threads.
  size_t inlineSendBytes = 0;
  /// Fills the fields above from GDX_TCP_SOCKETS / GDX_TCP_CHUNK / GDX_TCP_BIND_ADDR, GDX_TIMEOUT_MS and GDX_FAULT.
  static TcpTransportOptions fromEnv(int rank, int worldSize, const std::string& secret);
};

std::unique_ptr<Transport> makeTcpTransport(const TcpTransportOptions& options);

/// Options of the RDMA verbs backend (rdma-core libibverbs; transport/verbs/verbs_transport.hpp describes it).
struct VerbsTransportOptions {
  int rank = 0;
  int worldSize = 1;
  /// Lanes prepared at construction (their queue pairs are in localAddress()); connect() may use up to this many.
  int lanes = 1;
  std::string hca;             ///< GDX_IB_HCA, NCCL_IB_HCA syntax: "mlx5_0:1,mlx5_1", "^mlx5_2" excludes, "=" exact
  int gidIndex = -1;           ///< GDX_IB_GID_INDEX; -1: the first RoCE v2 IPv4-mapped GID (Ethernet), 0 (InfiniBand)
  int serviceLevel = 0;        ///< GDX_IB_SL
  int trafficClass = 0;        ///< GDX_IB_TC
  int sendDepth = 256;         ///< GDX_IB_SEND_DEPTH: work requests in flight per queue pair (capped by the device)
  int recvDepth = 256;         ///< GDX_IB_RECV_DEPTH: receives kept posted per queue pair
  int timeout = 14;            ///< GDX_IB_TIMEOUT: local ACK timeout exponent (4.096 us * 2^timeout)
  int retryCount = 7;          ///< GDX_IB_RETRY_CNT
  bool nativeAtomics = false;  ///< GDX_IB_NATIVE_ATOMICS: kAdd as IBV_WR_ATOMIC_FETCH_AND_ADD (see the header)
  /// GDX_IB_SIGNAL_EVERY: a send work request is signalled every this many (and always the last of a post).
  int signalEvery = 16;
  /// GDX_IB_FORCE_STAGING (testing): host windows are staged like GPU windows that cannot be registered, so the
  /// staging protocol runs without a GPU.
  bool stageAllWindows = false;
  std::string fault;  ///< GDX_FAULT: a fault to inject for tests (transport/common/fault.hpp); empty: none
  uint64_t timeoutNs = kDefaultTimeoutNs;
  /// Fills the fields above from the GDX_IB_* variables and GDX_TIMEOUT_MS (lanes from GDX_PROXY_THREADS).
  static VerbsTransportOptions fromEnv(int rank, int worldSize);
};

/// The verbs backend: RC queue pairs per lane and peer (itself included), RDMA_WRITE / RDMA_WRITE_WITH_IMM.
/// The receiver does not learn which window or offset a write-with-immediate targeted (RDMA does not carry it):
/// its RemoteWrite has window kUnknownRemoteWindow, offset 0, and as bytes the size of the write's last work
/// request (the whole write unless it exceeded the port's max_msg_sz and was split). Throws
/// gdx::Error(kVerbs / kInvalidArgument) when no usable RDMA device is present. GPU windows are registered
/// through dmabuf, else peermem; when both fail (Soft-RoCE, no nvidia-peermem) they are staged: bytes travel
/// through registered host buffers and the receiver's transport thread copies them to the GPU before it announces
/// the write (staged writes are announced with their real window and offset). Without CUDA, GPU windows are refused.
/// Defined only in builds with libibverbs (libgdx is then compiled with GDX_HAVE_VERBS).
std::unique_ptr<Transport> makeVerbsTransport(const VerbsTransportOptions& options);
/// RemoteWrite::window of writes announced by a backend that cannot tell (verbs).
constexpr uint32_t kUnknownRemoteWindow = 0xffffffffu;

/// Options of the loopback backend.
struct LoopbackTransportOptions {
  uint64_t timeoutNs = kDefaultTimeoutNs;  ///< bound of waiting for one GPU copy (GDX_TIMEOUT_MS)
  /// Fills the fields above from GDX_TIMEOUT_MS.
  static LoopbackTransportOptions fromEnv();
};

/// The loopback backend, for a world of one: connect() takes exactly one address, its own localAddress(), and
/// every write is performed by post() itself in the calling thread (memcpy between host windows; with CUDA, a
/// cudaMemcpyAsync on a stream of the lane plus a bounded wait when either window is GPU memory), then its
/// immediate is announced from that same thread and its Completion queued for poll(). Validation is the TCP
/// backend's. Atomics work on host windows (system scope, release) and are refused on GPU windows. It measures
/// the path kernel -> ring -> proxy -> transport with the least transport overhead.
std::unique_ptr<Transport> makeLoopbackTransport(const LoopbackTransportOptions& options = {});

}  // namespace gdx
