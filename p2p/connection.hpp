// One connection between two endpoints: a PairLink's transport plus the protocol that turns its one-sided writes,
// immediates and control messages (protocol.hpp) into sends, receives, writes and reads.
//
// Two-sided: sends and receives, paired by their numbers, small ones through the eager buffer, large ones written in
// place after a clear-to-send (TwoSided, two_sided.hpp, which says what a failure on either side does).
// One-sided: advertise() registers exactly the advertised range as a window of its own, so the peer's transport
// refuses anything outside it (LocalWindows); writes and reads against the peer's windows, and the answers to the
// peer's, are OneSided's (one_sided.hpp); the keys of both sides' windows, WindowKeys' (window_keys.hpp).
// Connection drives them: it owns the transport and the threads, decodes what arrives, routes it to them and carries
// out the actions they return.
//
// Threads: callers queue operations; whichever thread holds the connection's progress lock runs them, owns the
// transport lane, handles what arrives and fails transfers whose deadline passed. That is the calling thread itself
// when nobody else holds it (an operation is posted to the transport without a hand-off), a caller waiting for one
// of its transfers (drive(): it polls, then sleeps until the transport's handlers wake it), or else the endpoint's
// progress thread. Handlers of the transport only queue what they get and wake whoever drives the connection.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "gdx/types.hpp"
#include "p2p/local_windows.hpp"
#include "p2p/one_sided.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/protocol.hpp"
#include "p2p/transfer.hpp"
#include "p2p/two_sided.hpp"
#include "p2p/window_keys.hpp"

namespace gdx::p2p {

class Connection {
 public:
  /// How long a progress thread polls after the last sign of activity before it sleeps: about the round trip of a
  /// small message over loopback TCP, so that a reply or a completion is caught without a wake-up, and short enough
  /// not to burn a core. A blocking call's drive() polls longer (connection.cpp, kDriveSpinNs).
  static constexpr uint64_t kSpinNs = 50 * 1000;

  /// `wake` is called (from any thread) when the progress thread has something to do.
  Connection(uint64_t id, PairLink link, uint64_t timeoutNs, std::function<void()> wake);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Connects the transport (collective with the peer, bounded by the timeout). Call once, before anything else.
  void start();

  uint64_t id() const { return id_; }
  /// "connection 3 (peer 10.0.0.2:41234, GPU 1, tcp, 4 sockets, 1048576-byte chunks)", the start of its errors.
  const std::string& name() const { return name_; }
  /// The same, shared with the transfers that name it in their errors (TransferName).
  const std::shared_ptr<const std::string>& sharedName() const { return sharedName_; }
  uint64_t token() const { return link_.token; }
  const std::string& peerIp() const { return link_.peerIp; }
  int peerGpu() const { return link_.peerGpu; }
  std::string transportName() const { return link_.transport->name(); }
  /// What carries it (PairLink::detail).
  const std::string& transportDetail() const { return link_.detail; }
  uint64_t timeoutNs() const { return timeoutNs_; }

  /// Queue operations and run them in the calling thread when no other thread drives the connection (else that
  /// thread runs them); the transfer counts one part per piece (write: one more for the fence).
  void send(std::shared_ptr<Transfer> t, std::vector<Piece> pieces);
  void recv(std::shared_ptr<Transfer> t, std::vector<Piece> pieces);
  void write(std::shared_ptr<Transfer> t, std::vector<Piece> src, std::vector<RemotePiece> dst, bool notify);
  void read(std::shared_ptr<Transfer> t, std::vector<Piece> dst, std::vector<RemotePiece> src);

  /// Makes `size` bytes at `offset` of `region` available to the peer as a window of its own; returns its id.
  /// Advertising the same range again returns the same window.
  uint32_t advertise(const MemoryRegion& region, uint64_t offset, uint64_t size);
  /// The region is going away: deregisters it (and the windows advertised in it) from the transport; later use of
  /// it on this connection fails by name. Returns once the transport reads none of it any more (the writes it posted
  /// from it completed; past the timeout the connection is closed, its transport stopped).
  /// Transfers that would still read it fail by name when they come to it.
  void forget(uint32_t window);
  void setResolver(WindowResolver r);
  /// forget()'s first half: marks `gone` (one window; the windows advertised in it are added) forgotten and
  /// deregisters them from the transport.
  void forgetWindows(std::vector<uint32_t>& gone);
  /// How many windows are granted right now (a receive's range or a read's destination, each until it is done).
  size_t grantsOpen() const;
  /// Called from whichever thread runs the connection, for every notified write that arrived.
  void setNotifyHandler(std::function<void()> h);
  /// Called once, from the thread that failed the connection (failure() is set by then), after its transfers failed.
  /// It must not block nor call into the connection.
  void setFailureHandler(std::function<void()> h);

  /// What progress() leaves for the calling thread.
  enum class Activity {
    kIdle,     ///< nothing to do until the connection is woken (or the next deadline check, within a millisecond)
    kPolling,  ///< completions are due and the transport cannot announce them: come back soon
    kWorked,   ///< work was done; more may follow at once
  };
  /// Runs the connection's work (queued operations, what arrived, completions, deadlines) unless another thread is
  /// doing so right now, which then does this work too before it lets go. With `arm`, completions still due are to be
  /// announced by the transport (TransportLane::armCompletion(): it wakes the connection's driver or progress thread
  /// when they come), so that the caller may sleep instead of polling: kIdle instead of kPolling where it can.
  Activity progress(bool arm = false);
  /// Drives the connection from the calling thread until `t` is finished or `deadlineNs` passes: it polls for a
  /// short while after the last work it did (a reply to a small message comes within tens of microseconds; it runs
  /// a round only when something was handed over, completions are due, or a quiet round is due), then
  /// sleeps until the transport hands over something (a message, an immediate, an armed completion) or the
  /// endpoint's progress thread finished a transfer. Work it leaves behind goes back to the progress thread.
  void drive(const Transfer& t, uint64_t deadlineNs);
  /// true while a caller drives the connection (the progress thread leaves it to that caller).
  bool driven() const { return drivers_.load() > 0; }
  /// Marks the calling thread as about to drive() the connection (a blocking call), so that queueing its operation
  /// does not also wake the progress thread for completions the caller will poll itself.
  /// It also notes, for the calling thread, that it drives this connection (drivingHere()).
  class Driving {
   public:
    explicit Driving(Connection& c);
    ~Driving();
    Driving(const Driving&) = delete;
    Driving& operator=(const Driving&) = delete;

    /// Which connection the calling thread drives, and how many Driving of it are open (a blocking write's, then
    /// drive()'s own).
    struct Here {
      const Connection* connection = nullptr;
      int depth = 0;
    };

   private:
    Connection& c_;
    const Here outer_;  ///< what the thread drove before this one; restored when this ends
  };
  /// Fails everything on the connection with `code` and `why` (it fails for good), then shuts its transport down
  /// (the peer sees it closed). The caller took it away from the progress threads first. Idempotent.
  void close(ErrorCode code, const std::string& why);
  /// "" while healthy, else why the connection failed.
  std::string failure() const;

 private:
  struct Event {
    enum Kind { kMessage, kImm, kFailure } kind = kMessage;
    RemoteMessage msg;
    uint32_t imm = 0;
    uint64_t bytes = 0;  ///< kImm: the size of the write
    std::string why;
  };

  // Running the connection (connection.cpp): operations, rounds, drivers, what arrives, completions.
  void queue(std::function<void()> op);
  /// Runs `op` (a void() callable) in the calling thread when no other thread runs the connection, after what was
  /// queued or handed over before it, as a round would; else queues it. A blocking call's operation then costs no
  /// std::function and no trip through ops_.
  template <typename Op>
  void submit(Op op);
  /// Runs one queued operation as a round does: on a failed connection it fails the operation's transfer by name.
  template <typename Op>
  void runOperation(Op& op, const std::string& failed);
  /// progress() for the thread that holds progressMutex_ (`lock`); `worked`: it already did work.
  Activity progressHolding(std::unique_lock<std::mutex>& lock, bool arm, bool worked);
  void push(Event e);
  /// The transport announced a completion that was armed for: the driver or progress thread runs a round.
  void onCompletionReady();
  /// Wakes whoever should run the connection next: a thread in drive(), else the progress thread.
  void wakeDriver();
  /// The last driver hands what is queued or in flight back to the progress thread.
  void leaveDriving();
  /// How many of drivers_ are the calling thread's own.
  int drivingHere() const;
  /// Wakes the drivers in other threads, which may sleep waiting for a transfer that a round just finished.
  void notifyOtherDrivers();
  /// One round of work (the caller holds progressMutex_); true if it did any (ran operations, handled arrivals or
  /// completions).
  bool round();
  void handle(const Event& e);
  void handleMessage(const ControlMsg& m);
  void handleCompletion(const Completion& c);
  /// Keeps `t` until it is finished: its deadline is checked, and a failure of the connection fails it.
  void track(std::shared_ptr<Transfer> t);
  void postControl(const ControlMsg& m);
  void postControls(const std::vector<ControlMsg>& ms);
  /// Calls `call` (void(Object::Actions&): a call of twoSided_ or oneSided_) and carries out the actions it
  /// returned, also those it returned before it threw: what was decided before an error happened, as if done at once.
  template <typename Object, typename Call>
  void decide(Call call) {
    typename Object::Actions actions;
    try {
      call(actions);
    } catch (...) {
      carryOut(actions);
      throw;
    }
    carryOut(actions);
  }

  // Sends and receives (connection_two_sided.cpp): what TwoSided returns, carried out.
  /// The operations send() and recv() submit.
  void runSend(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces);
  void runRecv(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces);
  /// Carries out `actions` in order, then lets more sends leave while TwoSided has more to look at.
  void carryOut(TwoSided::Actions& actions);
  void carryOut(const TwoSided::Action& a);
  /// Registers the source of a send's write and posts it; TwoSided hears if either throws.
  void postSendWrite(const TwoSided::Action& a);
  /// Lets queued sends leave (TwoSided::trySends()).
  void trySends();
  /// Reports the credits TwoSided owes, if any, on their own.
  void flushCredits();

  // Failure and teardown (connection_failure.cpp).
  void sweep(uint64_t now);
  void failAll(ErrorCode code, const std::string& why);

  // One-sided writes and reads, and the keys of windows (connection_one_sided.cpp): what OneSided and WindowKeys
  // return, carried out.
  /// Carries out `actions` in order; a write that cannot be posted ends them (OneSided::notPosted()).
  void carryOut(OneSided::Actions& actions);
  /// Registers the source of a write and posts it: false, with what to do instead in `instead`, if either throws.
  bool postOneSidedWrite(const OneSided::Action& a, OneSided::Actions& instead);
  /// Runs `op` once the peer's key of `window` is known (asking for it once), or fails `t` if it is refused.
  void whenKnown(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op, uint64_t secret = 0);
  void onKeyPart(const ControlMsg& m);

  // Memory the transport reads for posted writes (region_readers.cpp).
  /// Posts `op`, whose local window windows_.registerRegion(..., true) counted: the transport reads it until the
  /// write completes (doneReading), or not at all if the post throws.
  void postReading(const WriteOp& op);
  void doneReading(uint64_t cookie);
  /// Waits until the transport reads none of `windows`: bounded by the timeout, past which the connection closes.
  void waitForReaders(const std::vector<uint32_t>& windows);

  const uint64_t id_;
  PairLink link_;
  const uint64_t timeoutNs_;
  std::function<void()> wake_;
  std::string name_;
  std::shared_ptr<const std::string> sharedName_;
  TransportLane* lane_ = nullptr;

  std::mutex progressMutex_;          ///< held by the thread running the connection (progress())
  std::atomic<bool> pending_{false};  ///< work was queued since the last round began
  std::atomic<int> drivers_{0};       ///< threads in drive() or about to be (Driving)
  std::mutex opsMutex_;
  std::condition_variable driverCv_;  ///< drive() sleeps here (with opsMutex_)
  std::vector<std::function<void()>> ops_;
  std::vector<Event> inbox_;
  // What a round took from ops_ and inbox_ (the thread holding progressMutex_): swapped with them, so that their
  // storage is reused instead of allocated and freed every round.
  std::vector<std::function<void()>> roundOps_;
  std::vector<Event> roundEvents_;

  /// This side's windows: what the peer may write and read, with their keys (after name_, whose text it uses).
  LocalWindows windows_;
  /// The keys of this side's windows the peer got, and of the peer's windows this side learned.
  WindowKeys keys_;
  /// Sends and receives: their numbers, the eager buffer's credits, the rendezvous of large sends.
  TwoSided twoSided_;
  /// Writes and reads against the peer's windows, and the answers to the peer's.
  OneSided oneSided_;

  mutable std::mutex failureMutex_;  // guards the two below, set by the failing thread and read by callers
  std::function<void()> onFailure_;
  std::string failure_;
  std::atomic<bool> failed_{false};  ///< failure_ is set: failure() reads this, not the text, while all is well

  // Progress thread only.
  std::function<void()> notify_;
  std::unordered_map<uint64_t, uint32_t> readingCookies_;  ///< posted writes by cookie -> the local window they read
  std::vector<std::shared_ptr<Transfer>> live_;
  uint64_t nextSweepNs_ = 0;
};

}  // namespace gdx::p2p
