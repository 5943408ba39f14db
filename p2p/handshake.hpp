// The two blobs of a link's handshake (pair_link.hpp), as values: the dialler's Hello and the acceptor's Answer.
// They are the first bytes a listening endpoint reads from whoever connects, so the decoders take nothing on trust:
// a wrong magic or version, a truncated or overlong blob, strings past their limits, a TCP shape out of range are
// refused with the reason, and what they accept encodes back to the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdx::p2p {

/// Longest handshake blob, and longest address or reason in one.
constexpr size_t kMaxHandshakeBytes = 16384;
/// Longest transport name and secret a Hello may carry.
constexpr size_t kMaxTransportNameBytes = 64;
constexpr size_t kMaxSecretBytes = 4096;
/// The TCP shape a dialler may ask for (GDX_TCP_SOCKETS, GDX_TCP_CHUNK).
constexpr uint16_t kMaxLinkSockets = 64;
constexpr uint64_t kMaxLinkChunkBytes = uint64_t{1} << 30;

/// What the dialler says first: its transport, GPU, a fresh secret for the data connections, its transport
/// address and, for TCP, how the data is split (both sides adopt the dialler's shape).
struct Hello {
  std::string transport;
  int32_t gpu = -1;
  std::string secret;
  std::string address;
  uint16_t sockets = 0;
  uint64_t chunkBytes = 0;
  std::string jobSecret;  ///< the secret both endpoints were given (EndpointOptions::secret); "" for none
};

/// The acceptor's answer: a refusal with its reason, or its GPU, its transport address and the connection's token.
struct Answer {
  bool ok = false;
  std::string reason;  ///< why the acceptor refused (ok false)
  int32_t gpu = -1;
  std::string address;
  uint64_t token = 0;
};

std::string encodeHello(const Hello& h);
/// "" and *out when `blob` is a well-formed Hello, else why not (the words the acceptor sends back in its refusal).
std::string decodeHello(const std::string& blob, Hello* out);
std::string encodeAnswer(const Answer& a);
/// "" and *out when `blob` is a well-formed Answer (a refusal is well formed too), else why not.
std::string decodeAnswer(const std::string& blob, Answer* out);

}  // namespace gdx::p2p
