#include "gdx/config.hpp"

#include <cerrno>
#include <cstdlib>

#include "gdx/error.hpp"

namespace gdx {

int64_t envInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  if (errno != 0 || end == v || *end != '\0')
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + "='" + v + "' is not an integer");
  return x;
}

std::string envString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

std::string envFirst(std::initializer_list<const char*> names, const std::string& fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v && *v) return v;
  }
  return fallback;
}

uint64_t defaultTimeoutNs() {
  int64_t ms = envInt("GDX_TIMEOUT_MS", static_cast<int64_t>(kDefaultTimeoutNs / 1000000));
  if (ms <= 0) throw Error(ErrorCode::kInvalidArgument, "GDX_TIMEOUT_MS must be positive");
  return static_cast<uint64_t>(ms) * 1000000ull;
}

}  // namespace gdx
