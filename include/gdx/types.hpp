// The small vocabulary types the public API shares: where a window's memory lives, and what a signal update
// (or a remote atomic, a forwarded signal, a copy-queue signal) does to its 64-bit word.
#pragma once

#include <cstdint>

namespace gdx {

/// Where a window's memory lives.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

/// What an update does to a 64-bit word: add the value, or set the word to it. The one encoding of add/set in gdx:
/// commands, transports, the write immediate, forward requests and the copy queue all carry this enum.
enum class SignalOp : uint8_t { kAdd = 0, kSet = 1 };

}  // namespace gdx
