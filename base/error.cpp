#include "gdx/error.hpp"

#include <cstring>
#include <sstream>

namespace gdx {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerFailed: return "peer failed";
    case ErrorCode::kProtocol: return "protocol error";
    case ErrorCode::kSystem: return "system error";
    case ErrorCode::kCuda: return "CUDA error";
    case ErrorCode::kVerbs: return "verbs error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kShutdown: return "shutdown";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string("gdx ") + errorCodeName(code) + ": " + message),
      code_(code),
      prefixBytes_(std::strlen("gdx ") + std::strlen(errorCodeName(code)) + std::strlen(": ")) {}

namespace {
std::string where(const std::string& call, const std::string& what, const char* file, int line) {
  std::ostringstream os;
  os << call << " failed: " << what << " (" << file << ":" << line << ")";
  return os.str();
}
}  // namespace

SystemError::SystemError(const std::string& call, int err, const char* file, int line)
    : Error(ErrorCode::kSystem, where(call, std::strerror(err), file, line)), err_(err) {}

CudaError::CudaError(const std::string& call, int status, const std::string& statusName, const char* file, int line)
    : Error(ErrorCode::kCuda, where(call, statusName + " (" + std::to_string(status) + ")", file, line)),
      status_(status) {}

VerbsError::VerbsError(const std::string& call, int err, const char* file, int line)
    : Error(ErrorCode::kVerbs,
            where(call, std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")", file, line)),
      err_(err) {}

ErrorCode errorCodeFor(Status status) {
  switch (status) {
    case Status::kOk: return ErrorCode::kOk;
    case Status::kTimeout: return ErrorCode::kTimeout;
    case Status::kPeerFailed: return ErrorCode::kPeerFailed;
    case Status::kInvalidArgument:
    case Status::kProxyError: return ErrorCode::kInvalidArgument;
    case Status::kShutdown: return ErrorCode::kShutdown;
  }
  return ErrorCode::kInternal;
}

}  // namespace gdx
