#include "runtime/relay.hpp"

#include <algorithm>
#include <cstring>

#include "base/log.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/error.hpp"
#include "runtime/direct_path.hpp"

namespace gdx {

Relay::Relay(const Bootstrap& bootstrap, const WindowRegistry& registry, const DirectPaths& direct, const GpuInfo& gpu,
             uint64_t timeoutNs)
    : bootstrap_(bootstrap), registry_(registry), direct_(direct), device_(gpu.device), timeoutNs_(timeoutNs) {}

// The queue drains (bounded) before the IPC mappings it writes through are released: the Context destroys the relay
// before its direct paths.
Relay::~Relay() = default;

void Relay::checkRoute(int destination, int relay) const {
  const int rank = bootstrap_.rank(), world = bootstrap_.worldSize();
  const std::string where = "rank " + std::to_string(rank) + ": relay channel to rank " + std::to_string(destination) +
                            " through rank " + std::to_string(relay) + ": ";
  if (destination < 0 || destination >= world || relay < 0 || relay >= world)
    throw Error(ErrorCode::kInvalidArgument, where + "no such rank (world size " + std::to_string(world) + ")");
  if (destination == relay || relay == rank)
    throw Error(ErrorCode::kInvalidArgument, where + "the relay must be a third rank");
  if (destination >= static_cast<int>(kMaxPeers) - 1)
    throw Error(ErrorCode::kInvalidArgument,
                where + "ranks from " + std::to_string(kMaxPeers - 1) + " up cannot be forwarded to");
  if (bootstrap_.hostname(destination) != bootstrap_.hostname(relay))
    throw Error(ErrorCode::kInvalidArgument, where + "they are on different hosts (" +
                                                 bootstrap_.hostname(destination) + ", " + bootstrap_.hostname(relay) +
                                                 ")");
}

namespace {
bool isSignal(const Command& c) {
  return c.opcode() == Opcode::kSignalSet || c.opcode() == Opcode::kSignalAdd;
}
bool isPut(const Command& c) {
  return c.opcode() == Opcode::kRelayPut || c.opcode() == Opcode::kPutWithSignal;
}
}  // namespace

// The relay (the command's peer) gets the data, the destination the data and the signal.
std::string Relay::check(const Command& first, const Command& second) const {
  const int relay = static_cast<int>(first.peer()), destination = second.forwardTo();
  if (destination == relay) return "forwarding to the relay itself";
  std::string why;
  if (isSignal(second)) why = registry_.checkRemote(destination, kSignalWindowId, uint64_t{second.signalId()} * 8, 8);
  if (why.empty() && isPut(first))
    why = registry_.checkRemote(destination, first.dstWindow(), first.dstOffset(), first.size());
  return why.empty() ? why : "forwarding to rank " + std::to_string(destination) + ": " + why;
}

MessageOp Relay::request(const Command& first, const Command& second) const {
  ForwardRequest f;
  f.destination = second.forwardTo();
  if (isSignal(second)) {
    f.hasSignal = 1;
    f.signalId = second.signalId();
    f.value = second.value();
    f.signalOp = static_cast<uint8_t>(second.signalOp());
  }
  if (isPut(first)) {
    f.window = first.dstWindow();
    f.offset = first.dstOffset();
    f.bytes = first.size();
  }
  MessageOp m;
  m.peer = static_cast<int>(first.peer());
  m.bytes = sizeof f;
  std::memcpy(m.data, &f, sizeof f);
  return m;
}

std::string Relay::resolve(const ForwardRequest& f, ForwardTarget* out) const {
  return direct_.withPeerTable(f.destination,
                               [&](const DirectPeer* d) -> std::string { return resolveForward(f, d, out); });
}

// The sender checked everything it could; what only this rank can know (a destination it reaches directly, its
// windows) is checked here.
void Relay::onMessage(const RemoteMessage& m) {
  ForwardRequest f;
  std::string why = decodeForward(m, &f);
  ForwardTarget t;
  if (why.empty()) why = resolve(f, &t);
  if (why.empty()) {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!queue_) {
        PeerCopyQueue::Options o = PeerCopyQueue::Options::fromEnv();
        o.timeoutNs = timeoutNs_;
        queue_ = std::make_unique<PeerCopyQueue>(device_, o);
      }
      queue_->submit(t.src, t.dst, f.bytes, f.hasSignal ? t.signal : nullptr, f.value,
                     static_cast<SignalOp>(f.signalOp));
      return;
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  GDX_ERROR("rank " << bootstrap_.rank() << ": cannot forward for rank " << m.peer << " to rank " << f.destination
                    << " (window " << f.window << " offset " << f.offset << ", " << f.bytes << " bytes, signal "
                    << f.signalId << "): " << why);
}

PeerCopyQueue* Relay::forwarder() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.get();
}

}  // namespace gdx
