// The TCP backend of gdx::Transport: one-sided writes with immediates emulated over plain sockets.
//
// Connections: for every lane and every rank (itself included) a rank opens `socketsPerPeer` connections to
// that rank's listener and only ever sends on them; the connections it accepts only ever carry data to it. So
// who connects is fixed (the sender), a world of one works through its own listener, and every socket has one
// job. Each connection starts with a Hello (magic, version, secret, rank, lane, socket index) that the acceptor
// answers with a HelloAck, refusing strangers, wrong secrets, unknown ranks/lanes and duplicates.
//
// Threads: one acceptor (poll() over the listener and half-read Hellos), one sender per outgoing socket (a
// queue of chunks; writes larger than chunkBytes are split round-robin over the lane's sockets to the peer so
// they move in parallel), one receiver per incoming socket (validates each header, then receives the payload
// straight into the window and lets RxOrder decide what can be announced). An atomic is one more message of the
// lane's sequence (wire.hpp): sent on the next socket in turn, performed by RxOrder's delivery in sequence order. A
// control message (postMessage) travels the same way and is handed to the MessageHandler by that delivery.
//
// GPU windows (MemoryKind::kCuda, only in a build with CUDA) are staged through pinned host memory, one chunk at a
// time (transport/common/cuda_staging.hpp): each sender and receiver thread owns a chunk-sized pinned buffer and its
// own streams. A sender copies a chunk of a GPU window device->host into its buffer and sends it from there; a receiver
// receives a chunk for a GPU window into its buffer and copies it host->device before it tells RxOrder the chunk
// is placed, so an immediate is announced (and a later atomic performed) only after the GPU copy finished. A
// CUDA failure on either side fails the peer (the direction's sequence cannot continue without the chunk), like
// a local error moving a queue pair to the error state. Atomics on GPU windows are refused (kInvalidArgument at
// the sender; a malformed message at the receiver): the CPU cannot update GPU memory atomically.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sockets/socket.hpp"
#include "transport/common/cuda_staging.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/fault.hpp"
#include "transport/common/window_table.hpp"
#include "transport/tcp/rx_order.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/transport.hpp"

namespace gdx::tcp {

class TcpTransport;

/// A posted write, atomic or control message; freed by the sender thread that finishes its last chunk.
struct OpState {
  std::atomic<uint32_t> remaining{0};                                ///< chunks not yet handed to the kernel
  std::atomic<uint32_t> status{static_cast<uint32_t>(Status::kOk)};  ///< first failure of any chunk
  uint64_t cookie = 0;
  int peer = -1;
};

/// One chunk waiting for its socket.
struct TxItem {
  MessageHeader header;
  const char* data = nullptr;  ///< the payload; null for an atomic or a control message, carried in `inlined`
  OpState* op = nullptr;
  int cudaDevice = -1;  ///< >= 0: `data` lies in a GPU window on this device and is staged before it is sent
  uint8_t inlined[kMaxMessageBytes] = {};  ///< an atomic's operand or a control message (header.chunkBytes bytes)
  common::FaultAction fault = common::FaultAction::kNone;  ///< GDX_FAULT's action on this chunk
};

/// One connection of a (lane, peer) pair: socket `index` of the lane's sockets to or from `peer`.
struct LaneSocket {
  net::UniqueFd fd;
  int peer = -1;
  int lane = 0;
  int index = 0;
};

/// An outgoing connection and its sender thread.
struct TxSocket : LaneSocket {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<TxItem> queue;
  bool goodbye = false;  ///< shutdown(): send GOODBYE once the queue is empty, then stop
  bool broken = false;   ///< a send failed; the stream is no longer in step, so nothing more is sent
  bool closed = false;   ///< the sender thread has finished; post() must not queue anything more
  bool sending = false;  ///< a thread (the sender, or a poster sending inline) is writing to the socket
  std::thread thread;
};

/// An incoming connection and its receiver thread.
struct RxSocket : LaneSocket {
  std::thread thread;
};

class TcpLane : public TransportLane {
 public:
  TcpLane(TcpTransport& transport, int index, int worldSize);
  void post(const WriteOp& op) override;
  void postAtomic(const AtomicOp& op) override;
  void postMessage(const MessageOp& op) override;
  size_t poll(Completion* out, size_t max) override;
  size_t inFlight() const override { return inFlight_.load(std::memory_order_relaxed); }
  /// The next completion calls the transport's CompletionHandler (from the thread that makes it: a sender thread, a
  /// failure, or the posting thread of an inline send), so a waiting caller sleeps instead of yielding while bulk
  /// writes are on the wire (on a host with few cores that yielding takes CPU from the sender threads).
  bool armCompletion() override;

  /// Called by sender threads when a chunk of `op` is sent or failed; completes the op after its last chunk.
  void finishChunk(OpState* op, Status status);

 private:
  void complete(uint64_t cookie, int peer, Status status);
  /// Counts a validated op in flight; false (after completing it) when its peer has already failed or left.
  bool admitOp(uint64_t cookie, int peer);
  /// "TCP transport rank R lane L", the start of the lane's errors.
  std::string who() const;
  /// The header of the next message of this lane to `peer` (takes its sequence number).
  MessageHeader nextMessage(MessageType type, int peer, uint32_t window, uint64_t offset, uint64_t bytes);
  /// Queues a one-chunk message (an atomic or a control message, `h.chunkBytes` bytes of `payload` carried inline)
  /// on the next socket to `peer` in turn; any socket keeps the order, as the receiver sequences by seq.
  void queueInline(const MessageHeader& h, int peer, uint64_t cookie, const void* payload);
  /// The socket to `peer` for a one-chunk item of `bytes`: the next in turn, or socket 0 for a small item in latency
  /// mode (inlineSendBytes).
  uint32_t socketForOne(int peer, uint64_t bytes);
  /// Sends `item` from the calling thread when `tx` is idle and the item qualifies (inlineSendBytes); true when it
  /// did (the item is finished), false when the item must be queued.
  bool trySendNow(TxSocket& tx, const TxItem& item);

  TcpTransport& t_;
  const int index_;
  std::vector<uint64_t> nextSeq_;     ///< per peer: number of the next write or atomic of this lane
  std::vector<uint32_t> nextSocket_;  ///< per peer: where the round-robin over sockets continues
  std::mutex doneMutex_;
  std::deque<Completion> done_;
  std::atomic<size_t> inFlight_{0};
  std::atomic<bool> armed_{false};  ///< armCompletion() asked for an announcement of the next completion
};

class TcpTransport : public common::TransportBase {
 public:
  explicit TcpTransport(const TcpTransportOptions& options);
  ~TcpTransport() override;

  std::string name() const override { return "tcp"; }
  std::string localAddress() override { return advertised_; }
  void connect(const std::vector<std::string>& addresses, int lanes) override;
  int numLanes() const override { return connected_ ? static_cast<int>(lanes_.size()) : 0; }
  TransportLane& lane(int index) override;

  std::string registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) override;
  /// As with an RDMA memory region, the caller must make sure no peer still writes into the window (and no
  /// local write still reads from it) when it is deregistered: a chunk already being received completes.
  void deregisterWindow(uint32_t id) override;
  std::string registerWindowFor(uint32_t id, void* base, size_t bytes, MemoryKind kind, RemoteAccess access) override;
  void setRemoteAccess(uint32_t id, RemoteAccess access) override;
  void addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) override;

  Status peerStatus(int peer) const override;

  void shutdown() override;

 private:
  friend class TcpLane;
  enum PeerState : int { kPeerOk = 0, kPeerGoodbye = 1, kPeerFailed = 2 };
  struct PendingHello;

  size_t slot(int lane, int peer, int socket) const {
    return (static_cast<size_t>(lane) * world_ + peer) * sockets_ + socket;
  }
  TxSocket& txSocket(int lane, int peer, int socket) { return *tx_[slot(lane, peer, socket)]; }

  // Connection setup (tcp_connect.cpp).
  void acceptorLoop();
  void handleHello(PendingHello& pending);
  void openOutgoing(const std::vector<std::string>& addresses, uint64_t deadlineNs);
  void awaitIncoming(uint64_t deadlineNs);
  std::string missingRanks(bool incoming) const;

  // Data path (tcp_sender.cpp, tcp_receiver.cpp).
  void senderLoop(TxSocket& s);
  /// Sends one chunk on `s` (the caller has the socket to itself: `sending`), with the checks every chunk gets
  /// first; `staging` may be null for chunks of host memory.
  Status sendItem(TxSocket& s, const TxItem& item, common::CudaStaging* staging);
  Status sendChunk(TxSocket& s, const TxItem& item, common::CudaStaging* staging);
  Status sendFaulty(TxSocket& s, TxItem item, common::CudaStaging* staging);
  Status onSendFailure(TxSocket& s, const net::IoStatus& io, const std::string& why);
  void sayGoodbye(TxSocket& s);
  void receiverLoop(RxSocket& s);
  bool receiveOne(RxSocket& s, common::CudaStaging& staging);
  bool txAborted() const;

  // Failure handling.
  void failPeer(int peer, const std::string& why);
  /// Fails `peer` for what it sent, after telling it why: a kRefusal on every socket to it (each taken from its
  /// sender as an inline poster takes it, bounded), so that each of its receivers reads the reason before the end
  /// of the connection (tcp_refusal.cpp).
  void refusePeer(int peer, const std::string& why);
  /// A receiver found its connection closed or broken: waits briefly for a refusal that another receiver of the peer
  /// may be reading (the peer sends one on every socket before it closes), then fails the peer with `why`.
  void failPeerAfterRefusalGrace(int peer, const std::string& why);
  Status failedStatus(int peer) const;

  const TcpTransportOptions options_;
  common::FaultInjector fault_;
  const int rank_;
  const int world_;
  const int sockets_;
  net::UniqueFd listener_;
  std::string advertised_;

  common::WindowTable<> windows_;

  std::unique_ptr<std::atomic<int>[]> peerState_;  ///< per peer: a PeerState
  mutable std::mutex whyMutex_;
  std::vector<std::string> why_;  ///< per peer: why it failed

  int numLanes_ = 0;
  bool connected_ = false;
  bool connectStarted_ = false;
  std::vector<std::unique_ptr<TcpLane>> lanes_;
  std::vector<std::unique_ptr<TxSocket>> tx_;      ///< [lane][peer][socket]
  std::vector<std::unique_ptr<RxSocket>> rx_;      ///< [lane][peer][socket]; filled by the acceptor
  std::vector<std::unique_ptr<RxOrder>> rxOrder_;  ///< [lane][peer]
  std::mutex rxMutex_;                             ///< guards rx_ while the acceptor fills it
  std::condition_variable rxCv_;
  std::string refusedRank_;  ///< why a hello of a rank of the job (it had the secret) was refused; under rxMutex_
  size_t rxFilled_ = 0;

  std::thread acceptor_;
  net::WakePipe wake_;  ///< wakes the acceptor at shutdown
  std::atomic<bool> acceptorStop_{false};

  std::mutex shutdownMutex_;
  bool shutDown_ = false;
  std::atomic<bool> stopping_{false};         ///< shutdown() began: posts refused, failures not reported
  std::atomic<uint64_t> drainDeadlineNs_{0};  ///< senders give up pending chunks after this (0: no limit)
  std::atomic<bool> rxStop_{false};           ///< receivers stop at the next chance
};

}  // namespace gdx::tcp
