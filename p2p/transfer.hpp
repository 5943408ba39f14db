// The state of one asynchronous operation of an endpoint (a send, a receive, a vector of them, a write, a read):
// how many parts are still outstanding, and the first failure. Whichever thread runs the connection finishes parts;
// the caller polls or waits, bounded by the deadline the operation was given.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdx/error.hpp"

namespace gdx::p2p {

/// An endpoint transfer's name in errors, kept in parts and put into words only when an error needs it: a small
/// message's blocking call would otherwise build and copy this text for every message it moves.
struct TransferName {
  const char* op = "transfer";  ///< "send", "receive", "write", "read" (a string literal)
  size_t pieces = 1;
  uint64_t bytes = 0;
  std::shared_ptr<const std::string> where;  ///< the connection's name (Connection::sharedName())
  /// "send of 4096 bytes on connection 2 (peer 127.0.0.1, GPU 0, ...)", "send of 16 buffers, 4096 bytes on ...".
  std::string text() const;
};

class Transfer {
 public:
  /// `what` names the operation in errors ("send of 4096 bytes on connection 2 (peer 127.0.0.1, GPU 0)").
  Transfer(std::string what, int parts, uint64_t deadlineNs)
      : what_(std::move(what)), total_(parts), parts_(parts), deadline_(deadlineNs) {}
  Transfer(TransferName name, int parts, uint64_t deadlineNs)
      : name_(std::move(name)), total_(parts), parts_(parts), deadline_(deadlineNs) {}

  /// What it is, for errors.
  std::string what() const { return name_.where ? name_.text() : what_; }
  uint64_t deadlineNs() const { return deadline_; }
  /// One part finished; the transfer is done after the last.
  void finishPart();
  /// Part `index` (a receive's buffer) finished, holding a message of `bytes` (at most the buffer's size).
  void finishPart(size_t index, uint64_t bytes);
  /// What finishPart(index, bytes) recorded, one entry per part (0 for a part finished without a size); empty when
  /// no part recorded one (sends, writes, reads).
  std::vector<uint64_t> sizes() const;
  /// Fails the transfer (the first failure wins); later parts are ignored.
  void fail(ErrorCode code, const std::string& why);
  bool finished() const;
  /// How it failed; kOk while it has not.
  ErrorCode failureCode() const;
  /// What the transfer waits for now, for the error if it never comes ("a matching receive posted by the peer").
  void setWaiting(const std::string& what);
  /// The same for a string literal, kept as the pointer: a small message's hot path copies no text. Only an array
  /// binds here, so a `const char*` of a temporary string (`s.c_str()`) takes the copying overload above.
  template <size_t N>
  void setWaiting(const char (&literal)[N]) {
    setWaitingLiteral(literal);
  }
  std::string waiting() const;
  /// true when done, false while pending; throws gdx::Error (the failure's code) when it failed.
  bool poll() const;
  /// Waits until it is done or failed, at most until `deadlineNs` (gdx::nowNs clock); throws as poll() does, and
  /// kTimeout naming the operation and the parts still outstanding when the deadline passes. With a driver, the
  /// waiting thread first runs the driver (it does the connection's work itself until the transfer is done).
  void wait(uint64_t deadlineNs) const;
  using Driver = std::function<void(const Transfer&, uint64_t deadlineNs)>;
  /// Set before the transfer is shared with other threads.
  void setDriver(Driver d) { driver_ = std::move(d); }
  /// Called once, by the thread that finished the last part or failed the transfer first, after the transfer's lock
  /// is released (poll() says how it ended). Set before the transfer is shared with other threads.
  using FinishHandler = std::function<void(const Transfer&)>;
  void setOnFinish(FinishHandler f) { onFinish_ = std::move(f); }

 private:
  void throwIfFailed() const;
  std::string waitingLocked() const;  ///< waiting(), with mutex_ held
  void setWaitingLiteral(const char* literal);
  const std::string what_;
  const TransferName name_;  ///< what_ in parts, when the transfer was given those instead
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  const int total_;  ///< parts at the start
  int parts_;        ///< parts still outstanding
  /// Sizes recorded by finishPart(index, bytes): part 0's here (a single receive allocates nothing), the others in
  /// moreSizes_ (index - 1), made on first use.
  uint64_t size0_ = 0;
  bool sized_ = false;
  std::vector<uint64_t> moreSizes_;
  bool failed_ = false;
  ErrorCode code_ = ErrorCode::kOk;
  std::string why_;
  std::string waiting_;
  const char* waitingLiteral_ = nullptr;  ///< what it waits for when set from a literal (then waiting_ is empty)
  const uint64_t deadline_;
  Driver driver_;
  FinishHandler onFinish_;  ///< taken (under mutex_) by the thread that ends the transfer
};

}  // namespace gdx::p2p
