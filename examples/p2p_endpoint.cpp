// gdx::p2p::Endpoint, UrlTransport and RdmaTransport in one process (two endpoints talking over loopback, as two
// processes on two hosts would): a send/recv, a one-sided write into an advertised range, a notified UrlTransport
// write, and the same through RdmaTransport's seed names with both sides connected from one thread; every byte
// checked. Usage: example_p2p_endpoint [BYTES]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "example_util.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "gdx/p2p/rdma_transport.hpp"
#include "gdx/p2p/url_transport.hpp"

/// The seed's ping-pong under RdmaTransport's names: both transports connected from this thread, one notified write.
bool rdmaPingPong(std::vector<unsigned char>& sendBuf, std::vector<unsigned char>& recvBuf) {
  const size_t bytes = sendBuf.size();
  // [snippet:p2p-rdma]
  gdx::p2p::ScopedEventBaseThread evbThread;  // the thread where completions are delivered
  gdx::p2p::RdmaTransport server(/*cudaDev=*/-1, evbThread.getEventBase()), client(-1, evbThread.getEventBase());
  const std::string serverUrl = server.bind(), clientUrl = client.bind();
  server.connect(clientUrl);  // returns at once: both sides may connect from one thread, in either order
  client.connect(serverUrl);
  gdx::p2p::RdmaMemory serverMem(sendBuf.data(), bytes, -1), clientMem(recvBuf.data(), bytes, -1);
  gdx::p2p::RdmaRemoteBuffer clientRemote{recvBuf.data(), clientMem.remoteKey()};
  auto writeFuture = server.write(serverMem.createView(sendBuf.data(), bytes), clientRemote, /*notify=*/true);
  auto waitFuture = client.waitForWrite();  // resolves once the notified write is in place
  bool pinged = writeFuture.get() == gdx::p2p::commSuccess && waitFuture.get() == gdx::p2p::commSuccess;
  // [end-snippet]
  return pinged;
}

int main(int argc, char** argv) {
  example::handleHelp(argc, argv,
                      "gdx::p2p::Endpoint, UrlTransport and RdmaTransport over loopback in one process: send/recv, "
                      "a one-sided write, notified URL writes; every byte checked.",
                      "[BYTES (default 1M; 64K, 1G, ...)]", 1);
  const size_t bytes = example::parseBytes(argc > 1 ? argv[1] : nullptr, size_t{1} << 20);
  std::vector<unsigned char> sendBuf(bytes), recvBuf(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) sendBuf[i] = static_cast<unsigned char>(i * 131 + 7);
  gdx::p2p::EndpointOptions options = gdx::p2p::EndpointOptions::fromEnv(/*localGpu=*/-1, /*numCpus=*/1);
  options.port = 0;  // any free port: this example runs beside other tests
  gdx::p2p::Endpoint server(options), client(options);
  server.startPassiveAccept();
  // [snippet:p2p-endpoint]
  uint64_t conn = client.addRemoteEndpoint(server.metadata());  // connects once; metadata() = ip, port, GPU
  gdx::p2p::Accepted peer = server.accept();                    // {ip, remoteGpu, connId}
  uint64_t sendMr = client.reg(sendBuf.data(), bytes);          // host or cudaMalloc memory
  uint64_t recvMr = server.reg(recvBuf.data(), bytes);
  uint64_t pending = server.recvAsync(peer.connId, recvMr, recvBuf.data(), bytes);  // a message of at most bytes
  client.send(conn, sendMr, sendBuf.data(), bytes);
  std::vector<size_t> received;     // the size of the message the receive got
  server.wait(pending, &received);  // bounded by GDX_TIMEOUT_MS; throws gdx::Error naming the connection and why
  // One-sided: the server lets the client write the second half of recvBuf, the client writes into it.
  std::string descriptor = server.advertise(peer.connId, recvMr, recvBuf.data() + bytes / 2, bytes - bytes / 2);
  client.write(conn, sendMr, sendBuf.data(), bytes - bytes / 2, descriptor);  // returns once the data is there
  // [end-snippet]
  bool ok = received == std::vector<size_t>{bytes} && std::memcmp(recvBuf.data(), sendBuf.data(), bytes / 2) == 0 &&
            std::memcmp(recvBuf.data() + bytes / 2, sendBuf.data(), bytes - bytes / 2) == 0;

  // [snippet:p2p-url]
  gdx::p2p::UrlTransport a, b;
  const std::string urlA = a.bind(), urlB = b.bind();  // each side gives its URL to the other
  gdx::p2p::RegisteredMemory src(sendBuf.data(), bytes), dst(recvBuf.data(), bytes);  // RAII registration
  std::thread other([&] { b.connect(urlA); });  // both connect() calls wait for each other
  a.connect(urlB);
  other.join();
  gdx::p2p::RemoteBuffer remote{recvBuf.data(), dst.remoteKey()};  // the peer's address and key
  std::future<gdx::Status> written = a.write(src.view(0, bytes), remote, /*notify=*/true);
  bool arrived = b.waitForWrite().get() == gdx::Status::kOk;  // resolves once the notified write is in place
  // [end-snippet]
  ok = ok && arrived && written.get() == gdx::Status::kOk && std::memcmp(recvBuf.data(), sendBuf.data(), bytes) == 0;

  std::fill(recvBuf.begin(), recvBuf.end(), 0);
  ok = ok && rdmaPingPong(sendBuf, recvBuf) && std::memcmp(recvBuf.data(), sendBuf.data(), bytes) == 0;
  std::printf("p2p endpoint and URL transport, %zu bytes: %s\n", bytes, ok ? "every byte matches" : "MISMATCH");
  return ok ? 0 : 1;
}
