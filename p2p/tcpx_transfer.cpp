// TcpxTransfer: posts cut into pieces and dealt over the peer's channels (tcpx_impl.hpp), each piece an asynchronous
// send or receive of the session's endpoint; wait() and isComplete() settle them and name the post of a failed one.
#include <algorithm>
#include <optional>

#include "base/log.hpp"
#include "gdx/error.hpp"
#include "p2p/tcpx_impl.hpp"

namespace gdx::p2p {

struct TcpxTransfer::Impl {
  /// One piece of a post: the endpoint transfer moving `size` bytes at `at` of the post, on `channel`.
  struct Piece {
    uint64_t id = 0;
    uint32_t channel = 0;
    uint64_t at = 0, size = 0;
    bool done = false;
  };
  struct Post {
    bool send = false;
    uint64_t memId = 0;
    uint64_t offset = 0, size = 0;
    std::vector<Piece> pieces;
  };

  std::shared_ptr<TcpxSession::Impl> session;
  std::shared_ptr<TcpxPeer> peer;
  std::vector<Post> posts;  ///< those not settled yet
  size_t completed = 0, total = 0;

  /// "TcpxSession ...: TcpxTransfer to 'server' (127.0.0.1:41234): postSend(mem_id 3, offset 0, size 4096)".
  std::string describe(bool send, uint64_t memId, uint64_t offset, uint64_t size) const {
    return session->who() + ": TcpxTransfer to '" + peer->name + "' (" + peer->address +
           "): " + (send ? "postSend" : "postRecv") + "(mem_id " + std::to_string(memId) + ", offset " +
           std::to_string(offset) + ", size " + std::to_string(size) + ")";
  }
  std::string describe(const Post& p, const Piece& c) const {
    return describe(p.send, p.memId, p.offset, p.size) + ": piece " + std::to_string(c.at / peer->chunkBytes + 1) +
           " of " + std::to_string((p.size + peer->chunkBytes - 1) / peer->chunkBytes) + " (bytes " +
           std::to_string(c.at) + ".." + std::to_string(c.at + c.size) + " on channel " + std::to_string(c.channel) +
           ")";
  }

  void post(bool send, uint64_t memId, uint64_t offset, uint64_t size);
  /// Waits for (`block`) or polls the connecting side's hellos and every piece not done; throws the first failure
  /// once every piece has finished or failed. Drops settled posts; true when none is left.
  bool settle(bool block);
  void settleHellos(bool block);
};

void TcpxTransfer::Impl::post(bool send, uint64_t memId, uint64_t offset, uint64_t size) {
  const std::string what = describe(send, memId, offset, size);
  auto refuse = [&](ErrorCode code, const std::string& why) { throw Error(code, what + ": " + why); };
  if (size == 0) refuse(ErrorCode::kInvalidArgument, "zero bytes");
  std::optional<TcpxMemory> m;
  try {
    m = session->memory(memId, send ? "postSend" : "postRecv");
  } catch (const Error& e) {
    refuse(e.code(), "mem_id " + std::to_string(memId) + " is not registered with this session");
  }
  if (m->isRecv == send)
    refuse(ErrorCode::kInvalidArgument,
           "mem_id " + std::to_string(memId) + " was registered with isRecv " + (m->isRecv ? "true" : "false") +
               (send ? " (receive memory); postSend needs memory registered with isRecv false"
                     : " (send memory); postRecv needs memory registered with isRecv true"));
  if (offset > m->size || size > m->size - offset)
    refuse(ErrorCode::kInvalidArgument, "[offset, offset + size) lies past the end of mem_id " + std::to_string(memId) +
                                            " (" + std::to_string(m->size) + " bytes)");
  Endpoint& ep = *session->endpoint;
  std::lock_guard<std::mutex> lock(peer->mutex);
  if (!peer->closed.empty()) refuse(ErrorCode::kShutdown, "the peer is closed: " + peer->closed);
  uint64_t& seq = send ? peer->sent : peer->received;
  posts.push_back(Post{send, memId, offset, size, {}});
  Post& p = posts.back();
  const uint64_t channels = peer->conns.size();
  for (uint64_t at = 0; at < size; at += peer->chunkBytes) {
    Piece c;
    c.channel = static_cast<uint32_t>(seq % channels);
    c.at = at;
    c.size = std::min<uint64_t>(peer->chunkBytes, size - at);
    char* ptr = m->base + offset + at;
    try {
      c.id = send ? ep.sendAsync(peer->conns[c.channel], m->mrId, ptr, c.size)
                  : ep.recvAsync(peer->conns[c.channel], m->mrId, ptr, c.size);
    } catch (const Error& e) {
      // The pieces posted before it stay in `posts`: wait() settles them.
      if (p.pieces.empty()) posts.pop_back();
      throw Error(e.code(), describe(p, c) + ": " + e.message());
    }
    ++seq;
    ++total;
    p.pieces.push_back(c);
  }
}

void TcpxTransfer::Impl::settleHellos(bool block) {
  std::lock_guard<std::mutex> lock(peer->mutex);
  for (size_t c = 0; c < peer->hellos.size(); ++c) {
    uint64_t& id = peer->hellos[c];
    if (id == 0) continue;
    try {
      if (block) {
        session->endpoint->wait(id);
        id = 0;
      } else if (session->endpoint->poll(id)) {
        id = 0;
      }
    } catch (const Error& e) {
      id = 0;
      throw Error(e.code(), session->who() + ": TcpxTransfer to '" + peer->name + "' (" + peer->address +
                                "): channel " + std::to_string(c) + "'s hello: " + e.message());
    }
  }
}

bool TcpxTransfer::Impl::settle(bool block) {
  std::optional<Error> first;
  try {
    settleHellos(block);
  } catch (const Error& e) {
    first = e;
  }
  Endpoint& ep = *session->endpoint;
  for (Post& p : posts) {
    for (Piece& c : p.pieces) {
      if (c.done) continue;
      try {
        std::vector<size_t> received;
        if (block) {
          ep.wait(c.id, &received);
          c.done = true;
        } else {
          c.done = ep.poll(c.id, &received);
        }
        // An endpoint receive takes any message up to its size; a transfer pairs pieces of equal sizes (a shorter
        // one means the two sides posted different sizes, and the pieces after it would pair wrongly).
        if (c.done && !p.send && (received.size() != 1 || received[0] != c.size))
          throw Error(ErrorCode::kInvalidArgument,
                      "the peer sent " + (received.empty() ? std::string("?") : std::to_string(received[0])) +
                          " bytes for this piece of " + std::to_string(c.size) +
                          " (postSend and postRecv must post the same sizes)");
      } catch (const Error& e) {
        c.done = true;
        if (!first) first = Error(e.code(), describe(p, c) + ": " + e.message());
      }
      if (c.done) ++completed;
    }
  }
  posts.erase(std::remove_if(posts.begin(), posts.end(),
                             [](const Post& p) {
                               return std::all_of(p.pieces.begin(), p.pieces.end(),
                                                  [](const Piece& c) { return c.done; });
                             }),
              posts.end());
  if (first) throw *first;
  return posts.empty();
}

// ---- TcpxTransfer ---------------------------------------------------------------------------------------------

TcpxTransfer* TcpxSession::createTransfer(const std::string& remoteName) {
  auto impl = std::make_unique<TcpxTransfer::Impl>();
  impl->session = impl_;
  impl->peer = impl_->peer(remoteName, "createTransfer('" + remoteName + "')");
  return new TcpxTransfer(std::move(impl));
}

TcpxTransfer::TcpxTransfer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpxTransfer::~TcpxTransfer() {
  try {
    impl_->settle(true);
  } catch (const std::exception& e) {
    GDX_WARN("~TcpxTransfer: " << e.what());
  }
}

void TcpxTransfer::postSend(uint64_t memId, size_t offset, size_t size) {
  impl_->post(true, memId, offset, size);
}

void TcpxTransfer::postRecv(uint64_t memId, size_t offset, size_t size) {
  impl_->post(false, memId, offset, size);
}

bool TcpxTransfer::isComplete() {
  return impl_->settle(false);
}

void TcpxTransfer::wait() {
  impl_->settle(true);
}

void TcpxTransfer::release() {
  impl_->settle(true);
  impl_->completed = impl_->total = 0;
}

size_t TcpxTransfer::completedChunks() const {
  return impl_->completed;
}

size_t TcpxTransfer::totalChunks() const {
  return impl_->total;
}

}  // namespace gdx::p2p
