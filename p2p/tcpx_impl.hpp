// The state behind gdx::p2p::TcpxSession and TcpxTransfer, shared by tcpx_session.cpp (connections, the channel
// hello, memory) and tcpx_transfer.cpp (posts cut into pieces over the channels, waits).
//
// A session is one Endpoint (one progress thread per channel) that listens from its construction. A connecting
// session dials the listener once per channel and sends, as the first message of each connection, a ChannelHello
// (kHelloBytes, two-sided, eager): a random id of that connect() call, the channel's index, how many channels there are
// and the piece size. The listening session takes connections in the background (Endpoint::startPassiveAccept);
// accept() receives each one's hello and groups the connections by session id until one session's channels are all
// there, so that two clients connecting at once, or a stranger, cannot mix up the channels. The connecting side's
// channel count and piece size are adopted, as the dialling side's TCP shape is for every p2p connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdx/p2p/endpoint.hpp"
#include "gdx/p2p/tcpx_session.hpp"

namespace gdx::p2p {

/// What a connecting session says first on each channel.
struct ChannelHello {
  uint64_t session = 0;  ///< a random id of the connect() call: its channels carry the same one
  uint32_t channel = 0;
  uint32_t channels = 0;
  uint64_t chunkBytes = 0;  ///< the piece size both sides cut posts into
};
/// The size of a hello on the wire: magic "gdxtcpx1", then the fields little-endian, the rest zero.
constexpr size_t kHelloBytes = 64;
void encodeChannelHello(const ChannelHello& h, char* out);
/// "" and *out when the kHelloBytes at `in` are a hello, else why not.
std::string decodeChannelHello(const char* in, ChannelHello* out);

/// A connected (or accepted) peer: one endpoint connection per channel, and how many pieces went each way, which
/// decides the channel of the next piece (the n-th piece goes on channel n % channels, on both sides).
struct TcpxPeer {
  std::string name;
  std::string address;          ///< "127.0.0.1:41234", for errors
  std::vector<uint64_t> conns;  ///< endpoint connection ids, index = channel
  uint64_t chunkBytes = 0;

  std::mutex mutex;  ///< numbers pieces; guards what follows
  uint64_t sent = 0, received = 0;
  std::string closed;  ///< "" while usable, else why not (disconnected, the session went)
  /// The connecting side's hello sends, and their buffer: waited for (and reported) by the first wait() on the peer.
  std::vector<uint64_t> hellos;
  std::vector<char> helloBytes;
  uint64_t helloMr = 0;
};

/// A registerMemory() registration.
struct TcpxMemory {
  uint64_t mrId = 0;  ///< the endpoint's region
  char* base = nullptr;
  size_t size = 0;
  int ptrType = kPtrHost;
  bool isRecv = false;
};

/// The connections of one connecting session that accept() has seen so far.
struct PendingClient {
  std::vector<uint64_t> conns;  ///< 0 where the channel has not arrived
  size_t arrived = 0;
  uint64_t chunkBytes = 0;
  std::string address;
  uint64_t firstNs = 0;  ///< when its first channel arrived: a group still short after GDX_TIMEOUT_MS is let go
};

struct TcpxSession::Impl {
  explicit Impl(const TcpxSessionOptions& o);
  /// The endpoint goes first: its threads may still read the hello buffers below.
  ~Impl() { endpoint.reset(); }

  /// "TcpxSession 10.0.0.1:41234 (GPU 0)", the start of its errors.
  std::string who() const;
  /// The peer called `name`; kInvalidArgument naming `op` and the known peers when there is none.
  std::shared_ptr<TcpxPeer> peer(const std::string& name, const std::string& op);
  /// The registration `memId`; kInvalidArgument naming `op` when there is none.
  TcpxMemory memory(uint64_t memId, const std::string& op);
  /// Sends the hellos of a connecting peer (its connections are up).
  void sayHello(TcpxPeer& p, uint64_t connectId);
  /// accept(): takes the next connection and its hello into `pending`; false when none came by `deadlineNs`.
  bool takeConnection(uint64_t deadlineNs, const std::string& op);
  /// Names `p` (its channels are up): kInvalidArgument, after closing it, when the name was taken meanwhile.
  void addPeer(const std::shared_ptr<TcpxPeer>& p, const std::string& op, const char* way);
  /// Closes a peer's connections and marks it closed with `why`.
  void closePeer(TcpxPeer& p, const std::string& why);

  TcpxSessionOptions options;
  std::unique_ptr<Endpoint> endpoint;

  std::mutex mutex;  ///< guards the maps and `listening`
  bool listening = false;
  std::map<std::string, std::string> remoteInfo;  ///< loadRemoteConnInfo(): name -> connection info
  std::map<std::string, std::shared_ptr<TcpxPeer>> peers;
  std::map<uint64_t, TcpxMemory> memories;

  std::mutex acceptMutex;                     ///< one accept() at a time; guards what follows
  std::map<uint64_t, PendingClient> pending;  ///< by session id
  std::vector<char> helloIn;
  uint64_t helloInMr = 0;
};

}  // namespace gdx::p2p
