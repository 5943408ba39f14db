// TCP transport: refusals. The side that refuses what a peer sent (a malformed header, a window it may not write,
// a range outside it) tells the peer why on every connection to it before it closes them, so that the peer fails
// with the reason instead of "connection closed without goodbye"; a receiver that reads a refusal fails its peer with
// it. Bounded: a socket its sender does not give up within kRefusalWaitNs, or that does not take the refusal within
// as long, gets none.
#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace gdx::tcp {
namespace {

constexpr uint64_t kRefusalWaitNs = 200ull * 1000 * 1000;

}  // namespace

void TcpTransport::refusePeer(int peer, const std::string& why) {
  const std::string reason = why.substr(0, kMaxRefusalBytes);
  if (connected_ && peerState_[peer].load() == kPeerOk) {
    for (int l = 0; l < numLanes_; ++l) {
      for (int i = 0; i < sockets_; ++i) {
        TxSocket& s = txSocket(l, peer, i);
        {
          std::unique_lock<std::mutex> lock(s.mutex);
          const uint64_t until = nowNs() + kRefusalWaitNs;
          while (s.sending && nowNs() < until) s.cv.wait_for(lock, std::chrono::milliseconds(2));
          if (s.sending || s.broken || !s.fd.valid()) continue;
          s.sending = true;  // as an inline poster: the sender thread waits until it is given back
        }
        MessageHeader h;
        h.type = static_cast<uint8_t>(MessageType::kRefusal);
        h.lane = static_cast<uint32_t>(l);
        h.bytes = reason.size();
        h.chunkBytes = static_cast<uint32_t>(reason.size());
        iovec iov[2] = {{&h, sizeof h}, {const_cast<char*>(reason.data()), reason.size()}};
        net::IoLimits limits;
        limits.stallNs = kRefusalWaitNs;
        const net::IoStatus io = net::sendFull(s.fd.get(), iov, 2, limits);
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!io.ok()) s.broken = true;
        s.sending = false;
        s.cv.notify_all();
      }
    }
  }
  failPeer(peer, why);
}

void TcpTransport::failPeerAfterRefusalGrace(int peer, const std::string& why) {
  for (const uint64_t until = nowNs() + kRefusalWaitNs; peerState_[peer].load() == kPeerOk && nowNs() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  failPeer(peer, why);
}

}  // namespace gdx::tcp
