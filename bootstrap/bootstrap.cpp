// Bootstrap: every rank's client of the rendezvous (rank 0 also runs the server, see server.hpp; the wire
// protocol is in protocol.hpp).
#include "bootstrap/bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "base/log.hpp"
#include "bootstrap/collective_tag.hpp"
#include "bootstrap/frame_io.hpp"
#include "bootstrap/protocol.hpp"
#include "bootstrap/server.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "sockets/socket.hpp"

namespace gdx {

using namespace bootstrap;
using net::deadlineIn;
using net::SockAddr;

namespace {

constexpr uint64_t kMsNs = 1000000ull;
// Upper bound on one connect() attempt, so that a black-holed address does not eat the whole timeout.
constexpr uint64_t kConnectAttemptNs = 2000 * kMsNs;
constexpr uint64_t kGoodbyeNs = 1000 * kMsNs;
// Matches the server's linger after an abort (server.cpp).
constexpr uint64_t kAbortLingerNs = 5000 * kMsNs;

// Clients wait a little longer than the server for an answer, so that when the server gives up it is the
// server's message (which names the missing ranks) that the client reports, not a bare timeout of its own.
uint64_t graceNs(uint64_t timeoutNs) {
  return std::min<uint64_t>(timeoutNs / 2, 5000 * kMsNs);
}

void validate(const BootstrapConfig& c) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, "BootstrapConfig: " + m); };
  if (c.worldSize < 1) bad("worldSize " + std::to_string(c.worldSize) + " must be at least 1");
  if (c.rank < 0 || c.rank >= c.worldSize)
    bad("rank " + std::to_string(c.rank) + " is out of range for world size " + std::to_string(c.worldSize));
  if (c.localRank < -1 || c.localRank >= c.worldSize) bad("localRank " + std::to_string(c.localRank) + " is invalid");
  const bool ephemeral = c.masterPort == 0 && c.rank == 0 && c.publishPort;
  if (!ephemeral && (c.masterPort < 1 || c.masterPort > 65535))
    bad("masterPort " + std::to_string(c.masterPort) + " is invalid" +
        (c.masterPort == 0 ? " (0 needs rank 0 and a publishPort hook)" : ""));
  if (c.masterAddr.empty()) bad("masterAddr is empty");
  if (c.timeoutNs == 0) bad("timeoutNs must be positive");
}

std::string thisHostname() {
  char name[256] = {};
  GDX_SYS_CHECK(gethostname(name, sizeof name - 1) == 0);
  return name;
}

}  // namespace

struct Bootstrap::Impl {
  BootstrapConfig cfg;
  std::string master;  // "addr:port", for messages
  uint64_t timeoutMs = 0;
  std::unique_ptr<RendezvousServer> server;  // rank 0 only
  net::UniqueFd fd;
  std::vector<std::string> hostnames;
  std::vector<int> hostRanks;
  std::string localIp;
  int localRank = -1;
  uint64_t seq = 0;
  bool joined = false;
  // After an abort or a lost connection every call fails the same way: the job is over.
  std::optional<Error> failure;

  explicit Impl(const BootstrapConfig& c) : cfg(c) {
    validate(cfg);
    master = net::hostPort(cfg.masterAddr, cfg.masterPort);
    timeoutMs = cfg.timeoutNs / kMsNs;
  }

  std::string who() const { return "rank " + std::to_string(cfg.rank) + ": "; }

  void join() {
    Deadline joinDeadline = deadlineIn(cfg.timeoutNs);
    if (cfg.rank == 0) server = std::make_unique<RendezvousServer>(cfg);
    if (cfg.masterPort == 0) {  // ephemeral (validate): the server chose the port, the store tells the others
      cfg.masterPort = server->port();
      master = net::hostPort(cfg.masterAddr, cfg.masterPort);
      cfg.publishPort(cfg.masterPort);
    }
    connectToMaster(joinDeadline);
    localIp = net::localAddress(fd.get());

    Hello hello;
    hello.rank = static_cast<uint32_t>(cfg.rank);
    hello.worldSize = static_cast<uint32_t>(cfg.worldSize);
    hello.secret = cfg.secret;
    hello.hostname = thisHostname();
    if (cfg.emulatedHost >= 0) hello.hostname += "#emulated-host-" + std::to_string(cfg.emulatedHost);
    Deadline answerDeadline = joinDeadline + graceNs(cfg.timeoutNs);
    send(MsgType::kHello, encodeHello(hello), "", answerDeadline, "hello");
    Frame f = receive(MsgType::kWelcome, kMaxHelloBytes + 256ull * static_cast<uint64_t>(cfg.worldSize), answerDeadline,
                      "the other ranks to join");
    try {
      hostnames = decodeWelcome(f.payload, static_cast<uint32_t>(cfg.worldSize));
    } catch (const Error& e) {
      fail(ErrorCode::kProtocol, std::string("bad welcome from the rendezvous server at ") + master + ": " + e.what());
    }
    for (int i = 0; i < cfg.worldSize; ++i)
      if (hostnames[i] == hello.hostname) hostRanks.push_back(i);
    // An emulated host's local rank counts its own ranks only (LOCAL_RANK counts those of the whole machine).
    localRank = cfg.localRank >= 0 && cfg.emulatedHost < 0
                    ? cfg.localRank
                    : static_cast<int>(std::find(hostRanks.begin(), hostRanks.end(), cfg.rank) - hostRanks.begin());
    joined = true;
    setLogRank(cfg.rank);
    GDX_INFO("bootstrap: joined as rank " << cfg.rank << " of " << cfg.worldSize << " via master " << master
                                          << " (host " << hello.hostname << ", local rank " << localRank << " of "
                                          << hostRanks.size() << ", local ip " << localIp << ")");
  }

  // Retries with exponential backoff until `deadline`: ranks start in any order, so the server (rank 0) may
  // come up after its clients. The name is resolved on every attempt, for DNS entries that appear late.
  void connectToMaster(Deadline deadline) {
    uint64_t backoffNs = 10 * kMsNs;
    std::string lastError = "no attempt made";
    for (;;) {
      std::vector<SockAddr> addrs = net::resolve(cfg.masterAddr, cfg.masterPort, false, &lastError);
      for (const SockAddr& a : addrs) {
        if (tryConnect(a, std::min(deadline, deadlineIn(kConnectAttemptNs)), &lastError)) return;
      }
      if (nowNs() >= deadline)
        fail(ErrorCode::kTimeout, "could not connect to the rendezvous server at " + master + " within " +
                                      std::to_string(timeoutMs) + " ms (last error: " + lastError +
                                      "); is rank 0 running and is MASTER_ADDR/MASTER_PORT right?");
      uint64_t left = deadline - nowNs();
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(backoffNs, left)));
      backoffNs = std::min<uint64_t>(backoffNs * 2, 200 * kMsNs);
    }
  }

  bool tryConnect(const SockAddr& a, Deadline deadline, std::string* lastError) {
    int err = 0;
    net::UniqueFd s = net::connectOnce(a, deadline, &err, lastError);
    if (!s.valid()) return false;
    fd = std::move(s);
    return true;
  }

  [[noreturn]] void fail(ErrorCode code, const std::string& message) {
    failure.emplace(code, who() + message);
    fd.reset();  // the server sees EOF at once instead of waiting for this process to exit
    throw *failure;
  }

  void send(MsgType type, const std::string& prefix, const std::string& body, Deadline deadline, const char* what) {
    FrameIo s = sendFrame(fd.get(), type, prefix, body, deadline);
    if (s == FrameIo::kOk) return;
    if (s == FrameIo::kClosed) {
      // The server may have closed after telling us why (an abort or a refusal): report that reason.
      Frame f;
      try {
        if (recvFrame(fd.get(), f, kMaxHelloBytes, deadlineIn(100 * kMsNs)) == FrameIo::kOk) onServerVerdict(f);
      } catch (const Error&) {
      }
      fail(ErrorCode::kPeerFailed, std::string("lost the connection to the rendezvous server at ") + master +
                                       " while sending " + what + " (rank 0 died or the job was aborted)");
    }
    fail(ErrorCode::kTimeout, std::string("could not send ") + what + " to the rendezvous server at " + master +
                                  " within " + std::to_string(timeoutMs) + " ms");
  }

  Frame receive(MsgType expected, uint64_t maxPayload, Deadline deadline, const std::string& waitingFor) {
    Frame f;
    FrameIo s;
    try {
      s = recvFrame(fd.get(), f, std::max<uint64_t>(maxPayload, kMaxHelloBytes), deadline);
    } catch (const Error& e) {
      fail(e.code(), std::string("from the rendezvous server at ") + master + ": " + e.what());
    }
    if (s == FrameIo::kTimeout)
      fail(ErrorCode::kTimeout, "heard nothing back from the rendezvous server at " + master + " within " +
                                    std::to_string(timeoutMs) + " ms (+ grace) while waiting for " + waitingFor);
    if (s == FrameIo::kClosed)
      fail(ErrorCode::kPeerFailed, "the rendezvous server at " + master +
                                       " closed the connection while this rank waited for " + waitingFor +
                                       " (rank 0 died?)");
    if (f.type == expected) return f;
    onServerVerdict(f);
    fail(ErrorCode::kProtocol, std::string("unexpected ") + msgTypeName(f.type) +
                                   " message from the rendezvous server at " + master + " while waiting for " +
                                   waitingFor);
  }

  // Throws when `f` is a refusal or an abort; returns otherwise.
  void onServerVerdict(const Frame& f) {
    if (f.type == MsgType::kRefuse) {
      std::string reason = decodeRefuse(f.payload);
      fail(ErrorCode::kProtocol, "the rendezvous server at " + master + " refused: " + reason);
    }
    if (f.type == MsgType::kAbort) {
      Abort a = decodeAbort(f.payload);
      fail(a.code, a.message);
    }
  }

  std::vector<std::string> allGather(const std::string& mine, const CollectiveTag& tag) {
    if (failure) throw *failure;
    if (mine.size() > kMaxBlobBytes)
      throw Error(ErrorCode::kInvalidArgument, who() + "allGather blob of " + std::to_string(mine.size()) +
                                                   " bytes exceeds the limit of " + std::to_string(kMaxBlobBytes));
    std::string tagged;
    try {
      tagged = encodeTagged(tag, mine);
    } catch (const Error& e) {
      throw Error(e.code(), who() + e.what());
    }
    uint64_t n = ++seq;
    ByteWriter prefix;
    prefix.put(n);
    Deadline sendDeadline = deadlineIn(cfg.timeoutNs);
    std::string what = "allGather/barrier #" + std::to_string(n);
    send(MsgType::kGather, prefix.bytes(), tagged, sendDeadline, what.c_str());
    uint64_t maxPayload = 12 + static_cast<uint64_t>(cfg.worldSize) * (8 + kMaxTagBytes + kMaxBlobBytes);
    Frame f = receive(MsgType::kGatherResult, maxPayload, sendDeadline + graceNs(cfg.timeoutNs),
                      "the other ranks in " + what);
    std::vector<std::string> all(static_cast<size_t>(cfg.worldSize));
    std::vector<CollectiveTag> tags(all.size());
    try {
      std::vector<std::string> raw = decodeGatherResult(f.payload, n, static_cast<uint32_t>(cfg.worldSize));
      for (int p = 0; p < cfg.worldSize; ++p) decodeTagged(raw[p], p, &tags[p], &all[p]);
    } catch (const Error& e) {
      if (failure) throw;
      fail(ErrorCode::kProtocol, std::string("bad answer to ") + what + ": " + e.what());
    }
    checkTags(n, tags);
    return all;
  }

  // Every rank compares all tags against rank 0's and against the first named one (names are optional, so a
  // comparison with rank 0 alone would miss two ranks that named the window differently when rank 0 did not):
  // every rank reports the same pair. Not a failure of the job: every rank throws in the same round, and the
  // sequence numbers stay in step.
  void checkTags(uint64_t n, const std::vector<CollectiveTag>& tags) const {
    size_t named = 0;
    while (named < tags.size() && tags[named].name.empty()) ++named;
    for (size_t p = 1; p < tags.size(); ++p) {
      size_t other = 0;
      std::string why = tagMismatch(tags[0], tags[p]);
      if (why.empty() && named < p) why = tagMismatch(tags[other = named], tags[p]);
      if (why.empty()) continue;
      throw Error(ErrorCode::kInvalidArgument,
                  who() + "collective call #" + std::to_string(n) + " does not match across ranks (" + why +
                      "): rank " + std::to_string(other) + " called " + describeTag(tags[other]) + " but rank " +
                      std::to_string(p) + " called " + describeTag(tags[p]) +
                      " (collective calls must be made in the same order on every rank)");
    }
  }

  // Runs from the destructor, also when join() threw (rank 0's server must still be stopped): never throws.
  ~Impl() { leave(); }

  void leave() noexcept {
    try {
      bool clean = joined && !failure;
      if (clean && fd.valid()) sendFrame(fd.get(), MsgType::kGoodbye, "", "", deadlineIn(kGoodbyeNs));
      fd.reset();
      if (server) {
        // Clean exit: keep serving until every rank said goodbye, so that the last allGather result reaches
        // everyone even if this rank got its own first. After a failure: give the server its short linger, in
        // which it delivers the abort reason to the ranks that were sending when it gave up.
        uint64_t bound = clean ? cfg.timeoutNs : std::min(cfg.timeoutNs, kAbortLingerNs);
        if (!server->waitFinished(bound) && clean)
          GDX_WARN("bootstrap: not every rank said goodbye within " << timeoutMs
                                                                    << " ms; stopping the rendezvous server anyway");
        server.reset();
      }
    } catch (const std::exception& e) {
      GDX_WARN("bootstrap: error while leaving the job: " << e.what());
    }
  }
};

Bootstrap::Bootstrap(const BootstrapConfig& config) : impl_(std::make_unique<Impl>(config)) {
  impl_->join();
}

Bootstrap::~Bootstrap() = default;

int Bootstrap::rank() const {
  return impl_->cfg.rank;
}
int Bootstrap::worldSize() const {
  return impl_->cfg.worldSize;
}
int Bootstrap::localRank() const {
  return impl_->localRank;
}
const std::vector<int>& Bootstrap::hostRanks() const {
  return impl_->hostRanks;
}
const std::string& Bootstrap::hostname(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(impl_->hostnames.size()))
    throw Error(ErrorCode::kInvalidArgument, "no rank " + std::to_string(rank) + " in this job");
  return impl_->hostnames[rank];
}
const std::string& Bootstrap::secret() const {
  return impl_->cfg.secret;
}
const std::string& Bootstrap::localIp() const {
  return impl_->localIp;
}

std::vector<std::string> Bootstrap::allGather(const std::string& mine, const CollectiveTag& tag) {
  return impl_->allGather(mine, tag);
}

void Bootstrap::barrier() {
  CollectiveTag tag;
  tag.kind = "barrier";
  impl_->allGather(std::string(), tag);
}

}  // namespace gdx
