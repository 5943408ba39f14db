// Command-line flags of the benchmark programs, parsed one way: `--help` (or -h) prints the usage and exits 0, an
// unknown flag, a flag without its value or a value that does not parse prints what is wrong and the usage and
// exits 2 — before anything runs or any file is written.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/size_arg.hpp"

namespace gdx::bench {

struct Flag {
  std::string name;                             ///< "--json"
  std::string value;                            ///< what the value is ("FILE"); empty: a switch without a value
  std::string help;                             ///< one line
  std::function<void(const std::string&)> set;  ///< throws std::exception when the value does not parse
};

/// A non-negative integer with an optional K/M/G (or KiB/MiB/GiB) suffix, powers of 1024: the parser every
/// program shares (examples/size_arg.hpp); throws std::invalid_argument naming the text.
inline uint64_t parseCount(const std::string& v) {
  return example::parseSize(v);
}

inline void printUsage(std::FILE* to, const char* program, const std::string& about, const std::vector<Flag>& flags) {
  std::fprintf(to, "usage: %s [flags]\n%s\n\nflags:\n", program, about.c_str());
  for (const Flag& f : flags) {
    const std::string left = f.name + (f.value.empty() ? "" : " " + f.value);
    std::fprintf(to, "  %-24s %s\n", left.c_str(), f.help.c_str());
  }
  std::fprintf(to, "  %-24s %s\n", "-h, --help", "this text");
}

/// Applies argv to `flags`. Returns -1 when the program should run, else the exit code (0 after --help, 2 on an error).
inline int parseFlags(int argc, char** argv, const std::string& about, const std::vector<Flag>& flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      printUsage(stdout, argv[0], about, flags);
      return 0;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags)
      if (f.name == a) flag = &f;
    std::string error;
    if (!flag) {
      error = "unknown flag '" + a + "'";
    } else if (!flag->value.empty() && i + 1 >= argc) {
      error = a + " needs a value (" + flag->value + ")";
    } else {
      const std::string v = flag->value.empty() ? std::string() : argv[++i];
      try {
        flag->set(v);
      } catch (const std::exception& e) {
        error = a + " " + v + ": " + e.what();
      }
    }
    if (!error.empty()) {
      std::fprintf(stderr, "%s: %s\n", argv[0], error.c_str());
      printUsage(stderr, argv[0], about, flags);
      return 2;
    }
  }
  return -1;
}

// ---- --plot DIR: every benchmark draws its JSON with benchmarks/plot.py (PNG and SVG, gdx beside its peer) ------
#ifndef GDX_PLOT_SCRIPT
#define GDX_PLOT_SCRIPT "benchmarks/plot.py"  // CMake points this at the source tree's copy
#endif

inline Flag plotFlag(std::string& dir) {
  return {"--plot", "DIR", "after the JSON, draw it into DIR as PNG and SVG (benchmarks/plot.py, python3-matplotlib)",
          [&dir](const std::string& v) { dir = v; }};
}

inline std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs plot.py with `args`; its exit status, 127 when there is no python3.
inline int runPlotScript(const std::string& args) {
  std::fflush(stdout);  // the table first, then plot.py's lines
  const int status = std::system(("python3 " + shellQuote(GDX_PLOT_SCRIPT) + " " + args).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/// Before measuring, so that a long run is not wasted: 0 when plot.py can draw, else says why and returns 2.
inline int checkPlotter(const char* program) {
  const int rc = runPlotScript("--check");  // plot.py names the missing package itself
  if (rc == 127) std::fprintf(stderr, "%s: --plot needs python3 (Debian package python3-matplotlib)\n", program);
  return rc == 0 ? 0 : 2;
}

/// After the JSON is written: draws it into `dir`; 0, or 1 with a message.
inline int plotJson(const char* program, const std::string& json, const std::string& dir) {
  const int rc = runPlotScript("--out " + shellQuote(dir) + " " + shellQuote(json));
  if (rc != 0)
    std::fprintf(stderr, "%s: plotting %s into %s failed (plot.py exit %d)\n", program, json.c_str(), dir.c_str(), rc);
  return rc == 0 ? 0 : 1;
}

}  // namespace gdx::bench
