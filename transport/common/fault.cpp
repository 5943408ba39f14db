#include "transport/common/fault.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <vector>

#include "gdx/error.hpp"

namespace gdx::common {
namespace {

bool toNumber(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

const char* faultName(FaultAction a) {
  switch (a) {
    case FaultAction::kNone: return "none";
    case FaultAction::kDrop: return "drop";
    case FaultAction::kDelay: return "delay";
    case FaultAction::kCorrupt: return "corrupt";
    case FaultAction::kClose: return "close";
  }
  return "?";
}

FaultPlan FaultPlan::parse(const std::string& spec, int worldSize) {
  FaultPlan p;
  if (spec.empty()) return p;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument,
                 "GDX_FAULT=" + spec + ": " + why + " (ACTION:PEER:N[:MS], ACTION one of drop, delay, corrupt, close)");
  };
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ':');) parts.push_back(part);
  if (parts.size() < 3 || parts.size() > 4) throw bad("expected 3 or 4 fields");
  const std::string& a = parts[0];
  if (a == "drop")
    p.action = FaultAction::kDrop;
  else if (a == "delay")
    p.action = FaultAction::kDelay;
  else if (a == "corrupt")
    p.action = FaultAction::kCorrupt;
  else if (a == "close")
    p.action = FaultAction::kClose;
  else
    throw bad("unknown action '" + a + "'");
  uint64_t peer = 0, at = 0, ms = p.delayMs;
  if (!toNumber(parts[1], &peer) || peer >= static_cast<uint64_t>(worldSize))
    throw bad("peer '" + parts[1] + "' is not a rank of this job of " + std::to_string(worldSize));
  if (!toNumber(parts[2], &at) || at == 0) throw bad("operation count '" + parts[2] + "' is not a number >= 1");
  if (parts.size() == 4 && (p.action != FaultAction::kDelay || !toNumber(parts[3], &ms) || ms > 3600 * 1000))
    throw bad("only delay takes milliseconds (0 .. 3600000), got '" + parts[3] + "'");
  p.peer = static_cast<int>(peer);
  p.atOperation = at;
  p.delayMs = ms;
  return p;
}

std::string FaultPlan::describe() const {
  std::string s =
      std::string(faultName(action)) + " operation " + std::to_string(atOperation) + " to peer " + std::to_string(peer);
  if (action == FaultAction::kDelay) s += " by " + std::to_string(delayMs) + " ms";
  return s + " (GDX_FAULT)";
}

bool FaultInjector::sleepDelay(const std::function<bool()>& stop) const {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + std::chrono::milliseconds(plan_.delayMs);
  for (Clock::time_point now = Clock::now(); now < until; now = Clock::now()) {
    if (stop()) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(until - now, std::chrono::milliseconds(10)));
  }
  return true;
}

}  // namespace gdx::common
