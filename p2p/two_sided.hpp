// Sends and receives on one connection: the numbering that pairs them, the eager buffer's slots and credits, the
// rendezvous of large sends, and what a failure on either side does to the other. Its methods do not post or fail
// the connection themselves: they return actions (post this message, post this write, wait for that key, fail the
// connection) that the connection carries out in order; transfers they finish or fail directly.
//
// The receiver numbers its receives in the order they were posted and tells the sender where each may land
// (kClearToSend: exactly the receive's buffer, granted as a window of its own, after the window's key); the sender
// numbers its sends the same way and writes the n-th send into the n-th receive with a write-with-immediate carrying
// n, which completes the receive once its data is in place. A message may be smaller than its receive's buffer: the
// sender writes only its own bytes at the start of the buffer, the rest stays untouched, and the receive reports the
// size (a large send announced it, kRequestToSend, before its write; an eager one's is its write's). A message larger
// than the buffer fails both sides by name, naming both sizes, and writes nothing (kSendRefused); the pairing of
// later sends and receives is kept. In a vector, buffer i takes the i-th message of the peer's sends (each piece of a
// sendv is one message), each checked on its own.
// Sends of at most kEagerBytes do not wait for a clear-to-send, and their receives send none: they are written at
// once into the receiver's eager buffer (a slot per credit, protocol.hpp), which the receive copies from, whether it
// was posted before the data arrived or after. The freed slot goes back as a credit, which also confirms the send
// (its receive took it whole): in the immediate of the receiver's next eager write (a reply), with its next receive
// posted, else on its own after kCreditDelayNs; such a send completes once its write completed and its credit came
// back. A message too large for its buffer fails both sides by name: the receive that finds it says so
// (kReceiveRefused), a large send announces itself (kRequestToSend) so that a small receive can. Sends leave in their
// numbered order either way (an eager send waits behind an earlier one that waits for its clear-to-send), so every
// message arrives in order.
// A receive that failed (it timed out, a buffer of its vector was refused, its memory was deregistered) takes nothing
// more: its other buffers are withdrawn, the sender is told (kReceiveFailed) and fails the sends for them by name,
// and eager data still on its way is dropped. A large send's write is stopped only if the notice reaches the sender
// before it posted the write: one already on its way still lands in the receive's buffer (the sender fails by name
// too, unless its write completed before the notice came), unless the region was deregistered first, in which case
// the transport refuses it and the connection fails.
// A send that failed on this side (its deadline passed, its memory was deregistered, another buffer of its vector
// failed) is withdrawn (send_withdrawal.cpp): no receive takes it, a receive posted for it fails by name, and the
// receives posted after it pair with the sends posted after it. If a receive took its data before the withdrawal
// arrived, the connection fails on both sides, saying so: a failed send is never delivered unnoticed.
//
// Only the thread running the connection uses it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gdx/error.hpp"
#include "p2p/local_windows.hpp"
#include "p2p/protocol.hpp"
#include "p2p/transfer.hpp"
#include "p2p/window_keys.hpp"
#include "transport/transport.hpp"

namespace gdx::p2p {

/// Immediates of eager sends (written into the eager buffer) carry this bit beside the low bits of the send's number
/// and the credits the writer returns.
constexpr uint32_t kEagerImm = 0x40000000u;
/// The bits of a send's number the immediate of a write into the receive's own buffer carries; receives are kept by
/// the same bits of their number.
constexpr uint32_t kSeqMask = 0x3fffffffu;
/// An eager write's immediate: kEagerImm, the credits this side returns (bits 16..29), the send's number's low bits.
constexpr uint32_t kEagerSeqBits = 0xffffu;
constexpr int kEagerCreditShift = 16;
constexpr uint32_t kEagerCreditMask = 0x3fffu;
static_assert(kEagerSlots <= kEagerCreditMask, "an eager immediate carries up to a buffer's worth of credits");

/// Why a send failed whose receive's buffer has `bufferBytes`, fewer than its own, after "send #n of b bytes".
inline std::string bufferTooSmall(uint64_t bufferBytes) {
  return ": the receive the peer posted for it has a buffer of " + std::to_string(bufferBytes) +
         " bytes, smaller than this send";
}

/// Why a send failed whose receive failed with `code` (kReceiveFailed), after "send #n of b bytes".
inline std::string receiveFailed(ErrorCode code) {
  return std::string(": the receive the peer posted for it ended in error (") + errorCodeName(code) +
         ") and takes no data";
}

class TwoSided {
 public:
  /// What the connection is to do next, in the order the actions were returned.
  struct Action {
    enum class Kind {
      kPost,   ///< send `msg` to the peer
      kTell,   ///< send `msg` to the peer, best effort: a transport that cannot carry it is logged, naming `why`
      kWrite,  ///< post `write`, which reads `region` (registered first): send `seq`'s data; notPosted() if it throws
      /// trySends() once the key of the peer's eager buffer is known (asked for), or fail `t` if refused; `t` waits
      /// for `why` meanwhile
      kAwaitKey,
      kFail,  ///< the connection fails with `code` and `why` (this object forgot its transfers already)
    };
    Kind kind = Kind::kPost;
    ControlMsg msg;
    WriteOp write;
    MemoryRegion region;
    std::shared_ptr<Transfer> t;
    uint64_t seq = 0;
    ErrorCode code = ErrorCode::kOk;
    std::string why;
  };
  using Actions = std::vector<Action>;

  /// Credits owed for longer than this are reported on their own (kCredit) by the next round of the connection: a
  /// reply within it carries them in its immediate instead. Rounds run at least every millisecond (progress thread).
  static constexpr uint64_t kCreditDelayNs = 100 * 1000;

  /// `windows` and `keys` are the connection's; writes go to `peer`; `name` (the connection's, which outlives this)
  /// starts what it logs.
  TwoSided(LocalWindows& windows, WindowKeys& keys, int peer, const std::string& name);
  TwoSided(const TwoSided&) = delete;
  TwoSided& operator=(const TwoSided&) = delete;

  /// Cookies of the writes this object posts carry this bit (the connection's own never do).
  static bool owns(uint64_t cookie) { return (cookie & kCookieBit) != 0; }

  // The sender's side (two_sided_sends.cpp).
  /// Numbers the pieces as sends (one part of `t` each) and lets go those that can leave now.
  void send(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces, Actions& out);
  /// Lets the queued sends leave in order while they can: stops after each write it returns (moreToSend()), so that
  /// the write is posted, or notPosted(), before the next send's slot is counted.
  void trySends(Actions& out);
  /// true when trySends() stopped after a write and has more to look at.
  bool moreToSend() const { return moreToSend_; }
  /// The write of action `write` could not be posted (`e`): its send fails by name and is withdrawn. `registered`: its
  /// source was registered and the transport refused the post (a large send's write stays listed then, as one that
  /// may have left, marked withdrawn: a second withdrawal would reach a peer whose receive already failed by the
  /// first, and it would close the connection as one withdrawn too late).
  void notPosted(const Action& write, const Error& e, bool registered, Actions& out);
  /// A write this object posted completed (a cookie it owns); `failure` is the connection's ("" while healthy).
  void onWriteDone(const Completion& c, const std::string& failure);

  // The receiver's side (two_sided_receives.cpp).
  /// Numbers the pieces as receives (one part of `t` each), takes eager data already here, and tells the sender
  /// where large sends may land.
  void recv(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces, Actions& out);
  /// An eager write arrived (its immediate has kEagerImm) with `bytes` of data.
  void onEagerData(uint32_t imm, uint64_t bytes, Actions& out);
  /// A large send's write arrived in its receive's buffer (`imm`: the low bits of its number).
  void onWriteArrived(uint32_t imm, Actions& out);
  /// true when freed eager slots were not reported yet.
  bool owesCredits() const { return creditsFreed_ > 0; }
  /// true when credits are owed for kCreditDelayNs by `now`.
  bool creditsOverdue(uint64_t now) const { return creditsFreed_ > 0 && now - creditsOwedSinceNs_ >= kCreditDelayNs; }
  /// Reports owed credits on their own (kCredit), if any.
  void flushCredits(Actions& out);

  /// A two-sided message from the peer (kClearToSend, kCredit, kRequestToSend, kReceiveRefused, kReceiveFailed,
  /// kSendWithdrawn, kWithdrawTooLate, kSendRefused).
  void onMessage(const ControlMsg& m, Actions& out);
  /// After transfers failed on this side (their deadline passed): the receives among them take nothing that still
  /// comes, and no receive of the peer takes the sends among them.
  void abandonFailed(Actions& out);
  /// The connection failed: its transfers are failed by it, this object lets go of them.
  void clear();

 private:
  static constexpr uint64_t kCookieBit = uint64_t{1} << 63;

  struct PendingSend {
    uint64_t seq;
    std::shared_ptr<Transfer> t;
    Piece piece;
  };
  struct PendingRecv {
    std::shared_ptr<Transfer> t;
    uint64_t bytes;  ///< the buffer's size: the largest message it takes
    uint64_t seq;
    Piece piece;        ///< where an eager send's data is copied to
    size_t index = 0;   ///< which buffer of its transfer it is (Transfer::finishPart(index, size))
    uint64_t sent = 0;  ///< a large send's size, as it announced itself (kRequestToSend); 0 until then
  };
  /// Eager data that arrived before its receive was posted: which slot of the eager buffer holds it.
  struct EarlyData {
    uint32_t slot;
    uint64_t bytes;
  };
  /// An eager send in flight: done once its write completed and its credit came back (its receive took it whole).
  struct EagerSend {
    std::shared_ptr<Transfer> t;
    uint64_t bytes;
    bool written = false;
    bool matched = false;
  };
  /// A large send's posted write, by its cookie.
  struct PostedSend {
    std::shared_ptr<Transfer> t;
    uint64_t seq;
    bool withdrawn = false;  ///< notPosted() told the peer already: withdrawFailedSends() must not tell it again
  };

  /// Erases the entries of `items` (a map to a struct with a transfer `t`) whose transfer failed, adding their
  /// numbers (`seqOf` an entry) and how they failed to `failed`.
  template <typename Map, typename SeqOf>
  static void takeFailed(Map& items, SeqOf seqOf, std::vector<std::pair<uint64_t, ErrorCode>>& failed) {
    for (auto it = items.begin(); it != items.end();) {
      const ErrorCode code = it->second.t->failureCode();
      if (code == ErrorCode::kOk) {
        ++it;
        continue;
      }
      failed.emplace_back(seqOf(*it), code);
      it = items.erase(it);
    }
  }
  static void post(Actions& out, const ControlMsg& m);
  /// Tells the peer, best effort, that transfer `seq` ended by `code` (kOk counts as kInternal): a kReceiveFailed or
  /// kSendWithdrawn; a transport that cannot carry it is logged, naming `what`.
  static void tell(Actions& out, MsgType type, uint64_t seq, ErrorCode code, const std::string& what);
  /// The connection fails: this object forgets its transfers at once (so that none is delivered after this), and the
  /// connection fails them all when it carries out the action.
  void fail(Actions& out, ErrorCode code, const std::string& why);
  /// A write of `piece` to the peer's `window` at `offset`, with immediate `imm`, for send `seq` of `t`.
  Action write(const std::shared_ptr<Transfer>& t, uint64_t seq, const Piece& piece, uint32_t window, uint64_t offset,
               uint32_t imm);

  // The sender's side (two_sided_sends.cpp).
  /// Lets the eager send at the head of sends_ go into the next slot of the peer's eager buffer; false when it must
  /// wait (no credit, or the key of the peer's eager buffer has not arrived).
  bool postEager(const PendingSend& s, Actions& out);
  /// kClearToSend or kCredit: credits come back, a clear-to-send says where a send may land.
  void onClearToSend(const ControlMsg& m, Actions& out);
  /// A clear-to-send naming an eager send: its receive is a large one, which takes it (the slot's credit confirms it).
  void matchEager(const ControlMsg& cts);
  /// The peer returned `n` credits: as many more eager sends may leave, and the oldest `n` in flight are confirmed.
  void onCredits(uint32_t n, Actions& out);
  /// The peer's receive for send `m.id` failed: the send fails by name wherever it is, or when it is posted.
  void onReceiveFailed(const ControlMsg& m, Actions& out);
  /// Fails send `seq` with `code` and "send #seq of N bytes" + `why` if it left eagerly or still waits in sends_;
  /// false if it is neither.
  bool failUnsentSend(uint64_t seq, ErrorCode code, const std::string& why, Actions& out);

  // The receiver's side (two_sided_receives.cpp).
  /// Eager data of `bytes` in `slot` for receive `r`: copied into the start of its buffer, or the receive fails when
  /// the buffer is smaller; the slot is free again either way.
  void takeEager(const PendingRecv& r, uint32_t slot, uint64_t bytes, Actions& out);
  /// Credits freed since the last report, for a clear-to-send or an eager write (resets the count).
  uint32_t takeCredits();
  /// An eager slot was emptied: its credit goes back with the next eager write, receive or on its own.
  void freeEagerSlot(Actions& out);
  /// A send larger than kEagerBytes announced itself: a small receive for it fails (and tells the sender).
  void onRequestToSend(const ControlMsg& m, Actions& out);
  /// The peer refused a large receive's send as larger than its buffer (kSendRefused): the receive fails.
  void onSendRefused(const ControlMsg& m, Actions& out);
  /// "receive #seq: the peer's send is N bytes, larger than this receive's buffer of M bytes (nothing was written)".
  static std::string tooLarge(uint64_t seq, uint64_t sendBytes, uint64_t bufferBytes);
  /// Fails receive `r`, whose send of `sendBytes` is larger than its buffer, and tells the sender (kReceiveRefused).
  void refuseSend(const PendingRecv& r, uint64_t sendBytes, Actions& out);
  /// Receive `seq`, a buffer of a receive that failed with `code`, takes nothing: the sender is told
  /// (kReceiveFailed), its eager data is dropped if it is here, and whatever still comes for it will be.
  void abandonRecv(uint64_t seq, ErrorCode code, Actions& out);
  /// Tells the sender that receive `seq` failed with `code` (kReceiveFailed).
  void tellReceiveFailed(uint64_t seq, ErrorCode code, Actions& out);
  /// Withdraws every posted buffer of receives that failed (abandonRecv), after any failure of a receive.
  void abandonFailedRecvs(Actions& out);
  /// Send `seq` arrived (its eager data or its write's immediate): true if its receive had failed (it is forgotten
  /// then, and so are failed receives before it, whose sends will never come).
  bool arrivedForFailedRecv(uint64_t seq);

  // Withdrawn sends (send_withdrawal.cpp).
  /// Tells the peer about every send that failed on this side and is still queued, in flight or unconfirmed
  /// (kSendWithdrawn), and forgets it.
  void withdrawFailedSends(Actions& out);
  void withdrawSend(uint64_t seq, ErrorCode code, Actions& out);
  /// The sender was told that receive `seq` failed (a withdrawal of its send crossing the notice is no news).
  void noteReceiveFailedTold(uint64_t seq);
  /// The number of the next receive buffer posted, past those of sends the peer withdrew.
  uint64_t takeRecvSeq();
  void onSendWithdrawn(const ControlMsg& m, Actions& out);
  void onWithdrawTooLate(const ControlMsg& m, Actions& out);

  LocalWindows& windows_;
  WindowKeys& keys_;
  const int peer_;
  const std::string& name_;

  uint64_t nextSendSeq_ = 0, nextRecvSeq_ = 0;
  uint64_t nextCookie_ = kCookieBit | 1;
  bool moreToSend_ = false;
  std::deque<PendingSend> sends_;
  std::map<uint64_t, ControlMsg> cts_;               ///< clear-to-send by send number
  std::unordered_map<uint32_t, PendingRecv> recvs_;  ///< by the low 31 bits of the receive's number
  std::unordered_map<uint64_t, PostedSend> writes_;  ///< large sends' posted writes by cookie
  // Eager sends, sender side: credits (free slots of the peer's buffer), slots used so far, sends awaiting their
  // clear-to-send, and their writes by cookie.
  uint32_t eagerCredits_ = kEagerSlots;
  uint64_t eagerSent_ = 0;
  bool eagerKeyAsked_ = false;
  std::map<uint64_t, EagerSend> eagerSends_;
  std::deque<uint64_t> eagerOrder_;  ///< numbers of eager sends not yet confirmed, in the order they left
  std::unordered_map<uint64_t, uint64_t> eagerCookies_;
  // Receiver side: slots filled so far (they fill in order), data waiting for its receive, credits to report.
  uint64_t eagerArrived_ = 0;
  std::unordered_map<uint32_t, EarlyData> early_;
  uint32_t creditsFreed_ = 0;
  uint64_t creditsOwedSinceNs_ = 0;
  uint64_t nextArrival_ = 0;                    ///< the number after the last send whose data arrived
  std::unordered_map<uint32_t, uint64_t> rts_;  ///< sizes of large sends announced before their receive
  /// Receives that failed before their send arrived (low bits of the number -> the number): what comes for them is
  /// dropped. Forgotten when that send or a later one arrives.
  std::unordered_map<uint32_t, uint64_t> failedRecvs_;
  /// Sender side: sends not yet posted whose receive the peer said failed (kReceiveFailed), by number.
  std::map<uint64_t, ErrorCode> failedAhead_;
  /// Receiver side: numbers of withdrawn sends that no receive was posted for yet (the next receives skip them), and
  /// of receives the sender was told failed (the last few thousand).
  std::set<uint64_t> voided_, toldFailed_;
};

}  // namespace gdx::p2p
