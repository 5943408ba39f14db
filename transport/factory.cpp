#include "transport/factory.hpp"

#include "gdx/error.hpp"

namespace gdx {

std::string transportKinds() {
#if defined(GDX_HAVE_VERBS)
  return "tcp, verbs, loopback";
#else
  return "tcp, loopback";
#endif
}

void checkTransportKind(const std::string& kind, int worldSize) {
  auto invalid = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); };
  if (kind == "tcp") return;
  if (kind == "loopback") {
    if (worldSize != 1)
      invalid("GDX_TRANSPORT=loopback needs a world of one rank, not " + std::to_string(worldSize) +
              " (this build has " + transportKinds() + ")");
    return;
  }
#if defined(GDX_HAVE_VERBS)
  if (kind == "verbs") return;
#else
  if (kind == "verbs")
    invalid("GDX_TRANSPORT=verbs: gdx was built without libibverbs (this build has " + transportKinds() + ")");
#endif
  invalid("GDX_TRANSPORT='" + kind + "' is not a known value; allowed: " + transportKinds());
}

std::unique_ptr<Transport> makeTransport(const std::string& kind, const TransportParams& params) {
  checkTransportKind(kind, params.worldSize);
  if (kind == "tcp") {
    TcpTransportOptions t = TcpTransportOptions::fromEnv(params.rank, params.worldSize, params.secret);
    if (params.socketsPerPeer > 0) t.socketsPerPeer = params.socketsPerPeer;
    if (params.chunkBytes > 0) t.chunkBytes = params.chunkBytes;
    t.bindAddress = params.bindAddress;
    t.timeoutNs = params.timeoutNs;
    t.inlineSendBytes = params.inlineSendBytes;
    return makeTcpTransport(t);
  }
  if (kind == "loopback") {
    LoopbackTransportOptions l = LoopbackTransportOptions::fromEnv();
    l.timeoutNs = params.timeoutNs;
    return makeLoopbackTransport(l);
  }
#if defined(GDX_HAVE_VERBS)
  VerbsTransportOptions v = VerbsTransportOptions::fromEnv(params.rank, params.worldSize);
  v.lanes = params.lanes;
  v.timeoutNs = params.timeoutNs;
  return makeVerbsTransport(v);
#else
  throw Error(ErrorCode::kInternal, "makeTransport: '" + kind + "' passed checkTransportKind");
#endif
}

}  // namespace gdx
