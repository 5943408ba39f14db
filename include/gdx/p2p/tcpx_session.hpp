// gdx::p2p::TcpxSession and TcpxTransfer: the session / transfer API of UCCL's TCPX P2P library (GPUDirect over TCP)
// on gdx's own P2P endpoints and TCP transport, for code written against that API on machines without a TCPX NIC.
// examples/p2p_tcpx.cpp shows the calls (README.md quotes it).
//
// Flow: the server calls listen(), which returns connection info (text) that the application ships to the client out
// of band; the client calls loadRemoteConnInfo(name, info) and connect(name), the server accept(name) (either may come
// first: connections are taken in the background from listen() on). Both register memory (registerMemory → mem_id)
// and create a transfer per peer (createTransfer(name)); the sender posts postSend(mem_id, offset, size), the
// receiver postRecv(...) with the same sizes in the same order, and both wait(). A transfer may be reused after wait()
// (release() forgets what was waited for).
//
// Channels and sockets: a session's connection to a peer is `channels` gdx p2p connections, each a TCP transport with
// `socketsPerChannel` sockets (the session's endpoint has one progress thread per channel). A post is cut into pieces
// of `chunkBytes` (the last may be shorter), dealt round-robin over the channels: the n-th piece posted to a peer goes
// on channel n % channels, on both sides, so a receiver that posts the same sizes in the same order gets each piece
// in place (a single postRecv of 64 MiB matches a single postSend of 64 MiB, and also 128 postSends of 512 KiB when
// the chunk is 512 KiB). Inside a channel the TCP transport deals its pieces over the channel's sockets. The
// connecting side's numbers decide for both, as the dialling side's GDX_TCP_SOCKETS and GDX_TCP_CHUNK do for every p2p
// connection: its channel count and piece size travel in a hello on each channel, and accept() adopts them.
//
// The environment, as the TCPX library names it (read through gdx's table of variables, base/config.cpp):
//   UCCL_TCPX_NUM_CHANNELS  channels per peer (default 2): gdx p2p connections per peer (and progress threads)
//   NCCL_NSOCKS_PERTHREAD   sockets per channel (default 2): GDX_TCP_SOCKETS of each of those connections
//   UCCL_TCPX_CHUNK_BYTES   piece size (default 512 KiB): GDX_TCP_CHUNK of each connection, and the size posts are
//                           cut into
// GDX_TCP_SOCKETS and GDX_TCP_CHUNK themselves do not apply to a session. NCCL_SOCKET_NTHREADS is not read: every
// socket of gdx's TCP transport has a sender or receiver thread of its own. The transport is always TCP (GDX_TRANSPORT
// is not read); GPU memory is staged through pinned host buffers (no TCPX NIC, no unpack kernel).
//
// Errors: every call throws gdx::Error. Bad input (an unknown peer name or mem_id, a range past the registered
// memory, postSend on memory registered for receiving, malformed connection info) is kInvalidArgument naming the peer,
// the operation and the values. Every wait ends within GDX_TIMEOUT_MS (accept, connect, and wait() from the last
// post): kTimeout naming what was still missing; a peer that dies or closes fails the waits on it with kPeerFailed.
// A failed wait() names the peer, the operation, mem_id, offset and size, and the piece (channel, its bytes). A piece
// received shorter than posted fails the receiving side's wait, naming both sizes (the send fit, so the sender's wait
// succeeds); a piece sent longer than the receive's fails both sides' pieces and leaves the peer usable; after a piece
// that timed out or failed on one side only, the two sides no longer deal pieces to the same channels: disconnect() and
// connect again.
//
// Threads: a session's calls may come from several threads; pieces to one peer are numbered in the order they are
// posted. A transfer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gdx::p2p {

/// Where registered memory lives: NCCL's values (NCCL_PTR_HOST, NCCL_PTR_CUDA), so that code passing those compiles
/// unchanged with these names.
constexpr int kPtrHost = 0x1;
constexpr int kPtrCuda = 0x2;

/// How a session is set up; fromEnv() reads the TCPX library's variables (see above).
struct TcpxSessionOptions {
  int gpu = -1;                     ///< the GPU this session serves (-1: none; host memory only)
  int channels = 2;                 ///< UCCL_TCPX_NUM_CHANNELS: connections per peer, 1..64
  int socketsPerChannel = 2;        ///< NCCL_NSOCKS_PERTHREAD: TCP sockets per connection, 1..64
  uint64_t chunkBytes = 512 << 10;  ///< UCCL_TCPX_CHUNK_BYTES: pieces posts are cut into
  std::string bindAddress;          ///< "" : every interface, advertised as GDX_TCP_BIND_ADDR or the default route's
  uint64_t timeoutNs = 0;           ///< 0: GDX_TIMEOUT_MS
  /// `channels` 0: UCCL_TCPX_NUM_CHANNELS (else the value given).
  static TcpxSessionOptions fromEnv(int gpu = -1, int channels = 0);
};

class TcpxTransfer;

class TcpxSession {
 public:
  /// The TCPX library's constructor: `numChannels` 0 reads UCCL_TCPX_NUM_CHANNELS.
  explicit TcpxSession(int gpu, int numChannels = 0);
  explicit TcpxSession(const TcpxSessionOptions& options);
  /// Closes every connection (transfers still waiting on them fail with kShutdown). Transfers may outlive it.
  ~TcpxSession();
  TcpxSession(const TcpxSession&) = delete;
  TcpxSession& operator=(const TcpxSession&) = delete;

  // ---- connections ----
  /// Starts taking connections (idempotent) and returns this session's connection info, for the client's
  /// loadRemoteConnInfo(): one line of text, "gdx-tcpx/1 ADDRESS PORT GPU".
  std::string listen();
  /// Waits (GDX_TIMEOUT_MS) for a client's channels and names that client `remoteName`. Connections that are not a
  /// session's channels (another program, a broken hello) are refused and logged, and the wait goes on.
  void accept(const std::string& remoteName);
  /// Remembers the server's connection info under `remoteName`; kInvalidArgument when it is not listen()'s text.
  void loadRemoteConnInfo(const std::string& remoteName, const std::string& connInfo);
  /// Connects every channel to the server loaded under `remoteName` (GDX_TIMEOUT_MS).
  void connect(const std::string& remoteName);
  /// Closes the connections to `remoteName`: transfers still waiting on them fail, the peer's fail too.
  void disconnect(const std::string& remoteName);

  // ---- memory ----
  /// Registers [ptr, ptr + size): `ptrType` kPtrHost (host memory) or kPtrCuda (cudaMalloc memory; kInvalidArgument
  /// in a build without CUDA or when ptr is not GPU memory). `isRecv`: the memory receives (postRecv) rather than
  /// sends (postSend). Returns the mem_id transfers name.
  uint64_t registerMemory(void* ptr, size_t size, int ptrType, bool isRecv);
  /// Forgets a registration; returns once no transfer reads it any more (bounded by GDX_TIMEOUT_MS).
  void deregisterMemory(uint64_t memId);

  // ---- transfers ----
  /// A transfer to or from a connected (or accepted) peer. The caller owns it: `delete` it (or hold it in a
  /// std::unique_ptr) when done; it may outlive the session (its posts then fail with kShutdown).
  TcpxTransfer* createTransfer(const std::string& remoteName);

  int numChannels() const;
  int gpuId() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

class TcpxTransfer {
 public:
  /// Waits for what is still in flight (bounded, failures logged), then goes.
  ~TcpxTransfer();
  TcpxTransfer(const TcpxTransfer&) = delete;
  TcpxTransfer& operator=(const TcpxTransfer&) = delete;

  /// Posts `size` bytes at `offset` of send memory `memId` to the peer; returns at once.
  void postSend(uint64_t memId, size_t offset, size_t size);
  /// Posts a receive of exactly `size` bytes into `offset` of receive memory `memId`; returns at once.
  void postRecv(uint64_t memId, size_t offset, size_t size);
  /// true once everything posted so far is done; throws gdx::Error (as wait() does) when a piece failed.
  bool isComplete();
  /// Waits until everything posted is done (each piece bounded by GDX_TIMEOUT_MS from its post); throws the first
  /// failure, naming the peer, the post and the piece, after every piece has finished or failed.
  void wait();
  /// Waits for anything still in flight (as wait()), then forgets the finished posts: the counts start again.
  void release();
  /// Pieces finished, and pieces posted, since the last release().
  size_t completedChunks() const;
  size_t totalChunks() const;

  struct Impl;

 private:
  friend class TcpxSession;
  explicit TcpxTransfer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::p2p
