// Receive-side ordering of one (lane, sender -> this rank) direction. Chunks of different writes may arrive
// out of order over the lane's sockets; a write-with-immediate is announced, an atomic performed and a control
// message delivered only once every earlier message of the direction is completely in place (an atomic counts as
// in place once performed), which is the ordering an RDMA RC queue pair gives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "transport/tcp/wire.hpp"

namespace gdx::tcp {

class RxOrder {
 public:
  /// A write, atomic or control message of the direction, as its chunks describe it.
  struct Message {
    uint32_t window = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t imm = 0;  ///< an atomic's SignalOp
    bool withImm = false;
    bool atomic = false;
    bool control = false;
    uint64_t* word = nullptr;  ///< an atomic's target in the window
    /// Kept until the message's turn: an atomic's operand (kAtomicBytes) or a control message (`bytes`).
    uint8_t payload[kMaxMessageBytes] = {};
    uint64_t claimed = 0;  ///< payload bytes of admitted chunks
    uint64_t placed = 0;   ///< payload bytes already in the window
  };

  /// `maxAhead` bounds how far past the oldest unfinished write a chunk may be numbered, and so the memory a
  /// peer can make this tracker hold.
  explicit RxOrder(uint64_t maxAhead) : maxAhead_(maxAhead) {}

  /// Called before a chunk's payload is placed (for an atomic: with its target and operand, once they are known;
  /// for a control message: with its payload, once received). `payload` holds the chunk's chunkBytes bytes, which
  /// checkHeader() bounded by kMaxMessageBytes for both. Returns "" and reserves the chunk's bytes, or says why the
  /// chunk cannot belong to this direction (already finished, numbered too far ahead, disagreeing with earlier
  /// chunks of its write, more bytes than the write has).
  std::string admit(const MessageHeader& h, uint64_t* atomicWord = nullptr, const void* payload = nullptr);
  /// Called once an admitted chunk is in place; runs `deliver`, in sequence order and under the tracker's lock
  /// (so deliveries of one direction never overtake each other), for every write-with-immediate, atomic and
  /// control message that became deliverable: the caller announces, performs or delivers it.
  void placed(const MessageHeader& h, const std::function<void(const Message&)>& deliver);
  /// Writes begun and not yet complete (for tests and diagnostics).
  size_t pending() const;

 private:
  const uint64_t maxAhead_;
  mutable std::mutex mutex_;
  uint64_t next_ = 0;  ///< seq of the oldest write not yet complete
  std::map<uint64_t, Message> pending_;
};

}  // namespace gdx::tcp
