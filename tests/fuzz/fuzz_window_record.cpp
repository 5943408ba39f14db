// Fuzzes the window records the ranks exchange through the bootstrap (runtime/window_record.hpp) and the text keys of
// the TCP and loopback transports inside them (transport/common/window_table.hpp): a record decodes to fields that
// encode back to the same bytes, or is refused with kProtocol; a key describes the window the record names, or is
// refused with kInvalidArgument.
#include "fuzz_check.hpp"
#include "gdx/error.hpp"
#include "runtime/window_record.hpp"
#include "transport/common/window_table.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string blob(reinterpret_cast<const char*>(data), size);
  gdx::WindowRecord r;
  try {
    r = gdx::decodeWindowRecord(blob, 1);
  } catch (const gdx::Error& e) {
    GDX_FUZZ_CHECK(e.code() == gdx::ErrorCode::kProtocol);
    return 0;
  }
  GDX_FUZZ_CHECK(gdx::encodeWindowRecord(r.id, r.bytes, r.key, r.direct) == blob);
  for (const char* scheme : {"tcp", "loopback"}) {
    try {
      gdx::common::RemoteWindow w = gdx::common::parseWindowKey("fuzz", scheme, 1, r.id, r.bytes, r.key);
      GDX_FUZZ_CHECK(w.bytes == r.bytes);
      GDX_FUZZ_CHECK(w.skew < 8);
      GDX_FUZZ_CHECK(r.key.empty() ||
                     r.key == gdx::common::windowKey(scheme, r.id, r.bytes, w.cuda,
                                                     reinterpret_cast<const void*>(static_cast<uintptr_t>(w.skew))));
    } catch (const gdx::Error& e) {
      GDX_FUZZ_CHECK(e.code() == gdx::ErrorCode::kInvalidArgument);
    }
  }
  return 0;
}
