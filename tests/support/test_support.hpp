// Helpers shared by the tests: random data, free ports, child processes.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "gdx/error.hpp"

/// In a child process (runRanks, runInChild): report a failed check on stderr and make the child exit non-zero.
#define CHILD_CHECK(cond)                                                                                 \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      std::fprintf(stderr, "child %d: check failed at %s:%d: %s\n", getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                                           \
    }                                                                                                     \
  } while (0)

namespace gdx::test {

/// The code of the gdx::Error that `f()` throws, or kOk when it returns.
template <typename F>
ErrorCode errorCodeOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

/// The message of the gdx::Error that `f()` throws (its code in *code), or "" when it returns (*code untouched).
template <typename F>
std::string errorOf(F&& f, ErrorCode* code) {
  try {
    f();
  } catch (const Error& e) {
    *code = e.code();
    return e.what();
  }
  return "";
}

/// In a child process: true when f() throws gdx::Error with `code` and a message containing every one of `parts`.
template <typename F>
bool throwsNaming(F&& f, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::fprintf(stderr, "child %d: got the expected error: %s\n", getpid(), e.what());
    if (e.code() != code) return false;
    for (const char* p : parts)
      if (std::string(e.what()).find(p) == std::string::npos) {
        std::fprintf(stderr, "child %d: the error does not name '%s'\n", getpid(), p);
        return false;
      }
    return true;
  }
  std::fprintf(stderr, "child %d: no error thrown\n", getpid());
  return false;
}

/// Fills `n` bytes with pseudo-random data from `seed` (xorshift; reproducible in every process).
void fillRandom(void* p, size_t n, uint64_t seed);
/// Index of the first byte where a and b differ, or -1.
long long firstMismatch(const void* a, const void* b, size_t n);

/// A TCP port on 127.0.0.1 that was free a moment ago.
int freePort();

/// Runs `body` in a forked child process; the child exits with body's return value (or 100 on an exception,
/// after printing it). Call before any thread exists in the parent.
pid_t forkChild(const std::function<int()>& body);
/// Waits (bounded) for a child; returns its exit code, 128+signal if killed, or -1 (and kills it) on timeout.
int waitChild(pid_t pid, int timeoutSec = 120);

/// Runs `ranks` processes of `body(rank)` with GDX_RANK/GDX_WORLD_SIZE/GDX_MASTER_ADDR/GDX_MASTER_PORT/
/// GDX_JOB_SECRET set for a fresh job, waits for all, and returns their exit codes.
std::vector<int> runRanks(int ranks, const std::function<int(int rank)>& body, int timeoutSec = 300);
/// Runs `body` as the single rank of a world of one (runRanks with one rank) and returns its exit code.
int runSolo(const std::function<int()>& body, int timeoutSec = 300);
/// runRanks with the master at `masterAddr` and `setup(rank)` run in each child first (entering a network
/// namespace, setting extra variables).
std::vector<int> runRanksWith(int ranks, const std::string& masterAddr, const std::function<void(int rank)>& setup,
                              const std::function<int(int rank)>& body, int timeoutSec = 300);

/// Sends this process's stderr (where gdx logs) to a file until restore() or destruction, so a test can read what
/// was logged.
class CapturedStderr {
 public:
  CapturedStderr();
  ~CapturedStderr() { restore(); }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  /// Restores stderr, copies what was captured to it and returns it (again on later calls).
  std::string restore();

 private:
  std::string path_;
  int saved_ = -1;
  std::string text_;
};

}  // namespace gdx::test
