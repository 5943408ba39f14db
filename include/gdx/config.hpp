// Settings read from the environment. Every variable gdx honours is a row of one table (base/config.cpp) that says
// its type, its bounds or allowed values and what it means; every read goes through the functions below, which check
// the value against that row, so that a bad value is refused with the variable's name, its value and what is allowed
// instead of being truncated, ignored or found deep inside a running job. README.md documents the same variables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace gdx {

/// How a variable's value is read.
enum class EnvKind {
  kInt,     ///< a decimal (or 0x hexadecimal) integer within [min, max]
  kBool,    ///< 0 / 1 (also false / true, no / yes, off / on)
  kChoice,  ///< one of `choices` (case-insensitive)
  kString,  ///< any text of at most `max` bytes
};

/// Extra conditions on a kInt value.
enum EnvFlags : unsigned {
  kEnvPowerOfTwo = 1u << 0,    ///< the value must be a power of two
  kEnvMultipleOf16 = 1u << 1,  ///< the value must be a multiple of 16
};

/// One variable gdx reads.
struct EnvVar {
  const char* name;
  EnvKind kind;
  int64_t min;           ///< kInt: smallest value allowed
  int64_t max;           ///< kInt: largest value allowed; kString: longest value in bytes
  unsigned flags;        ///< EnvFlags, for kInt
  const char* choices;   ///< kChoice: the allowed values, comma-separated
  const char* fallback;  ///< what applies when the variable is unset, in words
  const char* help;      ///< what it means
};

/// Every variable gdx reads (`count` rows), in the order of README's table.
const EnvVar* envVariables(size_t* count);
/// The row of `name`; throws gdx::Error(kInternal) for a variable missing from the table, so that none is read
/// without bounds.
const EnvVar& envVar(const char* name);

/// Integer variable, or `fallback` when unset or empty. A value that is not an integer, does not fit in 64 bits, lies
/// outside the row's bounds or breaks its flags throws gdx::Error(kInvalidArgument) naming the variable, the value
/// and what is allowed; the result is never truncated.
int64_t envInt(const char* name, int64_t fallback);
/// Boolean variable (kBool row), or `fallback` when unset or empty; anything else than the accepted words throws.
bool envBool(const char* name, bool fallback);
/// Enumerated variable (kChoice row), returned as spelled in the table, or `fallback` when unset or empty; a value
/// not in the list throws with the list.
std::string envChoice(const char* name, const std::string& fallback);
/// String variable, or `fallback` when unset or empty; a value longer than the row allows throws.
std::string envString(const char* name, const std::string& fallback);
/// The first of several variables that is set (e.g. GDX_RANK, then RANK), or nullptr when none is; every name must
/// be in the table.
const char* envFirstSet(std::initializer_list<const char*> names);
/// The value of the first of several string variables that is set; `fallback` when none is.
std::string envFirst(std::initializer_list<const char*> names, const std::string& fallback);

/// Checks every variable of the table that is set, without acting on any: a Context calls it before it joins the
/// job, so that a bad value ends this process at once instead of after the rendezvous (or never, for a variable
/// read only on some path). Throws one gdx::Error(kInvalidArgument) listing every bad variable with its value.
void checkEnvironment();

/// GDX_TIMEOUT_MS's default: the bound of every wait gdx makes, in nanoseconds (30 s).
constexpr uint64_t kDefaultTimeoutNs = uint64_t{30000} * 1000000;
/// Command rings for GPU producers per proxy thread when a GPU is present (GDX_DEVICE_RINGS_PER_THREAD).
constexpr int kDefaultDeviceRingsPerThread = 4;
/// The longest timeout a variable may set: a day, in milliseconds.
constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;

/// Bound for every wait gdx makes: GDX_TIMEOUT_MS, or kDefaultTimeoutNs when unset. The option structs' fromEnv()
/// read it here; a Context reads it once (ContextOptions::fromEnv) and passes its value to everything it builds.
uint64_t defaultTimeoutNs();

}  // namespace gdx
