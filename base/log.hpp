// Minimal leveled logging to stderr. The level comes from GDX_LOG_LEVEL (ERROR, WARN, INFO, DEBUG; default
// WARN). Every line carries the rank when one is known, so interleaved output of several processes can be read.
#pragma once

#include <sstream>
#include <string>

namespace gdx {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel logLevel();
/// Set by the bootstrap once this process knows its rank; -1 until then.
void setLogRank(int rank);
void logLine(LogLevel level, const std::string& message);

}  // namespace gdx

#define GDX_LOG(level, expr)                                                               \
  do {                                                                                     \
    if (static_cast<int>(::gdx::LogLevel::level) <= static_cast<int>(::gdx::logLevel())) { \
      std::ostringstream gdx_log_os_;                                                      \
      gdx_log_os_ << expr;                                                                 \
      ::gdx::logLine(::gdx::LogLevel::level, gdx_log_os_.str());                           \
    }                                                                                      \
  } while (0)
#define GDX_ERROR(expr) GDX_LOG(kError, expr)
#define GDX_WARN(expr) GDX_LOG(kWarn, expr)
#define GDX_INFO(expr) GDX_LOG(kInfo, expr)
#define GDX_DEBUG(expr) GDX_LOG(kDebug, expr)
