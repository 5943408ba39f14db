#include "runtime/window_record.hpp"

#include "base/byte_codec.hpp"
#include "gdx/error.hpp"

namespace gdx {

std::string encodeWindowRecord(uint32_t id, uint64_t bytes, const std::string& key, const std::string& direct) {
  ByteWriter w;
  w.put(id).put(bytes).putString(key).putBytes(direct);
  return w.take();
}

std::string encodeFailedWindowRecord(const std::string& reason) {
  return encodeWindowRecord(kFailedWindowRecord, 0, reason);
}

WindowRecord decodeWindowRecord(const std::string& blob, int peer) {
  WindowRecord r;
  ByteReader in(blob);
  if (!(in.get(&r.id) && in.get(&r.bytes) && in.getString(&r.key, blob.size()) && in.getRest(&r.direct)))
    throw Error(ErrorCode::kProtocol, "window record from rank " + std::to_string(peer) + " is truncated");
  return r;
}

}  // namespace gdx
