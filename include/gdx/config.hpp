// Settings read from the environment, in one place so that every variable gdx honours is listed here
// (README.md documents them).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace gdx {

/// Integer environment variable, or `fallback` when unset; a value that is not a number throws
/// gdx::Error(kInvalidArgument) naming the variable.
int64_t envInt(const char* name, int64_t fallback);
/// String environment variable, or `fallback` when unset or empty.
std::string envString(const char* name, const std::string& fallback);
/// The first of several variables that is set (e.g. GDX_RANK, then RANK); `fallback` when none is.
std::string envFirst(std::initializer_list<const char*> names, const std::string& fallback);

/// GDX_TIMEOUT_MS's default: the bound of every wait gdx makes, in nanoseconds (30 s).
constexpr uint64_t kDefaultTimeoutNs = uint64_t{30000} * 1000000;

/// Bound for every wait gdx makes: GDX_TIMEOUT_MS, or kDefaultTimeoutNs when unset. The option structs' fromEnv()
/// read it here; a Context reads it once (ContextOptions::fromEnv) and passes its value to everything it builds.
uint64_t defaultTimeoutNs();

}  // namespace gdx
