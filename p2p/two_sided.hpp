// What Connection's source files for sends and receives share (connection_sends.cpp, connection_receives.cpp,
// send_withdrawal.cpp, and connection.cpp, which hands them what arrives): how a send's number travels in a write's
// immediate, and how a send's failure reads in both sides' errors. Both sides of a connection must agree on the bits.
#pragma once

#include <cstdint>
#include <string>

#include "gdx/error.hpp"
#include "p2p/protocol.hpp"

namespace gdx::p2p {

/// The bits of a send's number the immediate of a write into the receive's own buffer carries; receives are kept by
/// the same bits of their number.
constexpr uint32_t kSeqMask = 0x3fffffffu;
/// An eager write's immediate: kEagerImm, the credits this side returns (bits 16..29), the send's number's low bits.
constexpr uint32_t kEagerSeqBits = 0xffffu;
constexpr int kEagerCreditShift = 16;
constexpr uint32_t kEagerCreditMask = 0x3fffu;
static_assert(kEagerSlots <= kEagerCreditMask, "an eager immediate carries up to a buffer's worth of credits");

/// Why a send failed whose receive's buffer has `bufferBytes`, fewer than its own, after "send #n of b bytes".
inline std::string bufferTooSmall(uint64_t bufferBytes) {
  return ": the receive the peer posted for it has a buffer of " + std::to_string(bufferBytes) +
         " bytes, smaller than this send";
}

/// Why a send failed whose receive failed with `code` (kReceiveFailed), after "send #n of b bytes".
inline std::string receiveFailed(ErrorCode code) {
  return std::string(": the receive the peer posted for it ended in error (") + errorCodeName(code) +
         ") and takes no data";
}

}  // namespace gdx::p2p
