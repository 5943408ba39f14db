// Status values that device-side and host-side waits return instead of hanging or trapping. The same
// numbers are stored in the proxy's error word, so a kernel can read why the proxy stopped.
#pragma once

#include <cstdint>

#include "gdx/device.hpp"

namespace gdx {

enum class Status : uint32_t {
  kOk = 0,
  kTimeout = 1,          ///< the bounded wait ran out; nothing else is known to be wrong
  kPeerFailed = 2,       ///< a peer's connection failed or the peer died
  kProxyError = 3,       ///< the proxy rejected a command (invalid window, offset, peer) or hit a transport error
  kInvalidArgument = 4,  ///< the caller passed something the producer could check itself
  kShutdown = 5,         ///< the proxy is stopping
};

GDX_HOST_DEVICE_INLINE const char* statusName(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kTimeout: return "timeout";
    case Status::kPeerFailed: return "peer failed";
    case Status::kProxyError: return "proxy error";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kShutdown: return "shutdown";
  }
  return "unknown";
}

}  // namespace gdx
