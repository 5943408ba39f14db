// Helpers of the p2p tests (TCP on loopback here, verbs in the Soft-RoCE VM): a server and clients as separate
// processes, endpoints on 127.0.0.1 with a free port, and the out-of-band exchange of descriptors that a real
// application would do over its own channel (here: a two-sided message on the same connection).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gdx/p2p/endpoint.hpp"
#include "support/test_support.hpp"

namespace gdx::test {

/// An endpoint listening on 127.0.0.1:`port` (0: any) with `threads` progress threads.
inline p2p::EndpointOptions loopbackEndpoint(int port, int threads = 1) {
  p2p::EndpointOptions o = p2p::EndpointOptions::fromEnv(-1, threads);
  o.bindAddress = "127.0.0.1";
  o.port = port;
  return o;
}

/// Runs `server(port)` and `client(i, port)` for each of `clients` clients in their own processes; returns the exit
/// codes, the server's first.
inline std::vector<int> runServerClients(int clients, const std::function<int(int port)>& server,
                                         const std::function<int(int client, int port)>& client, int timeoutSec = 240) {
  const int port = freePort();
  std::vector<pid_t> pids{forkChild([&] { return server(port); })};
  for (int i = 0; i < clients; ++i) pids.push_back(forkChild([&, i] { return client(i, port); }));
  std::vector<int> codes;
  for (pid_t p : pids) codes.push_back(waitChild(p, timeoutSec));
  return codes;
}

/// Sends `blob` (a descriptor) to the peer of `conn` with a size-prefixed two-sided pair of messages.
inline void sendBlob(p2p::Endpoint& ep, uint64_t conn, const std::string& blob) {
  std::vector<char> buf(8 + blob.size() + 1);
  uint64_t n = blob.size();
  std::memcpy(buf.data(), &n, 8);
  std::memcpy(buf.data() + 8, blob.data(), blob.size());
  uint64_t mr = ep.reg(buf.data(), buf.size());
  ep.send(conn, mr, buf.data(), 8);
  if (n) ep.send(conn, mr, buf.data() + 8, n);
  ep.dereg(mr);
}

inline std::string recvBlob(p2p::Endpoint& ep, uint64_t conn) {
  uint64_t n = 0;
  uint64_t mr = ep.reg(&n, 8);
  ep.recv(conn, mr, &n, 8);
  ep.dereg(mr);
  std::string blob(n, '\0');
  if (n) {
    mr = ep.reg(&blob[0], n);
    ep.recv(conn, mr, &blob[0], n);
    ep.dereg(mr);
  }
  return blob;
}

/// An out-of-band channel between processes for a short text (a TcpxSession's connection info): written to `path`
/// whole (a rename), so that the reader never sees half of it.
inline void shipText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::rename(tmp.c_str(), path.c_str());
}

/// What shipText() wrote to `path`, waiting for it at most `timeoutMs`; "" when nothing came.
inline std::string awaitText(const std::string& path, int timeoutMs = 30000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return "";
}

/// A fresh path in /tmp for shipText(), unique to this process and `tag`.
inline std::string scratchPath(const std::string& tag) {
  static int n = 0;
  return "/tmp/gdx_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(++n);
}

}  // namespace gdx::test
