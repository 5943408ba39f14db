// Registration steps and text window keys of window_table.hpp.
#include "transport/common/window_table.hpp"

#include "transport/common/cuda_staging.hpp"

namespace gdx::common {

void checkWindowArguments(const std::string& w, const void* base, size_t bytes, MemoryKind kind) {
  if (kind != MemoryKind::kHost && kind != MemoryKind::kCuda)
    throw Error(ErrorCode::kInvalidArgument, w + ": unknown memory kind");
  if (base == nullptr && bytes > 0) throw Error(ErrorCode::kInvalidArgument, w + ": null base");
}

LocalWindow cpuWindow(const std::string& w, void* base, size_t bytes, MemoryKind kind) {
  checkWindowArguments(w, base, bytes, kind);
  LocalWindow win{static_cast<char*>(base), bytes, kind, -1};
  // Throws when the memory is not on a GPU, or when gdx was built without CUDA.
  if (kind == MemoryKind::kCuda) win.device = cudaWindowDevice(base, bytes, w);
  return win;
}

std::string windowKey(const char* scheme, uint32_t id, uint64_t bytes, bool cuda, const void* base) {
  const unsigned skew = static_cast<unsigned>(reinterpret_cast<uintptr_t>(base) % 8);
  return std::string(scheme) + ":" + std::to_string(id) + ":" + std::to_string(bytes) + (cuda ? ":cuda" : "") +
         (skew ? ":skew" + std::to_string(skew) : "");
}

RemoteWindow parseWindowKey(const std::string& who, const char* scheme, int peer, uint32_t id, uint64_t bytes,
                            const std::string& key) {
  // The receiver checks every access itself anyway; the key only tells the sender what to refuse early.
  for (uint8_t skew = 0; skew < 8; ++skew)
    for (bool cuda : {false, true})
      if (key == windowKey(scheme, id, bytes, cuda, reinterpret_cast<const void*>(uintptr_t(skew))))
        return RemoteWindow{bytes, cuda, skew};
  if (!key.empty())
    throw Error(ErrorCode::kInvalidArgument, who + ": key '" + key + "' of peer " + std::to_string(peer) +
                                                 " does not describe window " + std::to_string(id) + " of " +
                                                 std::to_string(bytes) + " bytes");
  return RemoteWindow{bytes, false, 0};
}

}  // namespace gdx::common
