// Endpoint: memory regions and transfers (two-sided, one-sided, vectorised, asynchronous), each checked against its
// region and connection before anything is queued.
#include <sstream>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/endpoint_impl.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/protocol.hpp"

namespace gdx::p2p {
namespace {

/// The time a blocking call waits beyond its transfer's deadline, for the progress thread to report the timeout
/// itself (with what it waited for) instead of the caller's plainer one.
constexpr uint64_t kReportGraceNs = 1000ull * 1000 * 1000;

std::string hexPtr(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

MemoryRegion Endpoint::Impl::region(uint64_t mrId, const void* ptr, size_t size, const char* op) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = regions.find(mrId);
  if (it == regions.end())
    throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": memory region " + std::to_string(mrId) +
                                                 " is not registered (never registered, or deregistered)");
  const MemoryRegion& r = it->second;
  const char* p = static_cast<const char*>(ptr);
  if (size == 0)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": " + op + ": zero bytes (memory region " + std::to_string(mrId) + ")");
  if (p < r.base || p > r.base + r.bytes || size > static_cast<uint64_t>(r.base + r.bytes - p))
    throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": [" + hexPtr(p) + ", +" + std::to_string(size) +
                                                 ") lies outside memory region " + std::to_string(mrId) + " [" +
                                                 hexPtr(r.base) + ", +" + std::to_string(r.bytes) + ")");
  return r;
}

Piece Endpoint::Impl::piece(uint64_t mrId, const void* ptr, size_t size, const char* op) {
  Piece p;
  p.region = region(mrId, ptr, size, op);
  p.offset = static_cast<uint64_t>(static_cast<const char*>(ptr) - p.region.base);
  p.size = size;
  return p;
}

std::shared_ptr<Transfer> Endpoint::Impl::newTransfer(TransferName name, int parts) {
  return std::make_shared<Transfer>(std::move(name), parts, deadlineNs());
}

std::shared_ptr<Transfer> Endpoint::Impl::newTransfer(TransferName name, int parts,
                                                      const std::shared_ptr<Connection>& c) {
  auto t = newTransfer(std::move(name), parts);
  std::weak_ptr<Connection> weak = c;
  t->setDriver([weak](const Transfer& self, uint64_t deadline) {
    if (auto conn = weak.lock()) conn->drive(self, deadline);
  });
  return t;
}

uint64_t Endpoint::Impl::remember(std::shared_ptr<Transfer> t) {
  std::lock_guard<std::mutex> lock(mutex);
  uint64_t id = nextTransfer++;
  transfers[id] = std::move(t);
  return id;
}

std::map<uint64_t, std::shared_ptr<Transfer>>::iterator Endpoint::Impl::transferOf(uint64_t id) {
  auto it = transfers.find(id);
  if (it == transfers.end())
    throw Error(ErrorCode::kInvalidArgument, who() + ": transfer " + std::to_string(id) +
                                                 " is unknown (never started, or already reported done or failed)");
  return it;
}

void Endpoint::Impl::finish(const std::shared_ptr<Transfer>& t) {
  t->wait(t->deadlineNs() + kReportGraceNs);
}

void Endpoint::Impl::finish(Connection& c, const Transfer& t) {
  const uint64_t deadline = t.deadlineNs() + kReportGraceNs;
  c.drive(t, deadline);
  t.wait(deadline);
}

// ---- memory ---------------------------------------------------------------------------------------------------

uint64_t Endpoint::reg(const void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": reg: " + (ptr ? "zero bytes" : "null pointer"));
  MemoryRegion r;
  r.base = static_cast<char*>(const_cast<void*>(ptr));
  r.bytes = bytes;
  r.kind = pointerKind(ptr);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->nextMr >= kGrantWindowBase)
    throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": reg: out of memory region ids");
  uint64_t id = impl_->nextMr++;
  r.window = static_cast<uint32_t>(id);
  impl_->regions[id] = r;
  return id;
}

void Endpoint::dereg(uint64_t mrId) {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->regions.erase(mrId))
      throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": dereg: memory region " + std::to_string(mrId) +
                                                   " is not registered (never registered, or deregistered already)");
    for (auto& c : impl_->conns) conns.push_back(c.second);
  }
  for (auto& c : conns) c->forget(static_cast<uint32_t>(mrId));
}

// ---- two-sided ------------------------------------------------------------------------------------------------

namespace {

TransferName describe(const char* op, size_t pieces, uint64_t bytes, const Connection& c) {
  return TransferName{op, pieces, bytes, c.sharedName()};
}

/// The buffers of a two-sided call: a vector's, or the one of send()/recv() (which then builds no vector of them).
struct Buffers {
  const Iov* iovs;
  size_t count;
};

/// How a two-sided call waits: an asynchronous one's transfer drives its connection when it is waited for; a
/// blocking call drives it itself (Endpoint::Impl::finish(Connection&, ...)), so its transfer needs no driver.
enum class Waiter { kAsync, kBlocking };

/// Checks the pieces of a two-sided call and queues them on `c` with `post`; the transfer.
template <typename Post>
std::shared_ptr<Transfer> twoSided(Endpoint::Impl& d, const std::shared_ptr<Connection>& c, Buffers buffers,
                                   Waiter waiter, const char* op, const char* noun, Post post) {
  if (buffers.count == 0) throw Error(ErrorCode::kInvalidArgument, d.who() + ": " + op + ": no buffers");
  std::vector<Piece> pieces;
  pieces.reserve(buffers.count);
  uint64_t total = 0;
  for (size_t i = 0; i < buffers.count; ++i) {
    const Iov& v = buffers.iovs[i];
    pieces.push_back(d.piece(v.mrId, v.ptr, v.size, op));
    total += v.size;
  }
  TransferName name = describe(noun, pieces.size(), total, *c);
  const int parts = static_cast<int>(pieces.size());
  auto t =
      waiter == Waiter::kBlocking ? d.newTransfer(std::move(name), parts) : d.newTransfer(std::move(name), parts, c);
  post(*c, t, std::move(pieces));
  return t;
}

std::shared_ptr<Transfer> startSend(Endpoint::Impl& d, const std::shared_ptr<Connection>& c, Buffers buffers,
                                    Waiter waiter) {
  return twoSided(d, c, buffers, waiter, "send", "send",
                  [](Connection& c, std::shared_ptr<Transfer> t, std::vector<Piece> p) { c.send(t, std::move(p)); });
}

std::shared_ptr<Transfer> startRecv(Endpoint::Impl& d, const std::shared_ptr<Connection>& c, Buffers buffers,
                                    Waiter waiter) {
  return twoSided(d, c, buffers, waiter, "recv", "receive",
                  [](Connection& c, std::shared_ptr<Transfer> t, std::vector<Piece> p) { c.recv(t, std::move(p)); });
}

/// A blocking send or receive: queued and driven to its end by the calling thread (Connection::Driving first, so
/// that queueing it does not also wake the progress thread).
template <typename Start>
std::shared_ptr<Transfer> blocking(Endpoint::Impl& d, uint64_t connId, const char* op, Buffers buffers, Start start) {
  auto c = d.connection(connId, op);
  Connection::Driving driving(*c);
  auto t = start(d, c, buffers, Waiter::kBlocking);
  d.finish(*c, *t);
  return t;
}

/// The sizes a finished receive recorded, as the public API gives them.
void receivedSizes(const Transfer& t, std::vector<size_t>* out) {
  const std::vector<uint64_t> sizes = t.sizes();
  out->assign(sizes.begin(), sizes.end());
}

}  // namespace

uint64_t Endpoint::sendvAsync(uint64_t connId, const std::vector<Iov>& iovs) {
  return impl_->remember(
      startSend(*impl_, impl_->connection(connId, "send"), Buffers{iovs.data(), iovs.size()}, Waiter::kAsync));
}

uint64_t Endpoint::recvvAsync(uint64_t connId, const std::vector<Iov>& iovs) {
  return impl_->remember(
      startRecv(*impl_, impl_->connection(connId, "recv"), Buffers{iovs.data(), iovs.size()}, Waiter::kAsync));
}

uint64_t Endpoint::sendAsync(uint64_t connId, uint64_t mrId, const void* ptr, size_t size) {
  return sendvAsync(connId, {Iov{mrId, const_cast<void*>(ptr), size}});
}
uint64_t Endpoint::recvAsync(uint64_t connId, uint64_t mrId, void* ptr, size_t size) {
  return recvvAsync(connId, {Iov{mrId, ptr, size}});
}
// The blocking calls drive their connection from the calling thread (blocking()): the operation is posted and its
// completions polled here, with no hand-off to the progress thread. Their transfers get no id and no driver: nobody
// else can ask for them.
void Endpoint::send(uint64_t connId, uint64_t mrId, const void* ptr, size_t size) {
  const Iov one{mrId, const_cast<void*>(ptr), size};
  blocking(*impl_, connId, "send", Buffers{&one, 1}, startSend);
}
size_t Endpoint::recv(uint64_t connId, uint64_t mrId, void* ptr, size_t size) {
  const Iov one{mrId, ptr, size};
  const std::vector<uint64_t> sizes = blocking(*impl_, connId, "recv", Buffers{&one, 1}, startRecv)->sizes();
  return sizes.empty() ? 0 : static_cast<size_t>(sizes[0]);
}
void Endpoint::sendv(uint64_t connId, const std::vector<Iov>& iovs) {
  blocking(*impl_, connId, "send", Buffers{iovs.data(), iovs.size()}, startSend);
}
std::vector<size_t> Endpoint::recvv(uint64_t connId, const std::vector<Iov>& iovs) {
  std::vector<size_t> received;
  receivedSizes(*blocking(*impl_, connId, "recv", Buffers{iovs.data(), iovs.size()}, startRecv), &received);
  return received;
}

bool Endpoint::poll(uint64_t transferId) {
  return poll(transferId, nullptr);
}

bool Endpoint::poll(uint64_t transferId, std::vector<size_t>* received) {
  std::shared_ptr<Transfer> t;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->transferOf(transferId);
    t = it->second;
    if (t->finished()) impl_->transfers.erase(it);
  }
  const bool done = t->poll();
  if (done && received) receivedSizes(*t, received);
  return done;
}

void Endpoint::wait(uint64_t transferId) {
  wait(transferId, nullptr);
}

void Endpoint::wait(uint64_t transferId, std::vector<size_t>* received) {
  std::shared_ptr<Transfer> t;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    t = impl_->transferOf(transferId)->second;
  }
  struct Forget {
    Impl& d;
    uint64_t id;
    ~Forget() {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.transfers.erase(id);
    }
  } forget{*impl_, transferId};
  impl_->finish(t);
  if (received) receivedSizes(*t, received);
}

// ---- one-sided ------------------------------------------------------------------------------------------------

std::string Endpoint::advertise(uint64_t connId, uint64_t mrId, const void* ptr, size_t size) {
  auto c = impl_->connection(connId, "advertise");
  Piece p = impl_->piece(mrId, ptr, size, "advertise");
  Descriptor d;
  d.token = c->token();
  d.window = c->advertise(p.region, p.offset, p.size);
  d.bytes = p.size;
  return encodeDescriptor(d);
}

namespace {

/// The remote piece `descriptor` names at `offset`, after checking it belongs to `c` and the range fits.
RemotePiece remotePiece(const std::string& who, const Connection& c, const std::string& descriptor, uint64_t offset,
                        uint64_t size, const char* op) {
  Descriptor d;
  std::string bad = decodeDescriptor(descriptor, &d);
  if (!bad.empty()) throw Error(ErrorCode::kInvalidArgument, who + ": " + op + " on " + c.name() + ": " + bad);
  if (d.token != c.token())
    throw Error(ErrorCode::kInvalidArgument,
                who + ": " + op + " on " + c.name() + ": the descriptor was advertised on another connection");
  if (d.window < kAdvertisedWindowBase)
    throw Error(ErrorCode::kInvalidArgument, who + ": " + op + " on " + c.name() + ": the descriptor names window " +
                                                 std::to_string(d.window) +
                                                 ", which advertise() never hands out (forged; nothing was sent)");
  if (offset > d.bytes || size > d.bytes - offset)
    throw Error(ErrorCode::kInvalidArgument, who + ": " + op + " of " + std::to_string(size) + " bytes at offset " +
                                                 std::to_string(offset) + " on " + c.name() +
                                                 ": outside the advertised region of " + std::to_string(d.bytes) +
                                                 " bytes (nothing was sent)");
  return RemotePiece{d.window, offset, size};
}

}  // namespace

uint64_t Endpoint::writeAsync(uint64_t connId, uint64_t mrId, const void* ptr, size_t size,
                              const std::string& descriptor, uint64_t remoteOffset) {
  auto c = impl_->connection(connId, "write");
  Piece p = impl_->piece(mrId, ptr, size, "write");
  RemotePiece r = remotePiece(impl_->who(), *c, descriptor, remoteOffset, size, "write");
  auto t = impl_->newTransfer(describe("write", 1, size, *c), 2, c);
  c->write(t, {p}, {r}, false);
  return impl_->remember(t);
}

uint64_t Endpoint::readAsync(uint64_t connId, uint64_t mrId, void* ptr, size_t size, const std::string& descriptor,
                             uint64_t remoteOffset) {
  auto c = impl_->connection(connId, "read");
  Piece p = impl_->piece(mrId, ptr, size, "read");
  RemotePiece r = remotePiece(impl_->who(), *c, descriptor, remoteOffset, size, "read");
  auto t = impl_->newTransfer(describe("read", 1, size, *c), 1, c);
  c->read(t, {p}, {r});
  return impl_->remember(t);
}

void Endpoint::write(uint64_t connId, uint64_t mrId, const void* ptr, size_t size, const std::string& descriptor,
                     uint64_t remoteOffset) {
  Connection::Driving driving(*impl_->connection(connId, "write"));
  wait(writeAsync(connId, mrId, ptr, size, descriptor, remoteOffset));
}

void Endpoint::read(uint64_t connId, uint64_t mrId, void* ptr, size_t size, const std::string& descriptor,
                    uint64_t remoteOffset) {
  Connection::Driving driving(*impl_->connection(connId, "read"));
  wait(readAsync(connId, mrId, ptr, size, descriptor, remoteOffset));
}

namespace {

/// The local and remote pieces of a vectorised one-sided call (one descriptor per buffer, each at offset 0).
struct OneSidedVector {
  std::vector<Piece> local;
  std::vector<RemotePiece> remote;
  uint64_t total = 0;
};

OneSidedVector oneSidedVector(Endpoint::Impl& d, Connection& c, const std::vector<Iov>& iovs,
                              const std::vector<std::string>& descriptors, const char* op) {
  if (iovs.empty() || iovs.size() != descriptors.size())
    throw Error(ErrorCode::kInvalidArgument, d.who() + ": " + op + ": " + std::to_string(iovs.size()) +
                                                 " buffers and " + std::to_string(descriptors.size()) +
                                                 " descriptors (one each, at least one)");
  OneSidedVector v;
  for (size_t i = 0; i < iovs.size(); ++i) {
    v.local.push_back(d.piece(iovs[i].mrId, iovs[i].ptr, iovs[i].size, op));
    v.remote.push_back(remotePiece(d.who(), c, descriptors[i], 0, iovs[i].size, op));
    v.total += iovs[i].size;
  }
  return v;
}

}  // namespace

void Endpoint::writev(uint64_t connId, const std::vector<Iov>& iovs, const std::vector<std::string>& descriptors) {
  auto c = impl_->connection(connId, "writev");
  Connection::Driving driving(*c);
  OneSidedVector v = oneSidedVector(*impl_, *c, iovs, descriptors, "writev");
  // One part per piece and one for the fence that says they are all in place.
  auto t = impl_->newTransfer(describe("write", v.local.size(), v.total, *c), static_cast<int>(v.local.size()) + 1, c);
  c->write(t, std::move(v.local), std::move(v.remote), false);
  impl_->finish(t);
}

void Endpoint::readv(uint64_t connId, const std::vector<Iov>& iovs, const std::vector<std::string>& descriptors) {
  auto c = impl_->connection(connId, "readv");
  Connection::Driving driving(*c);
  OneSidedVector v = oneSidedVector(*impl_, *c, iovs, descriptors, "readv");
  auto t = impl_->newTransfer(describe("read", v.local.size(), v.total, *c), static_cast<int>(v.local.size()), c);
  c->read(t, std::move(v.local), std::move(v.remote));
  impl_->finish(t);
}

// ---- CUDA IPC -------------------------------------------------------------------------------------------------

std::string Endpoint::advertiseIpc(uint64_t mrId, const void* ptr, size_t size) {
  Piece p = impl_->piece(mrId, ptr, size, "advertiseIpc");
  if (p.region.kind != MemoryKind::kCuda)
    throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": advertiseIpc: memory region " + std::to_string(mrId) +
                                                 " is host memory; IPC advertises GPU memory");
  return impl_->ipc->advertise(ptr, size, impl_->who());
}

void Endpoint::writeIpc(const void* ptr, size_t size, const std::string& descriptor, uint64_t remoteOffset) {
  impl_->ipc->copy(const_cast<void*>(ptr), size, descriptor, remoteOffset, true, impl_->who() + ": writeIpc");
}

void Endpoint::readIpc(void* ptr, size_t size, const std::string& descriptor, uint64_t remoteOffset) {
  impl_->ipc->copy(ptr, size, descriptor, remoteOffset, false, impl_->who() + ": readIpc");
}

}  // namespace gdx::p2p
