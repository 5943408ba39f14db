// The one parser of sizes and counts on the command line of gdx's programs (examples, benchmarks, their tests):
// decimal digits, then optionally K, M or G (also k/m/g, KiB/MiB/GiB), powers of 1024. "64K" is 65536; anything
// else ("", "-5", "0x10", "64KB", "4M ", a value past 2^64) is refused with a message naming the text. Not part of
// gdx; copy it if you need it.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace example {

inline uint64_t parseSize(const std::string& text) {
  const auto refuse = [&text](const char* why) {
    return std::invalid_argument("'" + text + "' is not a size (" + why + "; e.g. 4096, 64K, 4M, 1G)");
  };
  size_t i = 0;
  uint64_t n = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (n > (std::numeric_limits<uint64_t>::max() - digit) / 10) throw refuse("too large");
    n = n * 10 + digit;
  }
  if (i == 0) throw refuse("it does not start with a digit");
  const std::string unit = text.substr(i);
  int shift = -1;
  if (unit.empty()) shift = 0;
  if (unit == "K" || unit == "k" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "m" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "g" || unit == "GiB") shift = 30;
  if (shift < 0) throw refuse("unknown suffix; K, M or G may follow the digits");
  if (shift > 0 && n > (std::numeric_limits<uint64_t>::max() >> shift)) throw refuse("too large");
  return n << shift;
}

}  // namespace example
