// What both Buffers (normal and low-latency mode) do before they free their memory.
#pragma once

#include <memory>

#include "gdx/context.hpp"

namespace gdx::ep::detail {

/// Waits for this GPU's work, then meets every rank in a barrier: once all are there, no peer stores into this
/// rank's memory any more. Skipped, with a warning, when the Context is already gone (nobody would join it); a failed
/// barrier is logged. Never throws: it runs in destructors. `what` names the buffer in the messages.
void teardownBarrier(const ContextRef& link, int rank, const char* what);

}  // namespace gdx::ep::detail
