// The one place a transport is chosen by name (GDX_TRANSPORT): a Context builds its world's transport here, a p2p
// link its transport for two. Each backend's own options come from its fromEnv(); the values both callers decide
// (who they are, whom they trust, where they listen, how long they wait, how many sockets and lanes) come from
// TransportParams and override the environment's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.hpp"

namespace gdx {

/// What the caller decides for any backend; a backend ignores the fields it has no use for.
struct TransportParams {
  int rank = 0;
  int worldSize = 1;
  std::string secret;       ///< tcp: the secret a data connection must present
  std::string bindAddress;  ///< tcp: the interface address to listen on (overrides GDX_TCP_BIND_ADDR)
  uint64_t timeoutNs = kDefaultTimeoutNs;
  int socketsPerPeer = 0;      ///< tcp; 0: GDX_TCP_SOCKETS
  size_t chunkBytes = 0;       ///< tcp; 0: GDX_TCP_CHUNK
  size_t inlineSendBytes = 0;  ///< tcp: TcpTransportOptions::inlineSendBytes
  int lanes = 1;               ///< verbs: lanes prepared at construction
};

/// The kinds makeTransport builds in this build, for messages: "tcp, verbs, loopback" or "tcp, loopback".
std::string transportKinds();

/// Throws gdx::Error(kInvalidArgument) naming the kinds of this build when makeTransport would refuse `kind` for a
/// world of `worldSize` ranks (an unknown kind, verbs without libibverbs, loopback for more than one rank), so that
/// a caller can refuse before it does anything else.
void checkTransportKind(const std::string& kind, int worldSize);

/// The transport `kind` ("tcp", "verbs", "loopback") built from its environment and `params`, not yet connected;
/// throws as checkTransportKind does, or as the backend does when it cannot be built.
std::unique_ptr<Transport> makeTransport(const std::string& kind, const TransportParams& params);

}  // namespace gdx
