// In-order completion of ring positions. Operations posted for consecutive ring positions may complete out
// of order (different peers, different sockets); flush() needs "every position up to p is done", so the
// tracker keeps one entry per batch of positions and advances the done mark only over a finished prefix.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>

namespace gdx {

class CompletionTracker {
 public:
  /// Opens an entry for positions up to `endPos` (exclusive) that waits for `operations` completions;
  /// returns its sequence number (the cookie the operations carry). An entry of 0 operations is done at once.
  uint64_t open(uint64_t endPos, uint32_t operations) {
    pending_.push_back(Entry{endPos, operations});
    return baseSeq_ + pending_.size() - 1;
  }
  /// The sequence number the next open() returns: operations may carry it before their entry is opened, as long
  /// as their completions are not counted before it is (the proxy thread posts a batch, then opens its entry).
  uint64_t nextSeq() const { return baseSeq_ + pending_.size(); }
  /// The end position (exclusive) of entry `seq`, which must be open (an operation of it not yet completed).
  uint64_t endOf(uint64_t seq) const {
    const uint64_t i = seq - baseSeq_;
    return i < pending_.size() ? pending_[i].endPos : done_;
  }
  /// One operation of entry `seq` finished.
  void complete(uint64_t seq) {
    uint64_t i = seq - baseSeq_;
    if (i < pending_.size() && pending_[i].operations > 0) --pending_[i].operations;
  }
  /// Advances over finished entries; returns the first position not yet known to be done.
  uint64_t advance() {
    while (!pending_.empty() && pending_.front().operations == 0) {
      done_ = pending_.front().endPos;
      pending_.pop_front();
      ++baseSeq_;
    }
    return done_;
  }
  bool idle() const { return pending_.empty(); }

 private:
  struct Entry {
    uint64_t endPos;
    uint32_t operations;
  };
  std::deque<Entry> pending_;
  uint64_t baseSeq_ = 0;
  uint64_t done_ = 0;
};

}  // namespace gdx
