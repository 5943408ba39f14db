#include "support/test_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace gdx::test {

void fillRandom(void* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(b + i, &x, 8);
  }
  for (; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = static_cast<unsigned char>(x);
  }
}

long long firstMismatch(const void* a, const void* b, size_t n) {
  if (std::memcmp(a, b, n) == 0) return -1;
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return static_cast<long long>(i);
  return -1;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

pid_t forkChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int rc = 100;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: exception: %s\n", getpid(), e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

int waitChild(pid_t pid, int timeoutSec) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(st)) return WEXITSTATUS(st);
      if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "child %d did not finish within %d s; killing it\n", pid, timeoutSec);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<int> runRanks(int ranks, const std::function<int(int rank)>& body, int timeoutSec) {
  return runRanksWith(
      ranks, "127.0.0.1", [](int) {}, body, timeoutSec);
}

int runSolo(const std::function<int()>& body, int timeoutSec) {
  return runRanks(
      1, [&](int) { return body(); }, timeoutSec)[0];
}

std::vector<int> runRanksWith(int ranks, const std::string& masterAddr, const std::function<void(int rank)>& setup,
                              const std::function<int(int rank)>& body, int timeoutSec) {
  int port = freePort();
  std::string secret = "test-secret-" + std::to_string(getpid()) + "-" + std::to_string(port);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pids.push_back(forkChild([&, r] {
      setenv("GDX_RANK", std::to_string(r).c_str(), 1);
      setenv("GDX_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("GDX_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("GDX_MASTER_ADDR", masterAddr.c_str(), 1);
      setenv("GDX_MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("GDX_JOB_SECRET", secret.c_str(), 1);
      setup(r);
      return body(r);
    }));
  }
  std::vector<int> codes;
  for (pid_t p : pids) codes.push_back(waitChild(p, timeoutSec));
  return codes;
}

CapturedStderr::CapturedStderr() : path_("/tmp/gdx_captured_stderr_" + std::to_string(getpid())) {
  std::fflush(stderr);
  saved_ = dup(STDERR_FILENO);
  int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  dup2(fd, STDERR_FILENO);
  ::close(fd);
}

std::string CapturedStderr::restore() {
  if (saved_ < 0) return text_;
  std::fflush(stderr);
  dup2(saved_, STDERR_FILENO);
  ::close(saved_);
  saved_ = -1;
  std::ifstream in(path_);
  std::stringstream ss;
  ss << in.rdbuf();
  text_ = ss.str();
  std::remove(path_.c_str());
  std::fprintf(stderr, "%s", text_.c_str());
  return text_;
}

}  // namespace gdx::test
