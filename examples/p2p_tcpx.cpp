// gdx::p2p::TcpxSession / TcpxTransfer (the TCPX P2P library's API over gdx's TCP transport) in one process: a server
// and a client session talking over loopback, as two processes on two hosts would; BYTES posted as chunks of
// UCCL_TCPX_CHUNK_BYTES, every byte checked. Usage: example_p2p_tcpx [BYTES]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "example_util.hpp"
#include "gdx/p2p/tcpx_session.hpp"

int main(int argc, char** argv) {
  example::handleHelp(argc, argv,
                      "gdx::p2p::TcpxSession and TcpxTransfer over loopback in one process: BYTES posted in chunks, "
                      "every byte checked.",
                      "[BYTES (default 4M; 64K, 1G, ...)]", 1);
  const size_t bytes = example::parseBytes(argc > 1 ? argv[1] : nullptr, size_t{4} << 20);
  const size_t chunk = 512 << 10;  // what each post moves (UCCL_TCPX_CHUNK_BYTES cuts larger posts alike)
  std::vector<unsigned char> sendBuf(bytes), recvBuf(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) sendBuf[i] = static_cast<unsigned char>(i * 131 + 7);
  return example::run("example_p2p_tcpx", [&] {
    const int gpu = -1;  // host memory here; a GPU index with cudaMalloc memory and gdx::p2p::kPtrCuda
    gdx::p2p::TcpxSession server(gpu, /*numChannels=*/2), client(gpu, 2);

    // [snippet:p2p-tcpx]
    std::string connInfo = server.listen();         // shipped to the client out of band
    client.loadRemoteConnInfo("server", connInfo);  // kInvalidArgument when it is not listen()'s text
    client.connect("server");                       // every channel, bounded by GDX_TIMEOUT_MS
    server.accept("client");                        // the client's channels, bounded by GDX_TIMEOUT_MS
    uint64_t recvMem = server.registerMemory(recvBuf.data(), bytes, gdx::p2p::kPtrHost, /*isRecv=*/true);
    uint64_t sendMem = client.registerMemory(sendBuf.data(), bytes, gdx::p2p::kPtrHost, /*isRecv=*/false);
    std::unique_ptr<gdx::p2p::TcpxTransfer> rx(server.createTransfer("client"));  // the caller owns a transfer
    std::unique_ptr<gdx::p2p::TcpxTransfer> tx(client.createTransfer("server"));
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      rx->postRecv(recvMem, offset, std::min(chunk, bytes - offset));  // sizes and order as the sender's
      tx->postSend(sendMem, offset, std::min(chunk, bytes - offset));
    }
    tx->wait();  // throws gdx::Error naming the peer, the post (mem_id, offset, size) and the piece
    rx->wait();
    rx->release();  // the transfer may be used again
    tx->release();
    // [end-snippet]

    const bool ok = std::memcmp(recvBuf.data(), sendBuf.data(), bytes) == 0;
    std::printf("TcpxSession, %zu bytes in %zu-byte posts over %d channels: %s\n", bytes, chunk, server.numChannels(),
                ok ? "every byte matches" : "MISMATCH");
    return ok ? 0 : 1;
  });
}
