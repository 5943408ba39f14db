// WindowKeys (window_keys.hpp): the keys of this side's windows the peer gets, and the keys of the peer's windows
// this side learns.
#include "p2p/window_keys.hpp"

#include "base/log.hpp"
#include "gdx/error.hpp"

namespace gdx::p2p {

WindowKeys::WindowKeys(Transport& transport, int peer, LocalWindows& windows, const std::string& name)
    : transport_(transport), peer_(peer), windows_(windows), name_(name) {}

ControlMsg WindowKeys::refusal(uint32_t window) const {
  ControlMsg no;
  no.type = MsgType::kKeyRefused;
  no.window = window;
  return no;
}

std::vector<ControlMsg> WindowKeys::answer(const ControlMsg& request) {
  MemoryRegion r;
  if (!windows_.resolve(request.window, &r, request.offset)) return {refusal(request.window)};
  sent_.erase(request.window);  // the peer asks, so it does not have it
  std::vector<ControlMsg> out;
  try {
    std::string key = windows_.keyOf(r);
    // A window the resolver gave (the URL transport's memory, its key's secret presented) may be written, even if it
    // was registered before as the source of this side's writes.
    if (request.window < kAdvertisedWindowBase && request.window != kEagerWindow)
      transport_.setRemoteAccess(request.window, RemoteAccess::kWrite);
    offer(request.window, key, r.bytes, out);
  } catch (const Error& e) {
    GDX_WARN(name_ << ": key of window " << request.window << ": " << e.what());
    return {refusal(request.window)};
  }
  return out;
}

uint32_t WindowKeys::grant(const Piece& p, LocalWindows::GrantFor what, uint64_t id, std::vector<ControlMsg>& out) {
  std::string key;
  const uint32_t w = windows_.grant(p, what, id, &key);
  sent_.erase(w);  // a window id used before: the peer gets this grant's key
  offer(w, key, p.size, out);
  return w;
}

void WindowKeys::offerEagerBuffer(std::vector<ControlMsg>& out) {
  if (sent_.count(kEagerWindow)) return;
  MemoryRegion r;
  windows_.resolve(kEagerWindow, &r);
  offer(kEagerWindow, windows_.keyOf(r), r.bytes, out);
}

void WindowKeys::offer(uint32_t window, const std::string& key, uint64_t bytes, std::vector<ControlMsg>& out) {
  if (!sent_.insert(window).second) return;
  if (key.size() > kMaxKeyBytes)
    throw Error(ErrorCode::kInternal, name_ + ": a window key of " + std::to_string(key.size()) + " bytes");
  for (ControlMsg& part : splitKey(window, key, bytes)) out.push_back(std::move(part));
}

void WindowKeys::checkFits(const RemotePiece& dst) const {
  auto it = known_.find(dst.window);
  const uint64_t have = it == known_.end() ? 0 : it->second;
  if (dst.offset > have || dst.size > have - dst.offset)
    throw Error(ErrorCode::kInvalidArgument, "a write of " + std::to_string(dst.size) + " bytes at offset " +
                                                 std::to_string(dst.offset) + " does not fit the peer's window " +
                                                 std::to_string(dst.window) + " of " + std::to_string(have) + " bytes");
}

bool WindowKeys::asked(uint32_t window) const {
  auto it = waiters_.find(window);
  return it != waiters_.end() && !it->second.empty();
}

ControlMsg WindowKeys::request(uint32_t window, uint64_t secret) {
  ControlMsg req;
  req.type = MsgType::kKeyRequest;
  req.window = window;
  req.offset = secret;
  return req;
}

void WindowKeys::await(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op) {
  t->setWaiting("the peer's key of window " + std::to_string(window));
  waiters_[window].emplace_back(t, std::move(op));
}

std::string WindowKeys::onKeyPart(const ControlMsg& m, std::vector<std::function<void()>>& ready) {
  bool complete = false;
  KeyAssembly::Key k;
  const std::string bad = assembly_.add(m, &complete, &k);
  if (!bad.empty()) return "the peer sent " + bad;
  if (!complete) return std::string();
  auto waiting = std::move(waiters_[m.window]);
  waiters_.erase(m.window);
  try {
    transport_.addRemoteWindow(peer_, k.window, k.bytes, k.key);
    known_[k.window] = k.bytes;
  } catch (const Error& e) {
    for (auto& w : waiting) w.first->fail(e.code(), e.what());
    return std::string();
  }
  for (auto& w : waiting) ready.push_back(std::move(w.second));
  return std::string();
}

void WindowKeys::onKeyRefused(uint32_t window) {
  auto waiting = std::move(waiters_[window]);
  waiters_.erase(window);
  for (auto& w : waiting)
    w.first->fail(ErrorCode::kInvalidArgument,
                  "the peer refused window " + std::to_string(window) +
                      ": it was not advertised on this connection (a forged, stale or foreign descriptor)");
}

}  // namespace gdx::p2p
