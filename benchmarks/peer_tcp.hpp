// Peers of gdx's TCP transport, measured in the same run so that a plot (benchmarks/plot.py) shows gdx beside what
// the kernel's TCP gives without gdx: iperf3's bandwidth for one stream, and the one-way latency of a raw ping-pong
// over one loopback socket.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"

namespace gdx::bench {

struct Iperf3Result {
  std::string command;
  double gbPerSec = -1;  ///< received bytes per second / 1e9; -1 when it did not run
  std::string error;

  /// One line for the table's foot.
  std::string describe() const {
    return gbPerSec >= 0 ? "peer, same run: " + command + ": " + std::to_string(gbPerSec) + " GB/s"
                         : "peer: " + command + " did not run: " + error;
  }

  /// {"command":..., "gb_per_s":...} or {"command":..., "error":...}, the JSON member "peer_iperf3".
  std::string json() const {
    return "{\"command\":" + jsonString(command) +
           (gbPerSec >= 0 ? ",\"gb_per_s\":" + std::to_string(gbPerSec) : ",\"error\":" + jsonString(error)) + "}";
  }
};

/// Starts `iperf3 -s -1 -p port` (it serves one test, then exits) with its output discarded; -1 if fork failed.
inline pid_t startIperf3Server(int port) {
  std::fflush(nullptr);  // else the child would write this process's buffered output a second time
  const pid_t pid = fork();
  if (pid == 0) {
    const int devNull = open("/dev/null", O_WRONLY);
    dup2(devNull, STDOUT_FILENO);
    dup2(devNull, STDERR_FILENO);
    const std::string p = std::to_string(port);
    execlp("iperf3", "iperf3", "-s", "-1", "-p", p.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

/// Waits a few seconds for the server to leave after its one test, then ends it (it may never have been reached).
inline void reapIperf3Server(pid_t pid) {
  for (int i = 0; i < 50; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}

/// The number after `"key":` following `after` in iperf3's -J output (tabs and all); -1 if absent.
inline double iperf3Number(const std::string& json, const std::string& after, const std::string& key) {
  const size_t at = json.find("\"" + after + "\"");
  const size_t k = at == std::string::npos ? at : json.find("\"" + key + "\"", at);
  const size_t colon = k == std::string::npos ? k : json.find(':', k);
  return colon == std::string::npos ? -1 : std::strtod(json.c_str() + colon + 1, nullptr);
}

/// One test of `seconds` with `streams` parallel streams (-P) against a server at host:port, retried while that server
/// is starting.
inline Iperf3Result runIperf3Client(const std::string& host, int port, int seconds, int streams = 1) {
  Iperf3Result r;
  r.command = "iperf3 -c " + host + " -p " + std::to_string(port) + " -t " + std::to_string(seconds) +
              (streams > 1 ? " -P " + std::to_string(streams) : "");
  for (int attempt = 0; attempt < 20; ++attempt) {
    FILE* p = popen((r.command + " -J 2>&1").c_str(), "r");
    if (!p) break;
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    const double bps = iperf3Number(out, "sum_received", "bits_per_second");
    if (bps > 0) {
      r.gbPerSec = bps / 8 / 1e9;
      return r;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
      r.error = "iperf3 not found (Debian package iperf3)";
      return r;
    }
    const size_t e = out.find("\"error\"");
    r.error = e == std::string::npos ? "no result in iperf3's output" : out.substr(e, out.find('\n', e) - e);
    if (out.find("unable to connect") == std::string::npos) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

/// The end of a benchmark's report: the iperf3 line (when it ran) after the table, its "peer_iperf3" member, the
/// closing brace; `js` written to `path`, and said so.
inline void finishJson(std::ostringstream& js, const Iperf3Result* iperf3, const std::string& path) {
  if (iperf3) {
    std::printf("%s\n", iperf3->describe().c_str());
    js << ",\"peer_iperf3\":" << iperf3->json();
  }
  js << "}\n";
  std::ofstream(path) << js.str();
  std::printf("wrote %s\n", path.c_str());
}

/// iperf3 toward the host of a two-process benchmark's server with `streams` streams: on 127.0.0.1 against an
/// `iperf3 -s` started here for it; on another host against the `iperf3 -s` the user started there (port 5201).
inline Iperf3Result iperf3Toward(const std::string& host, int seconds, int streams) {
  const bool local = host == "127.0.0.1";
  const int port = local ? freeLoopbackPort() : 5201;
  const pid_t server = local ? startIperf3Server(port) : -1;
  Iperf3Result r = runIperf3Client(host, port, seconds, streams);
  if (server > 0) reapIperf3Server(server);
  return r;
}

/// iperf3 over loopback on this host: the bandwidth the kernel's TCP gives one stream, without gdx.
inline Iperf3Result iperf3Loopback(int seconds) {
  const int port = freeLoopbackPort();
  const pid_t server = startIperf3Server(port);
  Iperf3Result r = runIperf3Client("127.0.0.1", port, seconds);
  if (server > 0) reapIperf3Server(server);
  return r;
}

inline bool sendAll(int fd, const char* p, size_t n) {
  for (ssize_t k; n > 0; p += k, n -= size_t(k))
    if ((k = send(fd, p, n, MSG_NOSIGNAL)) <= 0) return false;
  return true;
}

inline bool recvAll(int fd, char* p, size_t n) {
  for (ssize_t k; n > 0; p += k, n -= size_t(k))
    if ((k = recv(fd, p, n, 0)) <= 0) return false;
  return true;
}

/// One-way latency in µs (half the round trip) of `bytes` sent over one loopback TCP connection (TCP_NODELAY) and
/// echoed back by a second thread: the kernel's share of a put with signal over gdx's TCP transport. -1 on error.
inline double tcpPingPongUs(size_t bytes, int iters) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(listener, 1);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  const bool connected = connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const int server = connected ? accept(listener, nullptr, nullptr) : -1;
  close(listener);
  const int one = 1;
  for (int fd : {client, server}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::thread echo([&] {
    std::vector<char> b(bytes);
    for (int i = 0; i < iters && server >= 0; ++i)
      if (!recvAll(server, b.data(), bytes) || !sendAll(server, b.data(), bytes)) break;
  });
  std::vector<char> b(bytes, 1);
  bool ok = server >= 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters && ok; ++i) ok = sendAll(client, b.data(), bytes) && recvAll(client, b.data(), bytes);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(client);  // ends the echo thread's recv if we stopped early
  echo.join();
  if (server >= 0) close(server);
  return ok ? s / iters / 2 * 1e6 : -1;
}

}  // namespace gdx::bench
