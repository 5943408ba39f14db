// How a signal update rides in the 32-bit immediate of a write-with-immediate, so that the common
// putWithSignal (a small add or set) costs one transport operation. Updates that do not fit travel as a
// separate remote atomic on the signal window, ordered after the write.
//
//   imm bits 31..30  operation: 1 + SignalOp (1 add, 2 set; 0 never appears on the wire)
//   imm bits 29..16  signal id (< 16384)
//   imm bits 15..0   value (< 65536)
#pragma once

#include <cstdint>

#include "gdx/device.hpp"
#include "gdx/device/impl/command.hpp"

namespace gdx {

/// Window id every rank reserves for its signal array (64-bit counters, indexed by signal id).
constexpr uint32_t kSignalWindowId = kMaxWindows - 1;
/// Window ids available to users.
constexpr uint32_t kMaxUserWindows = kMaxWindows - 1;

constexpr int kImmOpShift = 30;
constexpr int kImmIdShift = 16;
constexpr uint32_t kImmIdLimit = 1u << 14;
constexpr uint64_t kImmValueLimit = 1u << 16;

/// Encodes the update into *imm when it fits; returns false when it must travel as an atomic instead.
GDX_HOST_DEVICE_INLINE bool encodeSignalImm(SignalOp op, uint32_t id, uint64_t value, uint32_t* imm) {
  if (id >= kImmIdLimit || value >= kImmValueLimit) return false;
  *imm = ((1u + static_cast<uint32_t>(op)) << kImmOpShift) | (id << kImmIdShift) | static_cast<uint32_t>(value);
  return true;
}

struct SignalUpdate {
  bool valid;
  SignalOp op;
  uint32_t id;
  uint64_t value;
};

GDX_HOST_DEVICE_INLINE SignalUpdate decodeSignalImm(uint32_t imm) {
  const uint32_t wire = imm >> kImmOpShift;
  return SignalUpdate{wire == 1 || wire == 2, wire == 2 ? SignalOp::kSet : SignalOp::kAdd,
                      (imm >> kImmIdShift) & (kImmIdLimit - 1), imm & (kImmValueLimit - 1)};
}

}  // namespace gdx
