// What the examples share: the bytes each rank sends, the check of every byte that arrived, sizes from the
// command line. Not part of gdx; copy what you need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gdx/device.hpp>  // GDX_HOST_DEVICE_INLINE: kernels compute the same bytes as the host
#include <gdx/error.hpp>
#include <stdexcept>
#include <string>

#include "size_arg.hpp"

namespace example {

/// Byte `i` of what `rank` sends: pseudo-random from (rank, seed, i), so the receiver recomputes what it expects
/// instead of trusting a second transfer, and a byte landing at the wrong offset or from the wrong rank shows.
GDX_HOST_DEVICE_INLINE unsigned char patternByte(int rank, uint64_t seed, uint64_t i) {
  uint64_t z = (i >> 3) + (uint64_t(rank) << 48) + seed * 0x9E3779B97F4A7C15ull;  // splitmix64 of one 8-byte word
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<unsigned char>(z >> (8 * (i & 7)));
}

inline void fillPattern(unsigned char* p, size_t bytes, int rank, uint64_t seed) {
  for (size_t i = 0; i < bytes; ++i) p[i] = patternByte(rank, seed, i);
}

/// Compares every byte of `got` with what rank `from` sent and prints one line for this rank. Returns the exit
/// code: 0 when all bytes match.
inline int checkAndReport(const char* what, int rank, int from, const unsigned char* got, size_t bytes, uint64_t seed) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i)
    if (got[i] != patternByte(from, seed, i) && bad++ == 0) first = i;
  if (bad == 0)
    std::printf("%s: rank %d received %zu bytes from rank %d, all correct\n", what, rank, bytes, from);
  else
    std::printf("%s: rank %d received %zu bytes from rank %d: %zu WRONG, the first at offset %zu\n", what, rank, bytes,
                from, bad, first);
  std::fflush(stdout);
  return bad == 0 ? 0 : 1;
}

/// `text` as a count ("4096", "64K", "4M", "1G": powers of 1024, size_arg.hpp); exits with 2, saying why, on
/// anything else and, with `atLeastOne`, on 0.
inline uint64_t parseCountOrExit(const char* text, bool atLeastOne) {
  try {
    const uint64_t n = parseSize(text);
    if (atLeastOne && n == 0) throw std::invalid_argument(std::string("'") + text + "' must be at least 1");
    return n;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(2);
  }
}

/// A size in bytes on the command line (at least 1); `fallback` when absent.
inline size_t parseBytes(const char* text, size_t fallback) {
  return text ? static_cast<size_t>(parseCountOrExit(text, true)) : fallback;
}

/// --help (or -h) prints `about` and the usage and exits 0; a flag the example does not know or more than
/// `maxArgs` arguments exit 2, before anything runs.
inline void handleHelp(int argc, char** argv, const char* about, const char* usage, int maxArgs) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool help = a == "-h" || a == "--help";
    if (help || a.rfind("-", 0) == 0 || i > maxArgs) {
      std::fprintf(help ? stdout : stderr, "%s%s\nusage: %s %s\n",
                   help ? "" : ("unknown argument '" + a + "'\n").c_str(), about, argv[0], usage);
      std::exit(help ? 0 : 2);
    }
  }
}

/// Throws gdx::Error(kInvalidArgument) unless the job has the ranks the example was written for.
inline void requireWorldSize(int worldSize, int needed) {
  if (worldSize != needed)
    throw gdx::Error(gdx::ErrorCode::kInvalidArgument,
                     "this example needs " + std::to_string(needed) + " ranks, not " + std::to_string(worldSize));
}

/// The examples' arguments: [BYTES (default 4M)] [SEED (default 1)].
struct Args {
  size_t bytes;
  uint64_t seed;
};
/// Reads [BYTES] [SEED]; --help prints `about` and the usage and exits 0, a flag it does not know exits 2.
inline Args parseArgs(int argc, char** argv, const char* about) {
  handleHelp(argc, argv, about, "[BYTES (default 4M; 64K, 1G, ...)] [SEED (default 1)]", 2);
  return {parseBytes(argc > 1 ? argv[1] : nullptr, size_t{4} << 20), argc > 2 ? parseCountOrExit(argv[2], false) : 1};
}

/// Runs an example's body: a gdx::Error (a timeout, a failed peer, a bad argument; its message names the rank and
/// the values it saw) is printed and becomes exit code 1.
template <typename Body>
int run(const char* name, Body&& body) {
  try {
    return body();
  } catch (const gdx::Error& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace example
