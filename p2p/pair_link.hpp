// A gdx::Transport between exactly two processes, set up over one control socket: the side that dialled is rank 0,
// the side that accepted rank 1. The dialler's Hello names the transport, its GPU, its transport address and a fresh
// random secret (so no third process can join the data connections) and, for TCP, its socket count and chunk size
// (GDX_TCP_SOCKETS, GDX_TCP_CHUNK), which the acceptor adopts so that both sides of a connection agree even when
// their environments differ; the acceptor answers with its own GPU and address and a random token that names the
// connection in descriptors, or refuses with the reason (another transport, a wrong magic or version). Both then
// build the transport for a world of two; Connection connects it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sockets/socket.hpp"
#include "transport/transport.hpp"

namespace gdx::p2p {

/// The transports a link may use; "tcp" or "verbs" (GDX_TRANSPORT; loopback serves a world of one only).
std::string linkTransportFromEnv();

/// A transport for a world of two, not yet connected.
struct PairLink {
  std::unique_ptr<Transport> transport;
  int self = 0;                        ///< this side's rank (0: dialled, 1: accepted)
  std::vector<std::string> addresses;  ///< transport addresses, index = rank
  std::string peerIp;                  ///< the other side's address as seen on the control socket
  int peerGpu = -1;
  uint64_t token = 0;  ///< names the connection in descriptors; the same on both sides
  std::string detail;  ///< what carries the connection: "tcp, 4 sockets, 1048576-byte chunks" or "verbs, RC"
  int peer() const { return 1 - self; }
};

/// How the TCP transport of a link splits its data; the dialler's decides for both sides. 0: GDX_TCP_SOCKETS,
/// GDX_TCP_CHUNK.
struct TcpShape {
  uint16_t sockets = 0;
  uint64_t chunkBytes = 0;
};

/// Dials side of the handshake on a connected control socket. Throws gdx::Error naming `who` and the cause when
/// the peer refuses, closes, answers garbage, or does not answer before `deadline`; kShutdown once `abort` (checked
/// every 100 ms while waiting) returns true.
/// `jobSecret`: the secret both sides were given ("" for none), presented in the Hello. `shape`: the TCP transport's
/// sockets and chunk size (each 0: from the environment).
PairLink dialLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                  net::Deadline deadline, const std::string& who, const std::string& jobSecret = "",
                  const net::AbortCheck& abort = {}, TcpShape shape = {});
/// Accepting side of the handshake on a freshly accepted control socket; refuses (telling the dialler why) a Hello
/// that does not present `jobSecret` when it is not "". The Hello must arrive within helloWaitNs() of the call (a
/// dialler sends it at once), the rest by `deadline`; `heard` is called once a well-formed Hello arrived; kShutdown
/// once `abort` returns true.
PairLink answerLink(net::UniqueFd fd, int localGpu, const std::string& transport, uint64_t timeoutNs,
                    net::Deadline deadline, const std::string& who, const std::string& jobSecret = "",
                    const net::AbortCheck& abort = {}, const std::function<void()>& heard = {});
/// How long a connecting client has to send its Hello: GDX_P2P_HELLO_MS (5 s), at most `timeoutNs`. Short, so that
/// a socket that connects and says nothing holds its handshake place briefly.
uint64_t helloWaitNs(uint64_t timeoutNs);

/// Sends one length-prefixed blob; throws gdx::Error(kPeerFailed / kTimeout / kShutdown once `abort` returned true)
/// naming `who` when it cannot.
void sendBlob(int fd, const std::string& blob, net::Deadline deadline, const std::string& who,
              const net::AbortCheck& abort = {});
/// Receives one length-prefixed blob of at most `max` bytes; throws as sendBlob() does, kProtocol when too long.
std::string recvBlob(int fd, size_t max, net::Deadline deadline, const std::string& who,
                     const net::AbortCheck& abort = {});

/// Whether two secrets are equal, compared in time that does not depend on where they differ.
bool sameSecret(const std::string& a, const std::string& b);
/// 64 random bits (std::random_device).
uint64_t randomU64();

}  // namespace gdx::p2p
