// Multi-process GPU tests: the test binary re-executes itself once per rank (CUDA does not survive fork), each
// copy filtered to one child test and given the job's variables; the parent checks that every rank passed.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <functional>
#include <string>
#include <vector>

#include "support/test_support.hpp"

extern char** environ;

namespace gdx::test {

/// Runs ranks 0..n-1 of a job as copies of this binary running only `childTest`; `extraEnv(r)` adds variables
/// (GDX_CUDA_DEVICE, the child's selector, ...; they override the defaults). Each rank must exit 0.
inline void spawnRanks(int n, const std::string& childTest, const std::string& secret,
                       const std::function<std::vector<std::string>(int)>& extraEnv) {
  const std::string port = std::to_string(freePort());
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    // extraEnv's variables first: getenv finds the first of two entries, so they win over the defaults below.
    std::vector<std::string> env = extraEnv(r);
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back("GDX_RANK=" + std::to_string(r));
    env.push_back("GDX_WORLD_SIZE=" + std::to_string(n));
    env.push_back("GDX_LOCAL_RANK=" + std::to_string(r));
    env.push_back("GDX_MASTER_ADDR=127.0.0.1");
    env.push_back("GDX_MASTER_PORT=" + port);
    env.push_back("GDX_JOB_SECRET=" + secret);
    env.push_back("GDX_TIMEOUT_MS=60000");
    env.push_back("GDX_LOG_LEVEL=INFO");
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=" + childTest;
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << " failed (status " << st << ")";
  }
}

}  // namespace gdx::test
