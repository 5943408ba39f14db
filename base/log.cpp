#include "base/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "gdx/config.hpp"
#include "gdx/error.hpp"

namespace gdx {
namespace {
std::atomic<int> gRank{-1};

LogLevel parseLevel() {
  std::string v;
  try {
    v = envChoice("GDX_LOG_LEVEL", "WARN");
  } catch (const Error& e) {
    // Logging may start in a destructor or a thread, where throwing is no option: say it once and log warnings.
    // A Context refuses the value before it joins (checkEnvironment).
    std::fprintf(stderr, "[gdx WARN pid %d] %s; logging at WARN\n", getpid(), e.what());
    return LogLevel::kWarn;
  }
  if (v == "ERROR") return LogLevel::kError;
  if (v == "INFO") return LogLevel::kInfo;
  if (v == "DEBUG" || v == "TRACE") return LogLevel::kDebug;
  return LogLevel::kWarn;
}
const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
  }
  return "?";
}
}  // namespace

LogLevel logLevel() {
  static const LogLevel level = parseLevel();
  return level;
}

void setLogRank(int rank) {
  gRank.store(rank, std::memory_order_relaxed);
}

void logLine(LogLevel level, const std::string& message) {
  // One fprintf per line so that lines of different threads do not interleave.
  int rank = gRank.load(std::memory_order_relaxed);
  if (rank >= 0)
    std::fprintf(stderr, "[gdx %s rank %d pid %d] %s\n", levelName(level), rank, getpid(), message.c_str());
  else
    std::fprintf(stderr, "[gdx %s pid %d] %s\n", levelName(level), getpid(), message.c_str());
}

}  // namespace gdx
