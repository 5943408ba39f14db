// ConnectionPair: two p2p connections of one process joined over loopback TCP, for tests of what only a connection
// can show (tests/p2p_endpoint_test.cpp, tests/p2p_grants_test.cpp).
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <thread>

#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/pair_link.hpp"
#include "p2p/progress_pool.hpp"
#include "sockets/socket.hpp"

namespace gdx::test {

/// Two connections of this process joined over loopback TCP, each run by a progress pool of its own: an endpoint's
/// machinery without the endpoint, for what only a connection can show. Closed in the order an endpoint closes.
struct ConnectionPair {
  static constexpr uint64_t kTimeoutNs = 10ull * 1000 * 1000 * 1000;
  std::unique_ptr<p2p::ProgressPool> pool[2];
  std::shared_ptr<p2p::Connection> conn[2];
  /// Each connection's own transport (owned by the connection), for tests that act as a forged peer would: posting
  /// on it bypasses the connection's protocol (its keys, its grants).
  Transport* raw[2] = {nullptr, nullptr};

  ConnectionPair() {
    int port = 0;
    net::UniqueFd listener = net::listenOn("127.0.0.1", &port);
    p2p::PairLink link[2];
    std::thread dialler([&] {
      const net::Deadline deadline = net::deadlineIn(kTimeoutNs);
      std::string why;
      net::UniqueFd fd = net::connectTo(net::HostPort{"127.0.0.1", port}, deadline, &why);
      link[0] = p2p::dialLink(std::move(fd), -1, "tcp", kTimeoutNs, deadline, "dialling");
    });
    pollfd p{listener.get(), POLLIN, 0};
    ::poll(&p, 1, 10000);
    net::UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    link[1] = p2p::answerLink(std::move(fd), -1, "tcp", kTimeoutNs, net::deadlineIn(kTimeoutNs), "accepting");
    dialler.join();
    for (int i = 0; i < 2; ++i) {
      pool[i] = std::make_unique<p2p::ProgressPool>(1);
      raw[i] = link[i].transport.get();
      conn[i] = std::make_shared<p2p::Connection>(i + 1, std::move(link[i]), kTimeoutNs, pool[i]->waker(0));
    }
    std::thread starting([&] { conn[0]->start(); });  // connecting the transport is collective
    conn[1]->start();
    starting.join();
    for (int i = 0; i < 2; ++i) pool[i]->add(0, conn[i]);
  }
  ~ConnectionPair() {
    for (int i = 0; i < 2; ++i) {
      pool[i]->stop();
      pool[i]->remove(conn[i].get());
    }
    for (auto& c : conn) c.reset();
    for (auto& p : pool) p.reset();
  }
};

/// A transfer of `parts` pieces, due within the pair's timeout.
inline std::shared_ptr<p2p::Transfer> transfer(const char* what, int parts) {
  return std::make_shared<p2p::Transfer>(what, parts, nowNs() + ConnectionPair::kTimeoutNs);
}

/// Waits for `t`; the error code it ended with (kOk when it succeeded), and its message in *why.
inline ErrorCode outcome(const std::shared_ptr<p2p::Transfer>& t, std::string* why) {
  try {
    t->wait(t->deadlineNs() + 1000ull * 1000 * 1000);
    return ErrorCode::kOk;
  } catch (const Error& e) {
    *why = e.what();
    return e.code();
  }
}

}  // namespace gdx::test
