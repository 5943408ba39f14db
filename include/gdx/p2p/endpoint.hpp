// gdx::p2p::Endpoint: point-to-point transfers between any two processes that know each other's address, without a
// job or a fixed world (KV-cache movers between prefill and decode, weight sync, NIXL-like engines). The names follow
// the P2P engines' Python API (connect/accept, reg, send/recv, sendv/recvv, async + poll, advertise + read/write),
// so that a Python layer can be thin. examples/p2p_endpoint.cpp shows the calls (README.md quotes it).
//
// Connections: every connection is its own transport between the two processes (GDX_TRANSPORT: tcp with
// GDX_TCP_SOCKETS sockets and GDX_TCP_CHUNK pipelining, or verbs RC queue pairs), logged at INFO; the dialling
// side sends and the accepting side receives in the seed API's terms, but every call works in both directions.
// Memory: reg() records a region; each connection registers it with its transport on first use (verbs: dmabuf,
// then peermem, else staged through host buffers; TCP: staged through pinned buffers). A transfer names
// (mrId, ptr, size) and must lie inside the region. GPU memory is read and written by the endpoint's own copies
// (staging, IPC), not ordered after work queued on the caller's streams: synchronise what writes the source of a
// send/write first (a cudaMemcpy from pageable memory can return before its DMA has landed), and what still reads
// the destination of a recv/read.
// Waits: every blocking call and wait() ends within GDX_TIMEOUT_MS; errors are gdx::Error naming the connection
// (peer address, GPU, transport), the operation and what it waited for. A failed connection fails only its own
// transfers; the endpoint and its other connections go on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gdx::p2p {

/// How an endpoint is set up; fromEnv() fills the defaults from GDX_* variables.
struct EndpointOptions {
  int localGpu = -1;        ///< the GPU this endpoint serves (-1: none; host memory only)
  int numCpus = 1;          ///< progress threads; connections are spread over them
  int port = -1;            ///< -1: GDX_P2P_PORT + max(localGpu, 0); 0: any free port (see port())
  std::string bindAddress;  ///< "" : every interface (advertised: GDX_TCP_BIND_ADDR, else the default route's)
  std::string transport;    ///< "" : GDX_TRANSPORT ("tcp" or "verbs")
  uint64_t timeoutNs = 0;   ///< 0: GDX_TIMEOUT_MS
  /// A secret shared by the endpoints that may connect (as a job secret): a client must present it, and one that
  /// does not is refused with the reason. "" (the default): any client that completes the handshake is accepted.
  std::string secret;
  int tcpSockets = 0;          ///< TCP sockets of the connections this endpoint dials, 1..64 (0: GDX_TCP_SOCKETS)
  uint64_t tcpChunkBytes = 0;  ///< their chunk size, 1 B..1 GiB (0: GDX_TCP_CHUNK)
  static EndpointOptions fromEnv(int localGpu = -1, int numCpus = 1);
};

/// What accept() returns.
struct Accepted {
  std::string ip;  ///< the client's address
  int remoteGpu = -1;
  uint64_t connId = 0;
};

/// One contiguous piece of registered memory, for the vectorised calls.
struct Iov {
  uint64_t mrId = 0;
  void* ptr = nullptr;
  size_t size = 0;
};

class Endpoint {
 public:
  explicit Endpoint(int localGpu = -1, int numCpus = 1);
  explicit Endpoint(const EndpointOptions& options);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // ---- connections ----
  /// Connects to the endpoint of `remoteGpu` at `ip` (port: -1 = GDX_P2P_PORT + remoteGpu). While nobody listens
  /// there yet it retries, pausing 10 ms, doubling to 1 s, and logs a WARN line every few seconds ("connecting to
  /// 10.0.0.1:19500 (GPU 0): connection refused, retrying for another 25 s"). Throws gdx::Error naming the address:
  /// kTimeout with the attempts and the last errno when nobody accepted within GDX_TIMEOUT_MS, or the peer's reason
  /// when it refuses.
  uint64_t connect(const std::string& ip, int remoteGpu, int port = -1);
  /// Closes connection `connId`: what still waits on it fails (kShutdown, "closed by close(...) on this side"), its
  /// sockets and threads are released, and the peer's transfers on it fail ("the peer closed the connection").
  /// Idempotent: closing it again does nothing. Connections whose peer left (or that failed otherwise) are released
  /// by the endpoint itself, at the next connect/accept; their ids then fail by name with the cause.
  void close(uint64_t connId);
  /// Waits (bounded by GDX_TIMEOUT_MS) for the next client whose handshake finished. Handshakes run at once, each in
  /// a thread of its own with GDX_TIMEOUT_MS for it, so a client that says nothing delays no other; a handshake
  /// refused (another transport, a missing or wrong secret) ends this call with kProtocol and the reason.
  Accepted accept();
  /// Waits at most `waitMs` for the next client (as accept() does): true with it in `*out`, false when none came in
  /// time. A caller that waits without a bound (Python's accept(), which Ctrl-C and close() end) calls it in a loop
  /// and checks between the calls whether to stop.
  bool tryAccept(uint64_t waitMs, Accepted* out);
  /// Accepts every client in a background thread from now on; accept() then hands them out in arrival order (a
  /// refused handshake is logged there instead).
  void startPassiveAccept();
  /// This endpoint's address (ip, port, GPU) as bytes for addRemoteEndpoint().
  std::string metadata() const;
  /// Connects to the endpoint `metadata` describes, once: later calls with the same endpoint return the same id.
  uint64_t addRemoteEndpoint(const std::string& metadata);
  int port() const;
  std::string ip() const;
  int localGpu() const;
  /// The transport connections use ("tcp" or "verbs"; forced by EndpointOptions::transport, else GDX_TRANSPORT).
  std::string transport() const;
  /// What carries connection `connId`, as logged when it came up: "tcp, 4 sockets, 1048576-byte chunks" (the
  /// dialling side's GDX_TCP_SOCKETS and GDX_TCP_CHUNK, adopted by the accepting side) or "verbs, RC".
  std::string connectionTransport(uint64_t connId);

  // ---- memory ----
  /// Registers [ptr, ptr + bytes) (host memory, or cudaMalloc memory in a CUDA build); returns its id.
  uint64_t reg(const void* ptr, size_t bytes);
  /// Forgets a region; later transfers naming it fail with kInvalidArgument, and so do queued ones when they come to
  /// it. Returns once no connection's transport reads it any more: writes already posted from it (a send's, a
  /// one-sided write's) are waited for, bounded by GDX_TIMEOUT_MS, past which their connection is closed.
  void dereg(uint64_t mrId);

  // ---- two-sided: each send is a message for the peer's receive of the same position ----
  // A receive's buffer may be larger than the message: the message lands at its start, the rest of the buffer is left
  // untouched, and the receive reports the message's size. A message larger than the buffer fails the send and the
  // receive, each naming both sizes, and writes nothing; the sends and receives after it pair as before. In the
  // vector forms every buffer is one message: buffer i of a recvv takes the i-th message of the peer's sends (piece
  // i of its sendv, or of its next sends), each no larger than its buffer.
  // Messages of at most 4 KiB leave at once into a buffer the receiver keeps per connection (32 of them at most
  // before the sender waits); a send of one completes once the peer's receive took it (confirmed with the peer's next
  // message, or within about a millisecond). Larger ones wait for the receive and are written in place. Blocking
  // calls do the connection's work in the calling thread; asynchronous ones leave it to the progress threads.
  void send(uint64_t connId, uint64_t mrId, const void* ptr, size_t size);
  /// Receives the next message into [ptr, ptr + size) (at most `size` bytes); returns its size.
  size_t recv(uint64_t connId, uint64_t mrId, void* ptr, size_t size);
  void sendv(uint64_t connId, const std::vector<Iov>& iovs);
  /// Receives one message into each buffer; returns their sizes, in the order of the buffers.
  std::vector<size_t> recvv(uint64_t connId, const std::vector<Iov>& iovs);
  uint64_t sendAsync(uint64_t connId, uint64_t mrId, const void* ptr, size_t size);
  uint64_t recvAsync(uint64_t connId, uint64_t mrId, void* ptr, size_t size);
  uint64_t sendvAsync(uint64_t connId, const std::vector<Iov>& iovs);
  uint64_t recvvAsync(uint64_t connId, const std::vector<Iov>& iovs);
  /// true once the transfer is done (its id is then forgotten); throws gdx::Error when it failed.
  bool poll(uint64_t transferId);
  /// The same; once done, `received` holds the size of the message each buffer of a receive got (one entry per
  /// buffer), and is left empty for the other transfers.
  bool poll(uint64_t transferId, std::vector<size_t>* received);
  /// Waits (bounded by GDX_TIMEOUT_MS from the start of the transfer) until it is done; throws when it failed.
  void wait(uint64_t transferId);
  /// The same, with the sizes a receive got in `received` (as poll()).
  void wait(uint64_t transferId, std::vector<size_t>* received);

  // ---- one-sided ----
  /// Lets the peer of `connId` read and write [ptr, ptr + size) of region `mrId`: returns the descriptor to hand
  /// it (out of band). The peer's transport refuses anything outside that range.
  std::string advertise(uint64_t connId, uint64_t mrId, const void* ptr, size_t size);
  /// Writes `size` bytes of local [ptr, ...) to the advertised range of `descriptor` at `remoteOffset`; returns
  /// once the data is in place at the peer.
  void write(uint64_t connId, uint64_t mrId, const void* ptr, size_t size, const std::string& descriptor,
             uint64_t remoteOffset = 0);
  /// Reads `size` bytes at `remoteOffset` of the advertised range into local [ptr, ...).
  void read(uint64_t connId, uint64_t mrId, void* ptr, size_t size, const std::string& descriptor,
            uint64_t remoteOffset = 0);
  void writev(uint64_t connId, const std::vector<Iov>& iovs, const std::vector<std::string>& descriptors);
  void readv(uint64_t connId, const std::vector<Iov>& iovs, const std::vector<std::string>& descriptors);
  uint64_t writeAsync(uint64_t connId, uint64_t mrId, const void* ptr, size_t size, const std::string& descriptor,
                      uint64_t remoteOffset = 0);
  uint64_t readAsync(uint64_t connId, uint64_t mrId, void* ptr, size_t size, const std::string& descriptor,
                     uint64_t remoteOffset = 0);

  // ---- same host, GPU to GPU over NVLink without a NIC (CUDA builds; kInvalidArgument elsewhere) ----
  /// A descriptor of [ptr, ptr + size) of GPU region `mrId` that a process on this host opens with CUDA IPC.
  std::string advertiseIpc(uint64_t mrId, const void* ptr, size_t size);
  /// Copies local GPU (or pinned host) [ptr, ...) into the IPC-advertised range at `remoteOffset`, peer to peer;
  /// returns once the copy finished. The copy runs on a stream of its own, not ordered after work already queued on
  /// the caller's streams: synchronise what writes [ptr, ...) (or, for readIpc, still uses it) first.
  void writeIpc(const void* ptr, size_t size, const std::string& descriptor, uint64_t remoteOffset = 0);
  void readIpc(void* ptr, size_t size, const std::string& descriptor, uint64_t remoteOffset = 0);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::p2p
