// Window keys cross a connection in pieces (kKeyPart messages; a verbs key is longer than one control message). The
// sender cuts a key with splitKey(); the receiver puts the pieces of each window back together with a KeyAssembly,
// which accepts them only in the order they were cut: a piece that does not continue its window's key, changes the
// key's length or the window's size, or starts a key while too many are unfinished is refused with the reason,
// so a damaged key is never handed to the transport with a gap in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "p2p/protocol.hpp"

namespace gdx::p2p {

/// The kKeyPart messages of `key` (at most kMaxKeyBytes) for `window` of `bytes`: one piece for an empty key.
std::vector<ControlMsg> splitKey(uint32_t window, const std::string& key, uint64_t bytes);

class KeyAssembly {
 public:
  /// Keys begun and not yet complete, at most (the sender finishes one before it starts the next).
  static constexpr size_t kMaxUnfinished = 64;

  struct Key {
    uint32_t window = 0;
    uint64_t bytes = 0;  ///< the window's size
    std::string key;
  };

  /// Adds one kKeyPart: "" when it fits, with *complete true and *done the whole key when this piece was the last
  /// one; else why it does not fit (nothing is kept of that window's unfinished key then).
  std::string add(const ControlMsg& part, bool* complete, Key* done);
  size_t unfinished() const { return partial_.size(); }

 private:
  /// "" when `part` may be added, else why not.
  std::string check(const ControlMsg& part) const;
  struct Partial {
    std::string key;
    size_t filled = 0;
    uint64_t bytes = 0;
  };
  std::map<uint32_t, Partial> partial_;
};

}  // namespace gdx::p2p
