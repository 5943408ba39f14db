#include <sstream>

#include "gdx/device/impl/signal_imm.hpp"
#include "proxy/proxy_thread.hpp"

namespace gdx {

std::string describe(const Command& c) {
  std::ostringstream os;
  os << opcodeName(c.opcode()) << " to peer " << c.peer();
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
    case Opcode::kRelayPut:
      os << " (src window " << c.srcWindow() << " offset " << c.srcOffset() << ", dst window " << c.dstWindow()
         << " offset " << c.dstOffset() << ", " << c.size() << " bytes)";
      break;
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd: os << " (signal " << c.signalId() << ", value " << c.value() << ")"; break;
    case Opcode::kAtomicAdd:
      os << " (window " << c.dstWindow() << " offset " << c.dstOffset() << ", addend " << c.value() << ")";
      break;
    default: os << " (words 0x" << std::hex << c.word[0] << " 0x" << c.word[1] << ")";
  }
  return os.str();
}

// The common commands' checks without building a message: puts and putWithSignals that are not relayed, signals.
// False sends the command through checkCommand, which says what is wrong (or finds it valid after all).
bool Proxy::plainlyValid(const Command& c, const Command* second) const {
  const int peer = static_cast<int>(c.peer());
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
      if (c.size() == 0 || !registry_.fitsLocal(c.srcWindow(), c.srcOffset(), c.size()) ||
          !registry_.fitsRemote(peer, c.dstWindow(), c.dstOffset(), c.size()))
        return false;
      if (!second) return c.opcode() == Opcode::kPut;
      return isSignal(*second) && second->peer() == c.peer() && second->forwardTo() < 0 &&
             registry_.fitsRemote(peer, kSignalWindowId, uint64_t{second->signalId()} * 8, 8);
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      return c.forwardTo() < 0 && registry_.fitsRemote(peer, kSignalWindowId, uint64_t{c.signalId()} * 8, 8);
    default: return false;
  }
}

// Checks one command (and its second slot) against the registry; empty when valid.
std::string Proxy::checkCommand(const Command& c, const Command* second) const {
  const int peer = static_cast<int>(c.peer());
  auto relayed = [&](const Command& slot) -> std::string {
    return relay_ ? relay_->check(c, slot) : "a relayed command, but this proxy serves no relay";
  };
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
    case Opcode::kRelayPut: {
      if (c.size() == 0) return "zero-byte put";
      std::string why = registry_.checkLocal(c.srcWindow(), c.srcOffset(), c.size());
      if (why.empty()) why = registry_.checkRemote(peer, c.dstWindow(), c.dstOffset(), c.size());
      if (!why.empty() || !second) return why;
      if (second->peer() != c.peer())
        return describe(c) + " followed by a slot for peer " + std::to_string(second->peer());
      if (c.opcode() == Opcode::kRelayPut) {
        if (second->opcode() != Opcode::kRelayTo || second->forwardTo() < 0)
          return "relayPut not followed by its relayTo slot";
        return relayed(*second);
      }
      if (!isSignal(*second)) return "putWithSignal not followed by its signal slot";
      if (second->forwardTo() >= 0) return relayed(*second);
      return registry_.checkRemote(peer, kSignalWindowId, uint64_t{second->signalId()} * 8, 8);
    }
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      if (c.forwardTo() >= 0) return relayed(c);
      return registry_.checkRemote(peer, kSignalWindowId, uint64_t{c.signalId()} * 8, 8);
    case Opcode::kAtomicAdd:
      if (c.dstOffset() % 8 != 0) return "atomicAdd offset " + std::to_string(c.dstOffset()) + " is not 8-byte aligned";
      return registry_.checkRemote(peer, c.dstWindow(), c.dstOffset(), 8);
    case Opcode::kRelayTo: return "relayTo slot without its relayPut";
    default: return "unknown opcode " + std::to_string(static_cast<int>(c.opcode()));
  }
}

}  // namespace gdx
