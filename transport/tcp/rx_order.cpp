#include "transport/tcp/rx_order.hpp"

#include <cstring>

namespace gdx::tcp {

std::string RxOrder::admit(const MessageHeader& h, uint64_t* atomicWord, const void* payload) {
  // Called for every chunk received: an admitted one returns at the end without building any text.
  std::lock_guard<std::mutex> lock(mutex_);
  if (h.seq < next_)
    return errorText("chunk of write #", h.seq, ", which is already complete (next expected #", next_, ")");
  if (h.seq - next_ >= maxAhead_)
    return errorText("write #", h.seq, " is numbered more than ", maxAhead_, " past the oldest unfinished #", next_);
  bool withImm = (h.flags & kFlagImm) != 0;
  bool atomic = h.type == static_cast<uint8_t>(MessageType::kAtomic);
  bool control = h.type == static_cast<uint8_t>(MessageType::kControl);
  auto [it, inserted] = pending_.try_emplace(h.seq);
  Message& m = it->second;
  if (inserted) {
    m.window = h.window;
    m.offset = h.offset;
    m.bytes = h.bytes;
    m.imm = h.imm;
    m.withImm = withImm;
    m.atomic = atomic;
    m.control = control;
    m.word = atomicWord;
    if (payload && h.chunkBytes <= sizeof m.payload) std::memcpy(m.payload, payload, h.chunkBytes);
  } else if (m.window != h.window || m.offset != h.offset || m.bytes != h.bytes || m.imm != h.imm ||
             m.withImm != withImm || m.atomic != atomic || m.control != control) {
    return errorText("chunk disagrees with earlier chunks of write #", h.seq, " (window ", m.window, ", offset ",
                     m.offset, ", bytes ", m.bytes, ")");
  }
  // checkHeader() guaranteed chunkBytes <= bytes, so this cannot overflow.
  if (h.chunkBytes > m.bytes - m.claimed)
    return errorText("chunks of write #", h.seq, " add up to more than its ", m.bytes, " bytes");
  m.claimed += h.chunkBytes;
  return {};
}

void RxOrder::placed(const MessageHeader& h, const std::function<void(const Message&)>& deliver) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(h.seq);
  if (it == pending_.end()) return;  // admit() was not called; nothing to account
  it->second.placed += h.chunkBytes;
  while (!pending_.empty()) {
    auto first = pending_.begin();
    if (first->first != next_ || first->second.placed != first->second.bytes) break;
    const Message& m = first->second;
    if ((m.withImm || m.atomic || m.control) && deliver) deliver(m);
    pending_.erase(first);
    ++next_;
  }
}

size_t RxOrder::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

}  // namespace gdx::tcp
