// Helpers shared by the TCP transport tests (header-only): building and connecting worlds of transports in one
// process, bounded waits, and a raw socket that plays a misbehaving peer.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "transport/transport.hpp"

namespace gdx::test {

inline TcpTransportOptions tcpOptions(int rank, int world, int sockets, size_t chunk, int timeoutMs,
                                      const std::string& secret = "tcp-test-secret") {
  TcpTransportOptions o;
  o.rank = rank;
  o.worldSize = world;
  o.socketsPerPeer = sockets;
  o.chunkBytes = chunk;
  o.bindAddress = "127.0.0.1";
  o.secret = secret;
  o.timeoutNs = static_cast<uint64_t>(timeoutMs) * 1000000ull;
  return o;
}

/// A world of `world` TCP transports in this process (not yet connected).
inline std::vector<std::unique_ptr<Transport>> tcpWorld(int world, int sockets, size_t chunk, int timeoutMs = 20000) {
  std::vector<std::unique_ptr<Transport>> t;
  for (int r = 0; r < world; ++r) t.push_back(makeTcpTransport(tcpOptions(r, world, sockets, chunk, timeoutMs)));
  return t;
}

/// Calls connect() of every transport from its own thread (it is collective) and rethrows the first failure.
inline void connectAll(std::vector<std::unique_ptr<Transport>>& world, int lanes) {
  std::vector<std::string> addresses;
  for (auto& t : world) addresses.push_back(t->localAddress());
  std::vector<std::exception_ptr> errors(world.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < world.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        world[i]->connect(addresses, lanes);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Polls `pred` every millisecond until it holds or `timeoutMs` passed; returns whether it held.
inline bool waitFor(const std::function<bool()>& pred, int timeoutMs) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// Polls `lane` until `n` completions arrived or `timeoutMs` passed.
inline std::vector<Completion> pollCompletions(TransportLane& lane, size_t n, int timeoutMs) {
  std::vector<Completion> out;
  Completion buf[64];
  waitFor(
      [&] {
        size_t got = lane.poll(buf, 64);
        out.insert(out.end(), buf, buf + got);
        return out.size() >= n;
      },
      timeoutMs);
  return out;
}

/// One argument error of a posted op: how to spoil a valid op, and a phrase the message must contain.
template <typename Op>
struct BadArgument {
  const char* what;
  std::function<void(Op&)> mutate;
  const char* mentions;
};

/// Posts each spoiled copy of `good` through `post` and checks that it throws gdx::Error(kInvalidArgument) with a
/// message that names the problem and "rank 0" (the sender).
template <typename Op>
void expectInvalidArguments(const Op& good, const std::vector<BadArgument<Op>>& cases,
                            const std::function<void(const Op&)>& post) {
  for (auto& c : cases) {
    Op op = good;
    c.mutate(op);
    try {
      post(op);
      ADD_FAILURE() << c.what << ": no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << c.what;
      std::string msg = e.what();
      EXPECT_NE(msg.find(c.mentions), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    }
  }
}

/// A blocking client socket to "ip:port"; -1 on failure.
inline int rawConnect(const std::string& address) {
  auto colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool rawSend(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = ::send(fd, c, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// Receives exactly n bytes within timeoutMs; returns bytes received (short on EOF, error or timeout).
inline size_t rawRecv(int fd, void* p, size_t n, int timeoutMs) {
  auto* c = static_cast<char*>(p);
  size_t done = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (done < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    ssize_t got = ::recv(fd, c + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

/// True when the other end closed `fd` (EOF or reset) within timeoutMs; data still arriving is discarded.
inline bool rawClosed(int fd, int timeoutMs) {
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, 50);
    if (r <= 0) continue;
    ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

}  // namespace gdx::test
