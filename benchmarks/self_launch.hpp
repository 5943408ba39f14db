// When a benchmark is started by hand (no GDX_RANK / RANK in the environment) it starts its own job: it runs
// `ranks` copies of itself with the bootstrap variables set for a fresh job on 127.0.0.1, waits for them and
// returns the worst exit code. Under torchrun/mpirun the variables are set and the program just runs.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace gdx::bench {

inline bool launchedByHand() {
  return !std::getenv("GDX_RANK") && !std::getenv("RANK");
}

inline int freeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

/// Waits for every child; the worst exit code (128 + signal for one killed).
inline int waitWorst(const std::vector<pid_t>& pids) {
  int worst = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc > worst) worst = rc;
  }
  return worst;
}

inline int runSelfAsJob(int ranks, char** argv) {
  std::string port = std::to_string(freeLoopbackPort());
  std::string secret = "bench-" + std::to_string(std::random_device{}()) + std::to_string(getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("GDX_RANK", std::to_string(r).c_str(), 1);
      setenv("GDX_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      setenv("GDX_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
      setenv("GDX_MASTER_PORT", port.c_str(), 1);
      setenv("GDX_JOB_SECRET", secret.c_str(), 1);
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  return waitWorst(pids);
}

/// A two-process benchmark started by hand (no --role): this program again as a server and a client on 127.0.0.1,
/// each with its own arguments plus `--role R --port PORT` (a free loopback port) and, for the server,
/// `serverExtra`; waits for both and returns the worst exit code.
inline int runServerAndClient(char** argv, const std::vector<std::string>& serverExtra = {}) {
  const std::string port = std::to_string(freeLoopbackPort());
  std::vector<pid_t> pids;
  for (const std::string role : {"server", "client"}) {
    std::vector<std::string> args;
    for (char** p = argv; *p; ++p) args.emplace_back(*p);
    args.insert(args.end(), {"--role", role, "--port", port});
    if (role == "server") args.insert(args.end(), serverExtra.begin(), serverExtra.end());
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> v;
      for (auto& s : args) v.push_back(&s[0]);
      v.push_back(nullptr);
      execv("/proc/self/exe", v.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  return waitWorst(pids);
}

}  // namespace gdx::bench
