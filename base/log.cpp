#include "gdx/detail/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gdx {
namespace {
std::atomic<int> gRank{-1};

LogLevel parseLevel() {
  const char* v = std::getenv("GDX_LOG_LEVEL");
  if (!v) return LogLevel::kWarn;
  if (!strcasecmp(v, "ERROR")) return LogLevel::kError;
  if (!strcasecmp(v, "INFO")) return LogLevel::kInfo;
  if (!strcasecmp(v, "DEBUG") || !strcasecmp(v, "TRACE")) return LogLevel::kDebug;
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
