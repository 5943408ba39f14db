// What every benchmark's JSON says about where and when it was measured, so that a plot of it
// (benchmarks/plot.py) can carry the machine and the date in its title.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>

namespace gdx::bench {

/// `s` as a JSON string literal, quotes included (GPU and CPU names are free text).
inline std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// Now, as ISO 8601 in UTC ("2026-11-21T08:39:12Z").
inline std::string isoDateUtc() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

inline std::string hostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

/// "hostname, CPU model, N CPUs". GDX_BENCH_MACHINE replaces it where the program cannot see the machine that
/// matters (the Soft-RoCE VM says what it runs on).
inline std::string hostMachine() {
  if (const char* m = std::getenv("GDX_BENCH_MACHINE")) return m;
  std::string model = "unknown CPU", line;
  std::ifstream cpuinfo("/proc/cpuinfo");
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return hostName() + ", " + model + ", " + std::to_string(std::thread::hardware_concurrency()) + " CPUs";
}

/// The JSON members after "benchmark": `,"machine":"...","date":"..."`.
inline std::string runInfoJson(const std::string& machine) {
  return ",\"machine\":" + jsonString(machine) + ",\"date\":" + jsonString(isoDateUtc());
}

}  // namespace gdx::bench
