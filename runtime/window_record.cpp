#include "runtime/window_record.hpp"

#include <cstring>

#include "gdx/error.hpp"

namespace gdx {

std::string encodeWindowRecord(uint32_t id, uint64_t bytes, const std::string& key, const std::string& direct) {
  std::string out(kWindowRecordHeaderBytes, '\0');
  const uint32_t keyBytes = static_cast<uint32_t>(key.size());
  std::memcpy(&out[0], &id, 4);
  std::memcpy(&out[4], &bytes, 8);
  std::memcpy(&out[12], &keyBytes, 4);
  return out + key + direct;
}

std::string encodeFailedWindowRecord(const std::string& reason) {
  return encodeWindowRecord(kFailedWindowRecord, 0, reason);
}

WindowRecord decodeWindowRecord(const std::string& blob, int peer) {
  uint32_t keyBytes = 0;
  if (blob.size() >= kWindowRecordHeaderBytes) std::memcpy(&keyBytes, blob.data() + 12, 4);
  if (blob.size() < kWindowRecordHeaderBytes || blob.size() - kWindowRecordHeaderBytes < keyBytes)
    throw Error(ErrorCode::kProtocol, "window record from rank " + std::to_string(peer) + " is truncated");
  WindowRecord r;
  std::memcpy(&r.id, blob.data(), 4);
  std::memcpy(&r.bytes, blob.data() + 4, 8);
  r.key = blob.substr(kWindowRecordHeaderBytes, keyBytes);
  r.direct = blob.substr(kWindowRecordHeaderBytes + keyBytes);
  return r;
}

}  // namespace gdx
