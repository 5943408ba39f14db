// Merging of consecutive puts. Puts to one peer whose source and destination ranges continue each other (a kernel
// streaming a buffer in many small puts, tokens written to consecutive slots) become one transport write, so the
// transport pays one operation, one header and one completion for them. A lane keeps its writes to a peer in
// order, so a merged write lands the same bytes in the same places as the puts it replaces would.
#pragma once

#include <cstdint>

#include "transport/transport.hpp"

namespace gdx {

class WriteMerger {
 public:
  /// Merged writes stay below this, so one large write does not delay the lane's next operations for long.
  static constexpr uint64_t kMaxMergedBytes = uint64_t{1} << 20;

  bool pending() const { return count_ > 0; }
  /// Puts merged into the pending write.
  uint32_t count() const { return count_; }
  /// True when `next` continues the pending write: same peer and windows, both ranges adjacent, within the cap.
  bool extends(const WriteOp& next) const {
    return count_ > 0 && next.peer == write_.peer && next.localWindow == write_.localWindow &&
           next.remoteWindow == write_.remoteWindow && next.localOffset == write_.localOffset + write_.bytes &&
           next.remoteOffset == write_.remoteOffset + write_.bytes && write_.bytes + next.bytes <= kMaxMergedBytes;
  }
  /// The ring position of the last slot of the last put merged so far: where a failure of the write is recorded.
  uint64_t lastPosition() const { return lastPosition_; }
  /// Adds `next`, the put whose last slot is at `lastPosition`: to the pending write when it extends it; otherwise
  /// the caller took the pending write out first.
  void add(const WriteOp& next, uint64_t lastPosition) {
    if (extends(next)) {
      write_.bytes += next.bytes;
    } else {
      write_ = next;
      count_ = 0;
    }
    ++count_;
    lastPosition_ = lastPosition;
  }
  /// Takes the pending write out.
  WriteOp take() {
    count_ = 0;
    return write_;
  }

 private:
  WriteOp write_;
  uint32_t count_ = 0;
  uint64_t lastPosition_ = 0;
};

}  // namespace gdx
