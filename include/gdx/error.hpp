// Host-side error types. Every failure that gdx reports on the host is a gdx::Error carrying an ErrorCode;
// the subclasses record where the failing library call came from (CUDA, verbs, the C library).
// Destructors never throw: they log through gdx/log.hpp instead.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gdx/status.hpp"

namespace gdx {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,  ///< bad window id, offset past the end, unknown peer, zero size, ...
  kTimeout,          ///< a bounded wait ran out
  kPeerFailed,       ///< a peer died, closed its connection or sent something malformed
  kProtocol,         ///< a malformed or unauthenticated message
  kSystem,           ///< a C library call failed (errno)
  kCuda,             ///< a CUDA runtime/driver call failed
  kVerbs,            ///< an ibverbs call failed
  kInternal,         ///< an invariant of gdx itself was violated
  kShutdown,         ///< the object was stopped while the operation was pending
};

const char* errorCodeName(ErrorCode code);

/// The ErrorCode a host call throws for a Status a wait or an enqueue returned: the one mapping gdx uses. A proxy
/// error is a command the proxy refused (or could not post), so the caller gets kInvalidArgument.
ErrorCode errorCodeFor(Status status);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }
  /// what() without its "gdx <code>: " prefix: for an error that carries another as its cause.
  const char* message() const noexcept { return what() + prefixBytes_; }

 private:
  ErrorCode code_;
  size_t prefixBytes_;
};

/// A C library / kernel call failed; carries errno.
class SystemError : public Error {
 public:
  SystemError(const std::string& call, int err, const char* file, int line);
  int err() const noexcept { return err_; }

 private:
  int err_;
};

class CudaError : public Error {
 public:
  CudaError(const std::string& call, int cudaStatus, const std::string& statusName, const char* file, int line);
  int status() const noexcept { return status_; }

 private:
  int status_;
};

class VerbsError : public Error {
 public:
  VerbsError(const std::string& call, int err, const char* file, int line);
  int err() const noexcept { return err_; }

 private:
  int err_;
};

/// Throws SystemError(call, errno) when `ok` is false.
#define GDX_SYS_CHECK(expr)                                                  \
  do {                                                                       \
    if (!(expr)) throw ::gdx::SystemError(#expr, errno, __FILE__, __LINE__); \
  } while (0)

/// For verbs calls that return the errno value itself (ibv_modify_qp, ibv_post_send, ...): 0 is success.
#define GDX_IBV_CHECK(expr)                                                                \
  do {                                                                                     \
    int gdx_ibv_rc_ = (expr);                                                              \
    if (gdx_ibv_rc_ != 0) throw ::gdx::VerbsError(#expr, gdx_ibv_rc_, __FILE__, __LINE__); \
  } while (0)

}  // namespace gdx
