// TcpxSession: the endpoint, connection info, the channels of a peer (connect, accept and the channel hello that
// groups them), memory registration (tcpx_impl.hpp describes the protocol).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/byte_codec.hpp"
#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/handshake.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/tcpx_impl.hpp"

namespace gdx::p2p {
namespace {

constexpr char kHelloMagic[8] = {'g', 'd', 'x', 't', 'c', 'p', 'x', '1'};
/// What listen() returns starts with this; then the address, the port and the GPU, separated by spaces.
constexpr const char* kInfoTag = "gdx-tcpx/1";
constexpr int kMaxChannels = 64;

struct ConnInfo {
  std::string ip;
  int port = 0;
  int gpu = -1;
};

/// "" and *out when `text` is listen()'s connection info, else why not.
std::string parseConnInfo(const std::string& text, ConnInfo* out) {
  std::istringstream in(text);
  std::string tag, extra;
  long long port = 0, gpu = 0;
  if (!(in >> tag) || tag != kInfoTag) return std::string("it does not start with '") + kInfoTag + "'";
  if (!(in >> out->ip >> port >> gpu)) return std::string("expected '") + kInfoTag + " ADDRESS PORT GPU'";
  if (in >> extra) return "unexpected '" + extra + "' after the GPU";
  if (out->ip.size() > 255) return "an address of " + std::to_string(out->ip.size()) + " bytes";
  if (port < 1 || port > 65535) return "port " + std::to_string(port) + " is outside 1..65535";
  if (gpu < -1 || gpu > 1023) return "GPU " + std::to_string(gpu) + " is outside -1..1023";
  out->port = static_cast<int>(port);
  out->gpu = static_cast<int>(gpu);
  return "";
}

std::string quoted(const std::string& name) {
  return "'" + name + "'";
}

std::string hexPtr(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

void encodeChannelHello(const ChannelHello& h, char* out) {
  ByteWriter w;
  w.putRaw(kHelloMagic, sizeof kHelloMagic).put(h.session).put(h.channel).put(h.channels).put(h.chunkBytes);
  std::memset(out, 0, kHelloBytes);
  std::memcpy(out, w.bytes().data(), w.bytes().size());
}

std::string decodeChannelHello(const char* in, ChannelHello* out) {
  ByteReader r(in, kHelloBytes);
  char magic[sizeof kHelloMagic];
  ChannelHello h;
  r.getRaw(magic, sizeof magic);
  r.get(&h.session);
  r.get(&h.channel);
  r.get(&h.channels);
  r.get(&h.chunkBytes);
  if (!r.ok() || std::memcmp(magic, kHelloMagic, sizeof magic) != 0)
    return "its first message is not a session's hello";
  if (h.channels < 1 || h.channels > kMaxChannels || h.channel >= h.channels)
    return "a hello for channel " + std::to_string(h.channel) + " of " + std::to_string(h.channels);
  if (h.chunkBytes < 1 || h.chunkBytes > kMaxLinkChunkBytes)
    return "a hello with pieces of " + std::to_string(h.chunkBytes) + " bytes";
  *out = h;
  return "";
}

// ---- options and the session's state --------------------------------------------------------------------------

TcpxSessionOptions TcpxSessionOptions::fromEnv(int gpu, int channels) {
  TcpxSessionOptions o;
  o.gpu = gpu;
  o.channels = channels > 0 ? channels : static_cast<int>(envInt("UCCL_TCPX_NUM_CHANNELS", 2));
  o.socketsPerChannel = static_cast<int>(envInt("NCCL_NSOCKS_PERTHREAD", 2));
  o.chunkBytes = static_cast<uint64_t>(envInt("UCCL_TCPX_CHUNK_BYTES", 512 << 10));
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

TcpxSession::Impl::Impl(const TcpxSessionOptions& o) : options(o) {
  auto refuse = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "TcpxSession: " + what); };
  if (o.gpu < -1) refuse("gpu must be -1 (none) or a GPU index, not " + std::to_string(o.gpu));
  if (o.channels < 1 || o.channels > kMaxChannels)
    refuse("channels (UCCL_TCPX_NUM_CHANNELS) must be 1..64, not " + std::to_string(o.channels));
  if (o.socketsPerChannel < 1 || o.socketsPerChannel > kMaxLinkSockets)
    refuse("socketsPerChannel (NCCL_NSOCKS_PERTHREAD) must be 1..64, not " + std::to_string(o.socketsPerChannel));
  if (o.chunkBytes < 1 || o.chunkBytes > kMaxLinkChunkBytes)
    refuse("chunkBytes (UCCL_TCPX_CHUNK_BYTES) must be 1..1073741824, not " + std::to_string(o.chunkBytes));
  if (options.timeoutNs == 0) options.timeoutNs = defaultTimeoutNs();
  EndpointOptions e;
  e.localGpu = o.gpu;
  e.numCpus = o.channels;
  e.port = 0;
  e.bindAddress = o.bindAddress;
  e.transport = "tcp";
  e.timeoutNs = options.timeoutNs;
  e.tcpSockets = o.socketsPerChannel;
  e.tcpChunkBytes = o.chunkBytes;
  endpoint = std::make_unique<Endpoint>(e);
  helloIn.assign(kHelloBytes, 0);
  helloInMr = endpoint->reg(helloIn.data(), kHelloBytes);
}

std::string TcpxSession::Impl::who() const {
  return "TcpxSession " + endpoint->ip() + ":" + std::to_string(endpoint->port()) + " (GPU " +
         std::to_string(options.gpu) + ")";
}

std::shared_ptr<TcpxPeer> TcpxSession::Impl::peer(const std::string& name, const std::string& op) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = peers.find(name);
  if (it != peers.end()) return it->second;
  std::string known;
  for (const auto& p : peers) known += (known.empty() ? "" : ", ") + quoted(p.first);
  throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": no peer is called " + quoted(name) +
                                               " (connected or accepted: " + (known.empty() ? "none" : known) + ")");
}

TcpxMemory TcpxSession::Impl::memory(uint64_t memId, const std::string& op) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = memories.find(memId);
  if (it != memories.end()) return it->second;
  throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": mem_id " + std::to_string(memId) +
                                               " is not registered (never, or deregistered; " +
                                               std::to_string(memories.size()) + " registration(s) now)");
}

void TcpxSession::Impl::sayHello(TcpxPeer& p, uint64_t id) {
  const uint32_t channels = static_cast<uint32_t>(p.conns.size());
  p.helloBytes.assign(kHelloBytes * channels, 0);
  for (uint32_t c = 0; c < channels; ++c)
    encodeChannelHello(ChannelHello{id, c, channels, p.chunkBytes}, &p.helloBytes[c * kHelloBytes]);
  p.helloMr = endpoint->reg(p.helloBytes.data(), p.helloBytes.size());
  for (uint32_t c = 0; c < channels; ++c)
    p.hellos.push_back(endpoint->sendAsync(p.conns[c], p.helloMr, &p.helloBytes[c * kHelloBytes], kHelloBytes));
}

void TcpxSession::Impl::closePeer(TcpxPeer& p, const std::string& why) {
  std::vector<uint64_t> hellos;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (!p.closed.empty()) return;
    p.closed = why;
    hellos.swap(p.hellos);
  }
  for (uint64_t c : p.conns) {
    try {
      endpoint->close(c);
    } catch (const Error& e) {
      GDX_WARN(who() << ": closing peer " << quoted(p.name) << ": " << e.message());
    }
  }
  for (uint64_t h : hellos) {
    try {
      if (h) endpoint->wait(h);  // failed by the close above, if it had not finished
    } catch (const Error&) {
      // the peer's connections are gone; what its hello did no longer matters
    }
  }
  if (p.helloMr) endpoint->dereg(p.helloMr);
  p.helloMr = 0;
}

void TcpxSession::Impl::addPeer(const std::shared_ptr<TcpxPeer>& p, const std::string& op, const char* way) {
  std::string shape;
  try {
    shape = endpoint->connectionTransport(p->conns[0]);
  } catch (const Error& e) {
    shape = e.message();  // it failed meanwhile: its transfers will say so
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!peers.count(p->name)) {
      peers[p->name] = p;
      GDX_INFO(who() << ": " << op << ": " << p->conns.size() << " channel(s) " << way << " " << p->address << ", "
                     << shape << ", " << p->chunkBytes << "-byte pieces");
      return;
    }
  }
  closePeer(*p, "a peer of the same name was added meanwhile");
  throw Error(ErrorCode::kInvalidArgument, who() + ": " + op + ": a peer of that name was added meanwhile");
}

bool TcpxSession::Impl::takeConnection(uint64_t deadlineNs, const std::string& op) {
  const uint64_t now = nowNs();
  Accepted a;
  if (now >= deadlineNs || !endpoint->tryAccept(std::max<uint64_t>(1, (deadlineNs - now) / 1000000), &a)) return false;
  const std::string from = a.ip + " (connection " + std::to_string(a.connId) + ")";
  std::string why;
  ChannelHello h;
  try {
    // Each connection's hello is bounded by the hello wait, not by what is left of accept's: one that connected and
    // said nothing is refused and the wait goes on.
    const uint64_t helloBy = std::min<uint64_t>(deadlineNs, nowNs() + helloWaitNs(options.timeoutNs));
    const uint64_t id = endpoint->recvAsync(a.connId, helloInMr, helloIn.data(), kHelloBytes);
    std::vector<size_t> got;
    while (!endpoint->poll(id, &got)) {
      if (nowNs() >= helloBy) {
        endpoint->close(a.connId);  // fails the receive; waiting for it forgets it
        try {
          endpoint->wait(id);
        } catch (const Error&) {
          // the close above
        }
        throw Error(ErrorCode::kTimeout, "it sent no hello before the deadline");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    why = got.size() == 1 && got[0] == kHelloBytes
              ? decodeChannelHello(helloIn.data(), &h)
              : "its first message has " + std::to_string(got.empty() ? 0 : got[0]) + " bytes, a hello " +
                    std::to_string(kHelloBytes);
  } catch (const Error& e) {
    why = e.message();
  }
  auto it = pending.find(h.session);
  if (why.empty() && it != pending.end() && it->second.conns.size() != h.channels)
    why = "its session has " + std::to_string(it->second.conns.size()) + " channels, this hello says " +
          std::to_string(h.channels);
  if (why.empty() && it != pending.end() && it->second.chunkBytes != h.chunkBytes)
    why = "its session cuts " + std::to_string(it->second.chunkBytes) + "-byte pieces, this hello says " +
          std::to_string(h.chunkBytes);
  if (why.empty() && it != pending.end() && it->second.conns[h.channel] != 0)
    why = "channel " + std::to_string(h.channel) + " of its session arrived twice";
  if (!why.empty()) {
    GDX_WARN(who() << ": " << op << ": refused " << from << ": " << why);
    try {
      endpoint->close(a.connId);
    } catch (const Error&) {
      // released already
    }
    return true;
  }
  PendingClient& g = pending[h.session];
  if (g.conns.empty()) {
    g.conns.assign(h.channels, 0);
    g.chunkBytes = h.chunkBytes;
    g.address = a.ip;
    g.firstNs = nowNs();
  }
  g.conns[h.channel] = a.connId;
  ++g.arrived;
  return true;
}

// ---- TcpxSession ----------------------------------------------------------------------------------------------

TcpxSession::TcpxSession(int gpu, int numChannels) : TcpxSession(TcpxSessionOptions::fromEnv(gpu, numChannels)) {}

TcpxSession::TcpxSession(const TcpxSessionOptions& options) : impl_(std::make_shared<Impl>(options)) {}

TcpxSession::~TcpxSession() {
  // Without transfers left, the endpoint goes with impl_ and closes the connections itself, quietly. Transfers that
  // outlive the session keep the endpoint: their peers are closed here, so that they fail instead of waiting.
  if (impl_.use_count() == 1) return;
  std::map<std::string, std::shared_ptr<TcpxPeer>> peers;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    peers.swap(impl_->peers);
  }
  for (auto& p : peers) {
    try {
      impl_->closePeer(*p.second, "the session was destroyed");
    } catch (const std::exception& e) {
      GDX_WARN(impl_->who() << ": closing peer " << quoted(p.first) << ": " << e.what());
    }
  }
}

int TcpxSession::numChannels() const {
  return impl_->options.channels;
}

int TcpxSession::gpuId() const {
  return impl_->options.gpu;
}

std::string TcpxSession::listen() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->listening) impl_->endpoint->startPassiveAccept();
  impl_->listening = true;
  return std::string(kInfoTag) + " " + impl_->endpoint->ip() + " " + std::to_string(impl_->endpoint->port()) + " " +
         std::to_string(impl_->options.gpu);
}

void TcpxSession::accept(const std::string& remoteName) {
  Impl& d = *impl_;
  const std::string op = "accept(" + quoted(remoteName) + ")";
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.peers.count(remoteName))
      throw Error(ErrorCode::kInvalidArgument, d.who() + ": " + op + ": a peer of that name exists already");
    if (!d.listening) d.endpoint->startPassiveAccept();
    d.listening = true;
  }
  std::lock_guard<std::mutex> accepting(d.acceptMutex);
  const uint64_t deadline = nowNs() + d.options.timeoutNs;
  for (;;) {
    for (auto it = d.pending.begin(); it != d.pending.end();) {  // a client that died while connecting holds nothing
      if (it->second.arrived < it->second.conns.size() && nowNs() - it->second.firstNs > d.options.timeoutNs) {
        GDX_WARN(d.who() << ": " << op << ": let go of " << it->second.arrived << " of " << it->second.conns.size()
                         << " channels from " << it->second.address
                         << ": the others did not come within GDX_TIMEOUT_MS");
        for (uint64_t c : it->second.conns) {
          if (c == 0) continue;
          try {
            d.endpoint->close(c);
          } catch (const Error&) {
            // released already
          }
        }
        it = d.pending.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = d.pending.begin(); it != d.pending.end(); ++it) {
      if (it->second.arrived < it->second.conns.size()) continue;
      auto p = std::make_shared<TcpxPeer>();
      p->name = remoteName;
      p->address = it->second.address;
      p->conns = it->second.conns;
      p->chunkBytes = it->second.chunkBytes;
      d.pending.erase(it);
      d.addPeer(p, op, "from");
      return;
    }
    if (!d.takeConnection(deadline, op)) break;
  }
  std::string seen;
  for (const auto& g : d.pending)
    seen += "; " + std::to_string(g.second.arrived) + " of " + std::to_string(g.second.conns.size()) +
            " channels of a session from " + g.second.address;
  throw Error(ErrorCode::kTimeout, d.who() + ": " + op + ": no session connected all its channels within " +
                                       "GDX_TIMEOUT_MS (" + std::to_string(d.options.timeoutNs / 1000000) + " ms)" +
                                       (seen.empty() ? std::string("; none connected") : seen));
}

void TcpxSession::loadRemoteConnInfo(const std::string& remoteName, const std::string& connInfo) {
  ConnInfo ci;
  const std::string bad = parseConnInfo(connInfo, &ci);
  if (!bad.empty())
    throw Error(ErrorCode::kInvalidArgument, impl_->who() + ": loadRemoteConnInfo(" + quoted(remoteName) + ", '" +
                                                 connInfo.substr(0, 200) +
                                                 "'): not connection info from TcpxSession::listen(): " + bad);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->remoteInfo[remoteName] = connInfo;
}

void TcpxSession::connect(const std::string& remoteName) {
  Impl& d = *impl_;
  const std::string op = "connect(" + quoted(remoteName) + ")";
  ConnInfo ci;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.remoteInfo.find(remoteName);
    if (it == d.remoteInfo.end())
      throw Error(ErrorCode::kInvalidArgument,
                  d.who() + ": " + op + ": no connection info under that name (loadRemoteConnInfo first)");
    if (d.peers.count(remoteName))
      throw Error(ErrorCode::kInvalidArgument, d.who() + ": " + op + ": a peer of that name exists already");
    parseConnInfo(it->second, &ci);
  }
  auto p = std::make_shared<TcpxPeer>();
  p->name = remoteName;
  p->address = ci.ip + ":" + std::to_string(ci.port);
  p->chunkBytes = d.options.chunkBytes;
  for (int c = 0; c < d.options.channels; ++c) {
    try {
      p->conns.push_back(d.endpoint->connect(ci.ip, ci.gpu, ci.port));
    } catch (const Error& e) {
      d.closePeer(*p, "connect failed");
      throw Error(e.code(), d.who() + ": " + op + ": channel " + std::to_string(c) + " of " +
                                std::to_string(d.options.channels) + " to " + p->address + ": " + e.message());
    }
  }
  try {
    d.sayHello(*p, randomU64());  // per connect(): two at once from one session group their own channels
  } catch (const Error& e) {
    d.closePeer(*p, "connect failed");
    throw Error(e.code(), d.who() + ": " + op + ": saying hello to " + p->address + ": " + e.message());
  }
  d.addPeer(p, op, "to");
}

void TcpxSession::disconnect(const std::string& remoteName) {
  auto p = impl_->peer(remoteName, "disconnect(" + quoted(remoteName) + ")");
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->peers.erase(remoteName);
  }
  impl_->closePeer(*p, "disconnect(" + quoted(remoteName) + ") on this side");
}

uint64_t TcpxSession::registerMemory(void* ptr, size_t size, int ptrType, bool isRecv) {
  Impl& d = *impl_;
  const std::string op = "registerMemory(" + hexPtr(ptr) + ", " + std::to_string(size) + ", ptrType " +
                         std::to_string(ptrType) + ", isRecv " + (isRecv ? "true" : "false") + ")";
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument, d.who() + ": " + op + ": " + why);
  };
  if (!ptr || size == 0) refuse(ptr ? "zero bytes" : "a null pointer");
  if (ptrType != kPtrHost && ptrType != kPtrCuda) refuse("ptrType is neither kPtrHost (1) nor kPtrCuda (2)");
  const MemoryKind kind = pointerKind(ptr);
#if defined(GDX_HAVE_CUDA)
  if (ptrType == kPtrCuda && kind != MemoryKind::kCuda) refuse("kPtrCuda, but the pointer is not GPU memory");
#else
  if (ptrType == kPtrCuda) refuse("kPtrCuda: gdx was built without CUDA");
#endif
  if (ptrType == kPtrHost && kind == MemoryKind::kCuda) refuse("kPtrHost, but the pointer is GPU memory (kPtrCuda)");
  TcpxMemory m;
  m.mrId = d.endpoint->reg(ptr, size);
  m.base = static_cast<char*>(ptr);
  m.size = size;
  m.ptrType = ptrType;
  m.isRecv = isRecv;
  std::lock_guard<std::mutex> lock(d.mutex);
  d.memories[m.mrId] = m;
  return m.mrId;
}

void TcpxSession::deregisterMemory(uint64_t memId) {
  const TcpxMemory m = impl_->memory(memId, "deregisterMemory(" + std::to_string(memId) + ")");
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->memories.erase(memId);
  }
  impl_->endpoint->dereg(m.mrId);
}

}  // namespace gdx::p2p
