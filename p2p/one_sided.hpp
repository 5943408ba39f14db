// One-sided writes and reads on one connection, both ways. This side's: a write goes to windows of the peer whose keys
// it learned (WindowKeys: asked for on first use) and completes once a fence posted after it is acknowledged
// (kFence, kFenceAck), i.e. once its data is in place at the peer; a read grants exactly its destination range and
// asks the peer to write the source there (kReadRequest), and completes with the peer's kReadDone, which comes after
// the data. The peer's: a fence is acknowledged, a read request is answered by writing the range back from a window
// this side advertised (or the resolver gives), then kReadDone, or kReadDone naming why it was refused.
//
// Its methods do not post: they return actions (post this message, post this write, wait for that key) that the
// connection carries out in order; transfers they finish or fail directly. Only the thread running the connection
// uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gdx/error.hpp"
#include "p2p/local_windows.hpp"
#include "p2p/protocol.hpp"
#include "p2p/transfer.hpp"
#include "p2p/window_keys.hpp"
#include "transport/transport.hpp"

namespace gdx::p2p {

/// Immediates with this bit are notified writes (waitForWrite); the others are two-sided (TwoSided: kEagerImm, or a
/// send's number).
constexpr uint32_t kNotifyImm = 0x80000000u;

class OneSided {
 public:
  /// A write until it is posted (it may wait for the keys of its destination windows).
  struct PendingWrite {
    std::shared_ptr<Transfer> t;
    std::vector<Piece> src;
    std::vector<RemotePiece> dst;
    bool notify = false;
  };

  /// What the connection is to do next, in the order the actions were returned. A write that cannot be posted ends
  /// what its call returned: the connection drops the actions after it and carries out notPosted()'s instead.
  struct Action {
    enum class Kind {
      kPost,      ///< send `msg` to the peer
      kWrite,     ///< post `write`, which reads `region` (registered first); for `t` (none: a read's answer)
      kAwaitKey,  ///< write(`pending`) again once the key of the peer's `window` is known (asked for with `secret`)
    };
    Kind kind = Kind::kPost;
    ControlMsg msg;
    WriteOp write;
    MemoryRegion region;
    std::shared_ptr<Transfer> t;
    std::shared_ptr<PendingWrite> pending;
    uint32_t window = 0;
    uint64_t secret = 0;
    uint64_t readId = 0;  ///< kWrite answering the peer's read `readId`
  };
  using Actions = std::vector<Action>;

  /// `windows` and `keys` are the connection's; writes go to `peer`; `name` (the connection's, which outlives this)
  /// starts what it logs.
  OneSided(LocalWindows& windows, WindowKeys& keys, int peer, const std::string& name);
  OneSided(const OneSided&) = delete;
  OneSided& operator=(const OneSided&) = delete;

  /// Posts write `w` (its transfer counts one part per piece and one for the fence) once the keys of its
  /// destination windows are known, or fails its transfer by name.
  void write(const std::shared_ptr<PendingWrite>& w, Actions& out);
  /// Asks the peer to write `src` into `dst` (one part of `t` each), granting exactly each destination range.
  void read(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& dst, const std::vector<RemotePiece>& src,
            Actions& out);
  /// The write of action `write` could not be posted (`e`; `registered`: its source was, and the transport refused
  /// it): its transfer fails by name, or the peer's read is answered as failed.
  void notPosted(const Action& write, const Error& e, bool registered, Actions& out);
  /// A write this object posted completed; `failure` is the connection's ("" while healthy).
  void onWriteDone(const Completion& c, const std::string& failure);

  /// A one-sided message from the peer (kFence, kFenceAck, kReadRequest, kReadDone).
  void onMessage(const ControlMsg& m, Actions& out);
  /// The connection failed: its transfers are failed by it, this object lets go of them.
  void clear();

 private:
  static void post(Actions& out, const ControlMsg& m);
  void onReadRequest(const ControlMsg& m, Actions& out);
  void onReadDone(const ControlMsg& m);

  LocalWindows& windows_;
  WindowKeys& keys_;
  const int peer_;
  const std::string& name_;

  uint64_t nextId_ = 1;                                             ///< cookies of writes, numbers of fences and reads
  std::unordered_map<uint64_t, std::shared_ptr<Transfer>> writes_;  ///< posted writes by cookie
  std::unordered_map<uint64_t, std::shared_ptr<Transfer>> fences_, reads_;
};

}  // namespace gdx::p2p
