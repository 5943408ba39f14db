// The checks every backend (tcp, verbs, loopback) makes of a posted op before it looks at a window, the range check
// of a window access, and the kInvalidArgument errors that a refused op becomes. They are shared so that the same
// mistake is reported with the same words whichever transport the job runs on (tests match them).
//
// Convention: a check returns "" when the op is fine and otherwise what is wrong with it; the caller puts that in a
// refuse*() error, which names the lane (`lane`: "TCP transport rank 0 lane 1") and every field of the op.
#pragma once

#include <cstdint>
#include <string>

#include "transport/transport.hpp"

namespace gdx::common {

/// Size and alignment of the word a remote atomic updates.
constexpr uint64_t kAtomicWordBytes = 8;

/// "" when [offset, offset + bytes) lies within a window of `windowBytes` (without overflowing), else why not.
std::string checkRange(uint64_t offset, uint64_t bytes, uint64_t windowBytes);

/// "" when `peer` is a rank of a world of `world` ranks, else why not.
std::string checkPeer(int peer, int world);

/// The checks of a write that need no window: the transport is connected, the peer exists, the write is not empty.
std::string checkWriteOp(const WriteOp& op, bool connected, int world);

/// The checks of an atomic that need no window: connected, the peer exists, a known kind, an 8-byte aligned offset.
std::string checkAtomicOp(const AtomicOp& op, bool connected, int world);

/// The checks of a control message: connected, the peer exists, 1..kMaxMessageBytes bytes.
std::string checkMessageOp(const MessageOp& op, bool connected, int world);

/// Why an atomic on a GPU window is refused by `transport` ("TCP", "verbs", "loopback"): the CPU (or a NIC
/// behind it) cannot update GPU memory atomically together with the GPU.
std::string gpuAtomicRefusal(const char* transport);

/// Throws Error(kInvalidArgument): "<lane>: write to peer P (local window ..., N bytes): <what>".
[[noreturn]] void refuseWrite(const std::string& lane, const WriteOp& op, const std::string& what);
/// Throws Error(kInvalidArgument): "<lane>: atomic on peer P (remote window ..., kind K, value V): <what>".
[[noreturn]] void refuseAtomic(const std::string& lane, const AtomicOp& op, const std::string& what);
/// Throws Error(kInvalidArgument): "<lane>: message to peer P: <what>".
[[noreturn]] void refuseMessage(const std::string& lane, const MessageOp& op, const std::string& what);

}  // namespace gdx::common
