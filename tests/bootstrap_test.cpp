// Bootstrap tests: the environment parsing in-process, the rendezvous with real processes over loopback.
#include "bootstrap/bootstrap.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

using Clock = std::chrono::steady_clock;

long long msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Every variable fromEnv reads. The guard clears them all (a CI launcher may have set some) and restores them.
const char* const kEnvVars[] = {"GDX_RANK",
                                "RANK",
                                "OMPI_COMM_WORLD_RANK",
                                "PMI_RANK",
                                "SLURM_PROCID",
                                "GDX_WORLD_SIZE",
                                "WORLD_SIZE",
                                "OMPI_COMM_WORLD_SIZE",
                                "PMI_SIZE",
                                "SLURM_NTASKS",
                                "GDX_LOCAL_RANK",
                                "LOCAL_RANK",
                                "OMPI_COMM_WORLD_LOCAL_RANK",
                                "SLURM_LOCALID",
                                "GDX_MASTER_ADDR",
                                "MASTER_ADDR",
                                "GDX_MASTER_PORT",
                                "MASTER_PORT",
                                "GDX_JOB_SECRET",
                                "TORCHELASTIC_RUN_ID",
                                "SLURM_JOB_ID",
                                "GDX_BOOTSTRAP_TIMEOUT_MS",
                                "GDX_HOST_ID",
                                "GDX_HOSTS",
                                "GDX_TIMEOUT_MS"};

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* n : kEnvVars) {
      const char* v = std::getenv(n);
      if (v) saved_[n] = v;
      unsetenv(n);
    }
  }
  ~EnvGuard() {
    for (const char* n : kEnvVars) {
      auto it = saved_.find(n);
      if (it != saved_.end())
        setenv(n, it->second.c_str(), 1);
      else
        unsetenv(n);
    }
  }
  void set(const char* n, const std::string& v) { setenv(n, v.c_str(), 1); }

 private:
  std::map<std::string, std::string> saved_;
};

// fromEnv must throw kInvalidArgument with a message that names `variable`.
void expectInvalid(const std::string& variable) {
  try {
    BootstrapConfig::fromEnv();
    ADD_FAILURE() << "fromEnv accepted a bad " << variable;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
  }
}

TEST(BootstrapConfig, ReadsTorchrunVariables) {
  EnvGuard env;
  env.set("RANK", "2");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_ADDR", "node-7");
  env.set("MASTER_PORT", "1234");
  env.set("TORCHELASTIC_RUN_ID", "run-42");
  BootstrapConfig c = BootstrapConfig::fromEnv();
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.worldSize, 4);
  EXPECT_EQ(c.localRank, 1);
  EXPECT_EQ(c.masterAddr, "node-7");
  EXPECT_EQ(c.masterPort, 1234);
  EXPECT_NE(c.secret.find("run-42"), std::string::npos);
  EXPECT_EQ(c.timeoutNs, 30000ull * 1000000);  // GDX_TIMEOUT_MS's default
}

TEST(BootstrapConfig, GdxVariablesWinOverTorchrunOnes) {
  EnvGuard env;
  env.set("RANK", "2");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_ADDR", "node-7");
  env.set("MASTER_PORT", "1234");
  env.set("TORCHELASTIC_RUN_ID", "run-42");
  env.set("GDX_RANK", "5");
  env.set("GDX_WORLD_SIZE", "8");
  env.set("GDX_LOCAL_RANK", "3");
  env.set("GDX_MASTER_ADDR", "10.0.0.9");
  env.set("GDX_MASTER_PORT", "4321");
  env.set("GDX_JOB_SECRET", "s3cret");
  env.set("GDX_BOOTSTRAP_TIMEOUT_MS", "1500");
  BootstrapConfig c = BootstrapConfig::fromEnv();
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.worldSize, 8);
  EXPECT_EQ(c.localRank, 3);
  EXPECT_EQ(c.masterAddr, "10.0.0.9");
  EXPECT_EQ(c.masterPort, 4321);
  EXPECT_EQ(c.secret, "s3cret");
  EXPECT_EQ(c.timeoutNs, 1500ull * 1000000);
}

TEST(BootstrapConfig, MpiAndSlurmFallbacksAndDefaults) {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "6");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_PROCID", "1");  // lower priority than Open MPI's
  env.set("SLURM_JOB_ID", "777");
  env.set("GDX_TIMEOUT_MS", "2500");
  BootstrapConfig c = BootstrapConfig::fromEnv();
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.worldSize, 6);
  EXPECT_EQ(c.localRank, 0);
  EXPECT_EQ(c.masterAddr, "127.0.0.1");
  EXPECT_EQ(c.masterPort, 29500);
  EXPECT_NE(c.secret.find("777"), std::string::npos);
  EXPECT_EQ(c.timeoutNs, 2500ull * 1000000);

  EnvGuard bare;
  env.set("PMI_RANK", "0");
  env.set("PMI_SIZE", "2");
  c = BootstrapConfig::fromEnv();
  EXPECT_EQ(c.worldSize, 2);
  EXPECT_EQ(c.localRank, -1);
  // No job id anywhere: the secret falls back to the master endpoint, the same on every rank.
  EXPECT_NE(c.secret.find("127.0.0.1:29500"), std::string::npos);
}

TEST(BootstrapConfig, RejectsBadValuesNamingTheVariable) {
  EnvGuard env;
  expectInvalid("GDX_RANK");  // nothing set at all
  env.set("WORLD_SIZE", "4");
  env.set("RANK", "abc");
  expectInvalid("RANK");
  env.set("RANK", "4");  // rank >= world size
  expectInvalid("RANK");
  env.set("GDX_RANK", "-1");
  expectInvalid("GDX_RANK");
  env.set("GDX_RANK", "1");
  env.set("GDX_WORLD_SIZE", "0");
  expectInvalid("GDX_WORLD_SIZE");
  env.set("GDX_WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "9");
  expectInvalid("LOCAL_RANK");
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_PORT", "0");
  expectInvalid("MASTER_PORT");
  env.set("GDX_MASTER_PORT", "70000");
  expectInvalid("GDX_MASTER_PORT");
  env.set("GDX_MASTER_PORT", "12x");
  expectInvalid("GDX_MASTER_PORT");
  env.set("GDX_MASTER_PORT", "5000");
  env.set("GDX_BOOTSTRAP_TIMEOUT_MS", "0");
  expectInvalid("GDX_BOOTSTRAP_TIMEOUT_MS");
  env.set("GDX_BOOTSTRAP_TIMEOUT_MS", "100");
  EXPECT_NO_THROW(BootstrapConfig::fromEnv());
}

// ---- real processes ----------------------------------------------------------------------------------------

// Forks one rank of a job whose environment is set explicitly (runRanks starts every rank at once; these
// tests need to start some late, some never, or with a wrong secret).
pid_t spawnRank(int rank, int world, int port, const std::string& secret, int timeoutMs,
                const std::function<int()>& body, int delayMs = 0) {
  return test::forkChild([=] {
    if (delayMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    setenv("GDX_RANK", std::to_string(rank).c_str(), 1);
    setenv("GDX_WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
    setenv("GDX_MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("GDX_JOB_SECRET", secret.c_str(), 1);
    setenv("GDX_BOOTSTRAP_TIMEOUT_MS", std::to_string(timeoutMs).c_str(), 1);
    unsetenv("GDX_LOCAL_RANK");
    return body();
  });
}

std::string blobFor(int round, int rank) {
  static const size_t kSizes[] = {0, 37, 1 << 20};
  size_t n = kSizes[(round + rank) % 3] + (kSizes[(round + rank) % 3] ? rank : 0);
  std::string s(n, '\0');
  test::fillRandom(s.data(), n, 1000ull * round + rank + 1);
  return s;
}

// One rank of the allGather job: blobs of 0 B, a few bytes and 1 MiB, different per rank and round.
int allGatherJob(int rank, int world) {
  setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
  Bootstrap b(BootstrapConfig::fromEnv());
  CHILD_CHECK(b.rank() == rank);
  CHILD_CHECK(b.worldSize() == world);
  CHILD_CHECK(b.localRank() == rank);
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  CHILD_CHECK(b.hostRanks() == all);
  in_addr addr{};
  CHILD_CHECK(inet_pton(AF_INET, b.localIp().c_str(), &addr) == 1);
  for (int round = 0; round < 4; ++round) {
    std::vector<std::string> got = b.allGather(blobFor(round, rank));
    CHILD_CHECK(static_cast<int>(got.size()) == world);
    for (int r = 0; r < world; ++r) {
      std::string want = blobFor(round, r);
      CHILD_CHECK(got[r].size() == want.size());
      CHILD_CHECK(test::firstMismatch(got[r].data(), want.data(), want.size()) == -1);
    }
    b.barrier();
  }
  return 0;
}

TEST(Bootstrap, AllGatherTwoRanks) {
  EXPECT_EQ(test::runRanks(
                2, [](int r) { return allGatherJob(r, 2); }, 60),
            std::vector<int>(2, 0));
}

TEST(Bootstrap, AllGatherFourRanks) {
  EXPECT_EQ(test::runRanks(
                4, [](int r) { return allGatherJob(r, 4); }, 60),
            std::vector<int>(4, 0));
}

// An external store carries the rendezvous port (as torch.distributed's store does for the Python package): rank 0
// listens on an ephemeral port and publishes it through publishPort, here into a pipe the other ranks read.
TEST(Bootstrap, EphemeralPortPublishedThroughAnExternalStore) {
  constexpr int kWorld = 3;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<int> rc = test::runRanks(
      kWorld,
      [&](int rank) {
        BootstrapConfig c;
        c.rank = rank;
        c.worldSize = kWorld;
        c.secret = "external-store-test";
        c.timeoutNs = 10000ull * 1000000ull;
        if (rank == 0) {
          close(fds[0]);
          c.masterPort = 0;
          c.publishPort = [&](int port) {
            for (int i = 1; i < kWorld; ++i)
              if (write(fds[1], &port, sizeof port) != sizeof port) throw Error(ErrorCode::kSystem, "store write");
          };
        } else {
          close(fds[1]);
          int port = 0;
          CHILD_CHECK(read(fds[0], &port, sizeof port) == sizeof port);
          CHILD_CHECK(port > 0 && port < 65536);
          c.masterPort = port;
        }
        Bootstrap b(c);
        std::vector<std::string> got = b.allGather(std::to_string(rank * 7));
        for (int r = 0; r < kWorld; ++r) CHILD_CHECK(got[r] == std::to_string(r * 7));
        b.barrier();
        return 0;
      },
      60);
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(rc, std::vector<int>(kWorld, 0));
}

TEST(BootstrapConfig, PortZeroNeedsRankZeroAndAPublishHook) {
  BootstrapConfig c;
  c.masterPort = 0;
  c.worldSize = 2;
  c.rank = 1;
  c.publishPort = [](int) {};
  try {
    Bootstrap b(c);
    FAIL() << "port 0 on rank 1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("masterPort 0 is invalid (0 needs rank 0 and a publishPort hook)"),
              std::string::npos)
        << e.what();
  }
}

// GDX_HOSTS=2 makes four ranks of this machine two emulated hosts of two ranks: each sees only its host's ranks as
// local, with local ranks 0 and 1 (LOCAL_RANK, 0..3 here, counts the machine and is overridden); GDX_HOST_ID sets
// one rank's host by hand.
int emulatedHostsJob(int rank) {
  setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
  setenv("GDX_HOSTS", "2", 1);
  if (rank == 3) setenv("GDX_HOST_ID", "1", 1);  // what GDX_HOSTS gives it too
  Bootstrap b(BootstrapConfig::fromEnv());
  const std::vector<int> want = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  CHILD_CHECK(b.hostRanks() == want);
  CHILD_CHECK(b.localRank() == rank % 2);
  CHILD_CHECK(b.hostname(0) == b.hostname(1) && b.hostname(2) == b.hostname(3) && b.hostname(0) != b.hostname(2));
  b.barrier();
  return 0;
}

TEST(Bootstrap, EmulatedHostsSplitOneMachine) {
  EXPECT_EQ(test::runRanks(4, emulatedHostsJob, 60), std::vector<int>(4, 0));
}

TEST(BootstrapConfig, RejectsEmulatedHostsThatDoNotDivideTheWorld) {
  EnvGuard env;
  env.set("GDX_RANK", "0");
  env.set("GDX_WORLD_SIZE", "4");
  env.set("GDX_HOSTS", "3");
  expectInvalid("GDX_HOSTS");
}

TEST(Bootstrap, LargestBlobPassesAndALargerOneIsRejected) {
  const size_t kMax = 64u << 20;
  std::vector<int> codes = test::runRanks(
      2,
      [&](int rank) {
        setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "20000", 1);
        Bootstrap b(BootstrapConfig::fromEnv());
        std::string big(rank == 1 ? kMax : 0, '\0');
        test::fillRandom(big.data(), big.size(), 99);
        std::vector<std::string> got = b.allGather(big);
        CHILD_CHECK(got[0].empty() && got[1].size() == kMax);
        std::string want(kMax, '\0');
        test::fillRandom(want.data(), want.size(), 99);
        CHILD_CHECK(got[1] == want);
        try {
          b.allGather(std::string(kMax + 1, 'x'));
          return 1;
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kInvalidArgument);
        }
        b.barrier();  // the refused call was not sent: the job goes on
        return 0;
      },
      60);
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(Bootstrap, ServerMayStartAfterTheClientsAndBeNamedByHostname) {
  int port = test::freePort();
  auto job = [] {
    setenv("GDX_MASTER_ADDR", "localhost", 1);  // a name, resolved with getaddrinfo on both sides
    Bootstrap b(BootstrapConfig::fromEnv());
    std::vector<std::string> got = b.allGather(std::to_string(b.rank()));
    CHILD_CHECK(got == std::vector<std::string>({"0", "1"}));
    return 0;
  };
  pid_t r1 = spawnRank(1, 2, port, "late", 10000, job);
  pid_t r0 = spawnRank(0, 2, port, "late", 10000, job, 700);  // rank 1 must retry until rank 0 listens
  EXPECT_EQ(test::waitChild(r0, 30), 0);
  EXPECT_EQ(test::waitChild(r1, 30), 0);
}

// Expects the Bootstrap constructor to throw `code` with `text` in the message.
int expectJoinFails(ErrorCode code, const std::string& text) {
  try {
    Bootstrap b(BootstrapConfig::fromEnv());
  } catch (const Error& e) {
    std::fprintf(stderr, "child %d: got the expected error: %s\n", getpid(), e.what());
    CHILD_CHECK(e.code() == code);
    CHILD_CHECK(std::string(e.what()).find(text) != std::string::npos);
    return 0;
  }
  CHILD_CHECK(!"the join succeeded");
  return 1;
}

// A plain TCP connection to 127.0.0.1:port, or -1.
int connectRaw(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

TEST(Bootstrap, StrangersAreRefusedAndTheJobCompletes) {
  int port = test::freePort();
  int joined[2], go[2];  // rank 1 -> test: "I joined"; test -> rank 1: "the last intruder is done"
  ASSERT_EQ(pipe(joined), 0);
  ASSERT_EQ(pipe(go), 0);
  auto job = [&](int rank) {
    Bootstrap b(BootstrapConfig::fromEnv());
    if (rank == 1) {
      CHILD_CHECK(write(joined[1], "j", 1) == 1);
      pollfd p{go[0], POLLIN, 0};
      CHILD_CHECK(poll(&p, 1, 20000) == 1);
    }
    std::vector<std::string> got = b.allGather("from " + std::to_string(b.rank()));
    CHILD_CHECK(got == std::vector<std::string>({"from 0", "from 1"}));
    return 0;
  };
  pid_t r0 = spawnRank(0, 2, port, "right", 20000, [&] { return job(0); });
  // Intruders claim rank 1 while rank 0 waits for it; none may take its place or disturb the job.
  pid_t wrongSecret = spawnRank(1, 2, port, "wrong", 10000,
                                [] { return expectJoinFails(ErrorCode::kProtocol, "refused: wrong job secret"); });
  EXPECT_EQ(test::waitChild(wrongSecret, 30), 0);
  pid_t wrongWorld = spawnRank(1, 3, port, "right", 10000,
                               [] { return expectJoinFails(ErrorCode::kProtocol, "world size 3 differs"); });
  EXPECT_EQ(test::waitChild(wrongWorld, 30), 0);
  // A connection that never says anything and one that speaks another protocol must not hold up the job.
  int silent = connectRaw(port), garbage = connectRaw(port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(garbage, 0);
  const char kHttp[] = "GET / HTTP/1.0\r\n\r\n";
  EXPECT_EQ(write(garbage, kHttp, sizeof kHttp - 1), static_cast<ssize_t>(sizeof kHttp - 1));
  pid_t r1 = spawnRank(1, 2, port, "right", 20000, [&] { return job(1); });
  pollfd p{joined[0], POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 20000), 1);
  pid_t duplicate = spawnRank(1, 2, port, "right", 10000,
                              [] { return expectJoinFails(ErrorCode::kProtocol, "rank 1 already joined"); });
  EXPECT_EQ(test::waitChild(duplicate, 30), 0);
  EXPECT_EQ(write(go[1], "g", 1), 1);
  EXPECT_EQ(test::waitChild(r0, 30), 0);
  EXPECT_EQ(test::waitChild(r1, 30), 0);
  for (int fd : {joined[0], joined[1], go[0], go[1], silent, garbage}) close(fd);
}

TEST(Bootstrap, RankThatNeverArrivesTimesOutEveryoneNamingIt) {
  int port = test::freePort();
  const int kTimeoutMs = 2000;
  auto body = [] {
    auto start = Clock::now();
    int rc = expectJoinFails(ErrorCode::kTimeout, "rank 2 of 3 did not join within 2000 ms");
    long long ms = msSince(start);
    CHILD_CHECK(ms >= kTimeoutMs * 3 / 4);
    CHILD_CHECK(ms < 2 * kTimeoutMs);
    return rc;
  };
  pid_t r0 = spawnRank(0, 3, port, "s", kTimeoutMs, body);
  pid_t r1 = spawnRank(1, 3, port, "s", kTimeoutMs, body);
  EXPECT_EQ(test::waitChild(r0, 30), 0);
  EXPECT_EQ(test::waitChild(r1, 30), 0);
}

// A rank refused for a stated reason (here a wrong job secret) and therefore missing: the ranks that joined are told
// the reason with the timeout, not only that the rank did not join.
TEST(Bootstrap, ARefusedRankIsNamedWithTheReasonToTheOthers) {
  int port = test::freePort();
  const int kTimeoutMs = 2000;
  auto joined = [] { return expectJoinFails(ErrorCode::kTimeout, "claiming rank 2 was refused: wrong job secret"); };
  pid_t r0 = spawnRank(0, 3, port, "s", kTimeoutMs, joined);
  pid_t r1 = spawnRank(1, 3, port, "s", kTimeoutMs, joined);
  pid_t r2 = spawnRank(2, 3, port, "not-the-secret", kTimeoutMs,
                       [] { return expectJoinFails(ErrorCode::kProtocol, "refused: wrong job secret"); });
  EXPECT_EQ(test::waitChild(r0, 30), 0);
  EXPECT_EQ(test::waitChild(r1, 30), 0);
  EXPECT_EQ(test::waitChild(r2, 30), 0);
}

// While ranks are missing, rank 0's rendezvous server names them every few seconds (WARN once the wait is long), so
// a job that waits for a rank that was never started says so before its timeout.
TEST(Bootstrap, ServerNamesTheMissingRanksWhileItWaits) {
  int port = test::freePort();
  const int kTimeoutMs = 7000;
  char logPath[] = "/tmp/gdx_bootstrap_progress_XXXXXX";
  int logFd = mkstemp(logPath);
  ASSERT_GE(logFd, 0);
  pid_t r0 = spawnRank(0, 3, port, "s", kTimeoutMs, [logFd] {
    dup2(logFd, STDERR_FILENO);  // what the server logs, for the parent to read
    return expectJoinFails(ErrorCode::kTimeout, "ranks 1, 2 of 3 did not join within 7000 ms");
  });
  EXPECT_EQ(test::waitChild(r0, 30), 0);
  std::string log(static_cast<size_t>(lseek(logFd, 0, SEEK_END)), '\0');
  EXPECT_EQ(pread(logFd, log.data(), log.size(), 0), static_cast<ssize_t>(log.size()));
  close(logFd);
  unlink(logPath);
  EXPECT_NE(log.find("WARN"), std::string::npos) << log;
  EXPECT_NE(log.find("waiting 6 s of 7 s for ranks 1, 2 of 3 to join"), std::string::npos) << log;
}

// No child processes needed: a rank other than 0 starts no thread.
BootstrapConfig clientConfig(int port, int timeoutMs) {
  BootstrapConfig c;
  c.rank = 1;
  c.worldSize = 2;
  c.masterPort = port;
  c.secret = "x";
  c.timeoutNs = static_cast<uint64_t>(timeoutMs) * 1000000;
  return c;
}

TEST(Bootstrap, ClientWithoutServerTimesOutNamingTheMaster) {
  int port = test::freePort();
  auto start = Clock::now();
  try {
    Bootstrap b(clientConfig(port, 500));
    ADD_FAILURE() << "joined without a server";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(msSince(start), 1500);
}

TEST(Bootstrap, ClientOfASilentServerTimesOutNamingTheMaster) {
  // A listening socket that never answers: the kernel completes the connection, nobody reads the hello.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  auto start = Clock::now();
  try {
    Bootstrap b(clientConfig(port, 500));
    ADD_FAILURE() << "joined a server that never answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("heard nothing back"), std::string::npos) << e.what();
  }
  EXPECT_LT(msSince(start), 2000);
  close(fd);
}

TEST(Bootstrap, RankKilledDuringAllGatherIsNamedToTheOthers) {
  std::vector<int> codes = test::runRanks(
      3,
      [](int rank) {
        setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
        Bootstrap b(BootstrapConfig::fromEnv());
        b.barrier();
        if (rank == 2) {
          // Give the others time to enter the allGather, then die the hard way: no goodbye, no destructor.
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          raise(SIGKILL);
        }
        auto start = Clock::now();
        try {
          b.allGather(std::string(1000, 'x'));
        } catch (const Error& e) {
          std::fprintf(stderr, "child %d: got the expected error: %s\n", getpid(), e.what());
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed);
          CHILD_CHECK(std::string(e.what()).find("rank 2 ") != std::string::npos);
          CHILD_CHECK(msSince(start) < 5000);  // the EOF is reported at once, not after the 10 s timeout
          // The job is over: later calls fail the same way instead of hanging.
          try {
            b.barrier();
          } catch (const Error& again) {
            CHILD_CHECK(again.code() == ErrorCode::kPeerFailed);
            return 0;
          }
          return 1;
        }
        CHILD_CHECK(!"the allGather succeeded without rank 2");
        return 1;
      },
      60);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 128 + SIGKILL}));
}

TEST(Bootstrap, RankZeroKilledFailsTheOthers) {
  std::vector<int> codes = test::runRanks(
      2,
      [](int rank) {
        setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
        Bootstrap b(BootstrapConfig::fromEnv());
        b.barrier();
        if (rank == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          raise(SIGKILL);
        }
        auto start = Clock::now();
        try {
          b.barrier();
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed);
          CHILD_CHECK(std::string(e.what()).find("127.0.0.1:") != std::string::npos);
          CHILD_CHECK(msSince(start) < 5000);
          return 0;
        }
        return 1;
      },
      60);
  EXPECT_EQ(codes, (std::vector<int>{128 + SIGKILL, 0}));
}

TEST(Bootstrap, RankThatLeavesWhileOthersWaitIsNamed) {
  std::vector<int> codes = test::runRanks(
      2,
      [](int rank) {
        setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
        std::optional<Bootstrap> b;
        b.emplace(BootstrapConfig::fromEnv());
        b->barrier();
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          b.reset();  // a clean goodbye, but rank 0 is waiting in a barrier
          return 0;
        }
        try {
          b->barrier();
        } catch (const Error& e) {
          CHILD_CHECK(e.code() == ErrorCode::kPeerFailed);
          CHILD_CHECK(std::string(e.what()).find("rank 1 left the job") != std::string::npos);
          return 0;
        }
        return 1;
      },
      60);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Bootstrap, RankThatSkipsABarrierTimesOutTheOthers) {
  std::vector<int> codes = test::runRanks(
      2,
      [](int rank) {
        setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "1000", 1);
        Bootstrap b(BootstrapConfig::fromEnv());
        auto start = Clock::now();
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        try {
          b.barrier();
        } catch (const Error& e) {
          std::fprintf(stderr, "child %d: got the expected error: %s\n", getpid(), e.what());
          CHILD_CHECK(e.code() == ErrorCode::kTimeout);
          CHILD_CHECK(std::string(e.what()).find("rank 1 of 2 did not enter allGather/barrier #1") !=
                      std::string::npos);
          CHILD_CHECK(msSince(start) < 2500);
          return 0;
        }
        return 1;
      },
      60);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace gdx
