#include "p2p/key_assembly.hpp"

namespace gdx::p2p {

std::vector<ControlMsg> splitKey(uint32_t window, const std::string& key, uint64_t bytes) {
  std::vector<ControlMsg> parts;
  for (size_t at = 0; at == 0 || at < key.size(); at += kKeyPieceBytes) {
    ControlMsg part;
    part.type = MsgType::kKeyPart;
    part.window = window;
    part.bytes = bytes;
    part.keyTotal = static_cast<uint16_t>(key.size());
    part.keyAt = static_cast<uint16_t>(at);
    part.keyPiece = key.substr(at, kKeyPieceBytes);
    parts.push_back(std::move(part));
    if (key.empty()) break;
  }
  return parts;
}

std::string KeyAssembly::add(const ControlMsg& m, bool* complete, Key* done) {
  *complete = false;
  std::string bad = check(m);
  if (!bad.empty()) {
    partial_.erase(m.window);
    return "a key part of window " + std::to_string(m.window) + " (" + std::to_string(m.keyPiece.size()) +
           " bytes at " + std::to_string(m.keyAt) + " of " + std::to_string(m.keyTotal) + "): " + bad;
  }
  if (m.keyAt == 0)  // a new key (also replacing an unfinished one: the sender only restarts after a failure)
    partial_[m.window] = Partial{std::string(m.keyTotal, '\0'), 0, m.bytes};
  Partial& p = partial_[m.window];
  p.key.replace(m.keyAt, m.keyPiece.size(), m.keyPiece);
  p.filled += m.keyPiece.size();
  if (p.filled < p.key.size()) return "";
  done->window = m.window;
  done->bytes = p.bytes;
  done->key = std::move(p.key);
  partial_.erase(m.window);
  *complete = true;
  return "";
}

std::string KeyAssembly::check(const ControlMsg& m) const {
  if (m.keyTotal > kMaxKeyBytes || size_t{m.keyAt} + m.keyPiece.size() > m.keyTotal)
    return "outside a key of at most " + std::to_string(kMaxKeyBytes) + " bytes";
  if (m.keyPiece.empty() && m.keyTotal != 0) return "an empty piece of a non-empty key";
  auto it = partial_.find(m.window);
  if (m.keyAt == 0) {
    if (it == partial_.end() && partial_.size() >= kMaxUnfinished)
      return std::to_string(partial_.size()) + " keys are unfinished already";
    return "";
  }
  if (it == partial_.end()) return "no key of that window was begun";
  const Partial& p = it->second;
  if (m.keyAt != p.filled || m.keyTotal != p.key.size() || m.bytes != p.bytes)
    return "it does not continue the key begun (" + std::to_string(p.filled) + " of " + std::to_string(p.key.size()) +
           " bytes, window of " + std::to_string(p.bytes) + " bytes)";
  return "";
}

}  // namespace gdx::p2p
