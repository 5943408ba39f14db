// gdx::Context, the API (gdx/context.hpp), over its state (ContextImpl, runtime/context_impl.hpp): every call forwards.
#include <shared_mutex>

#include "gdx/context.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/context_link.hpp"

namespace gdx {

ContextImpl& detail::contextImpl(Context& context) {
  return *context.impl_;
}

ContextRef::Use ContextRef::use() const {
  Use u;
  if (!link_) return u;
  u.lock_ = std::shared_lock<std::shared_mutex>(link_->mutex);
  if (!link_->closing.load(std::memory_order_acquire) && link_->context) u.context_ = link_->api;
  return u;
}

int ContextRef::rank() const {
  return link_ ? link_->rank : -1;
}

void ContextRef::throwGone(const std::string& what) const {
  if (!link_) throw Error(ErrorCode::kShutdown, what + ": no Context");
  detail::throwContextGone(*link_, what);
}

Context::Context(const ContextOptions& options) : Context(BootstrapConfig::fromEnv(), options) {}
Context::Context(const BootstrapConfig& bootstrap, const ContextOptions& options)
    : impl_(std::make_unique<ContextImpl>(this, bootstrap, options)) {}
Context::~Context() = default;

int Context::rank() const {
  return impl_->rank();
}
int Context::worldSize() const {
  return impl_->worldSize();
}
int Context::localRank() const {
  return impl_->bootstrap().localRank();
}
const std::vector<int>& Context::hostRanks() const {
  return impl_->bootstrap().hostRanks();
}
const ContextOptions& Context::options() const {
  return impl_->options();
}
std::string Context::transportName() const {
  return impl_->transport().name();
}
ProxyCounters Context::stats() const {
  return impl_->proxy().totalCounters();
}
std::string Context::proxyError() const {
  return impl_->proxy().lastError();
}
ContextRef Context::ref() const {
  return impl_->ref();
}

Window Context::registerWindow(void* base, size_t bytes, MemoryKind kind, const std::string& name, WindowSizes sizes) {
  return impl_->registerWindow(base, bytes, kind, name, sizes);
}
Channel Context::channel(int peer, int ringIndex) {
  return impl_->channel(peer, ringIndex);
}
ChannelDeviceHandle Context::deviceChannel(int peer, int ringIndex) {
  return impl_->deviceChannel(peer, ringIndex);
}
int Context::numDeviceRings() const {
  return impl_->numDeviceRings();
}
Channel Context::relayChannel(int destination, int relay, int ringIndex) {
  return impl_->relayChannel(destination, relay, ringIndex);
}
ChannelDeviceHandle Context::deviceRelayChannel(int destination, int relay, int ringIndex) {
  return impl_->deviceRelayChannel(destination, relay, ringIndex);
}
PeerCopyQueue* Context::forwarder() {
  return impl_->forwarder();
}
const GpuInfo& Context::gpu() const {
  return impl_->gpu();
}
uint32_t Context::numSignals() const {
  return impl_->numSignals();
}
bool Context::isDirect(int peer) const {
  return impl_->isDirect(peer);
}
uint64_t Context::signalValue(uint32_t id) const {
  return impl_->signalValue(id);
}
void Context::setSignal(uint32_t id, uint64_t value) {
  impl_->setSignal(id, value);
}
void Context::wait(uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  impl_->wait(id, value, timeoutNs);
}
Status Context::waitStatus(uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  return impl_->waitStatus(id, value, timeoutNs);
}
void Context::waitFrom(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  impl_->waitFrom(peer, id, value, timeoutNs);
}
Status Context::waitFromStatus(int peer, uint32_t id, uint64_t value, uint64_t timeoutNs) const {
  return impl_->waitFromStatus(peer, id, value, timeoutNs);
}
std::string Context::failure() const {
  return impl_->failure();
}
std::string Context::failure(int peer) const {
  return impl_->failure(peer);
}
bool Context::peerFailed(int peer) const {
  return impl_->peerFailed(peer);
}
const uint32_t* Context::deviceFailureWord() const {
  return impl_->deviceFailureWord();
}
std::vector<std::string> Context::allGather(const std::string& mine, const CollectiveTag& tag) {
  return impl_->bootstrap().allGather(mine, tag);
}
void Context::barrier() {
  impl_->barrier();
}

}  // namespace gdx
