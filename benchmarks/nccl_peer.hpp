// The peer the GPU benchmarks measure beside gdx in the same run: NCCL through PyTorch, as a Python script whose
// stdout lines go to the benchmark's own reader. Bounded: a script that hangs (a stuck NCCL communicator, a rank that
// never joins) is killed after `boundSeconds`, and what it printed until then is kept.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace gdx::bench {

/// Writes `scriptText` to a temporary file, runs it as `python3 SCRIPT ARGS` (NCCL_NVLS_ENABLE=0) and hands its
/// output to `readLines(std::istream&)`; a failure or timeout of the script is reported on stderr, not thrown.
template <typename ReadLines>
void runNcclPeer(const std::string& name, const char* scriptText, const std::string& args, ReadLines&& readLines,
                 int boundSeconds = 900) {
  const std::string script = "/tmp/gdx_" + name + "_nccl_" + std::to_string(getpid()) + ".py";
  std::ofstream(script) << scriptText;
  const std::string cmd =
      "NCCL_NVLS_ENABLE=0 timeout --kill-after=10 " + std::to_string(boundSeconds) + " python3 " + script + " " + args;
  std::fprintf(stderr, "NCCL through PyTorch: %s\n", cmd.c_str());
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::string all;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) all += buf;
    const int prc = pclose(p);
    std::istringstream in(all);
    readLines(in);
    const int code = WIFEXITED(prc) ? WEXITSTATUS(prc) : prc;
    if (code == 124)
      std::fprintf(stderr, "NCCL script killed after %d s (results so far kept)\n", boundSeconds);
    else if (code != 0)
      std::fprintf(stderr, "NCCL script exited with %d (results so far kept)\n", code);
  }
  std::remove(script.c_str());
}

}  // namespace gdx::bench
