// The checks of op_checks.hpp and the errors of a refused op.
#include "transport/common/op_checks.hpp"

#include <sstream>

#include "gdx/error.hpp"

namespace gdx::common {

namespace {
constexpr char kNotConnected[] = "the transport is not connected";
}  // namespace

std::string checkRange(uint64_t offset, uint64_t bytes, uint64_t windowBytes) {
  // Written as two comparisons so that offset + bytes can never wrap around.
  if (bytes > windowBytes || offset > windowBytes - bytes) {
    std::ostringstream os;
    os << "range [offset " << offset << ", +" << bytes << " bytes) exceeds the window of " << windowBytes << " bytes";
    return os.str();
  }
  return "";
}

std::string checkPeer(int peer, int world) {
  if (peer < 0 || peer >= world) return "unknown peer (world size " + std::to_string(world) + ")";
  return "";
}

std::string checkWriteOp(const WriteOp& op, bool connected, int world) {
  if (!connected) return kNotConnected;
  std::string bad = checkPeer(op.peer, world);
  if (bad.empty() && op.bytes == 0) bad = "zero-byte write";
  return bad;
}

std::string checkAtomicOp(const AtomicOp& op, bool connected, int world) {
  if (!connected) return kNotConnected;
  std::string bad = checkPeer(op.peer, world);
  if (!bad.empty()) return bad;
  if (op.kind != SignalOp::kAdd && op.kind != SignalOp::kSet) return "unknown atomic kind";
  if (op.remoteOffset % kAtomicWordBytes != 0) return "the offset is not 8-byte aligned";
  return "";
}

std::string checkMessageOp(const MessageOp& op, bool connected, int world) {
  if (!connected) return kNotConnected;
  std::string bad = checkPeer(op.peer, world);
  if (bad.empty() && (op.bytes == 0 || op.bytes > kMaxMessageBytes))
    bad = "a message of " + std::to_string(op.bytes) + " bytes (it must have 1.." + std::to_string(kMaxMessageBytes) +
          ")";
  return bad;
}

std::string gpuAtomicRefusal(const char* transport) {
  return std::string("atomics on GPU windows are not supported by the ") + transport + " transport";
}

void refuseWrite(const std::string& lane, const WriteOp& op, const std::string& what) {
  std::ostringstream os;
  os << lane << ": write to peer " << op.peer << " (local window " << op.localWindow << " offset " << op.localOffset
     << ", remote window " << op.remoteWindow << " offset " << op.remoteOffset << ", " << op.bytes
     << " bytes): " << what;
  throw Error(ErrorCode::kInvalidArgument, os.str());
}

void refuseAtomic(const std::string& lane, const AtomicOp& op, const std::string& what) {
  std::ostringstream os;
  os << lane << ": atomic on peer " << op.peer << " (remote window " << op.remoteWindow << " offset " << op.remoteOffset
     << ", kind " << static_cast<int>(op.kind) << ", value " << op.value << "): " << what;
  throw Error(ErrorCode::kInvalidArgument, os.str());
}

void refuseMessage(const std::string& lane, const MessageOp& op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, lane + ": message to peer " + std::to_string(op.peer) + ": " + what);
}

}  // namespace gdx::common
