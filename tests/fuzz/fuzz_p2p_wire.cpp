// Fuzzes what a p2p endpoint decodes from other processes (p2p/): the first byte picks the decoder. Each must refuse
// the bytes with a reason or accept exactly what its encoder writes (encoding the value back gives the same bytes),
// and accepted values must pass the checks the endpoint relies on (ports, GPUs, ranges that fit in 64 bits, keys
// within their limits). Control messages come as a sequence, their key parts put together by a KeyAssembly beside a
// plain model of the pieces, so a key completed with a gap, out of order or of the wrong length aborts.
#include <map>

#include "fuzz_check.hpp"
#include "p2p/handshake.hpp"
#include "p2p/key_assembly.hpp"
#include "p2p/protocol.hpp"

using namespace gdx;
using namespace gdx::p2p;

namespace {

void controlMessages(fuzz::Input& in) {
  KeyAssembly assembly;
  std::map<uint32_t, std::string> model;  // the pieces of each window's key accepted since its first piece
  while (!in.empty()) {
    RemoteMessage msg;
    msg.peer = 1;
    msg.bytes = in.take<uint8_t>() % (kMaxMessageBytes + 1);
    const std::string body = in.bytes(msg.bytes);
    msg.bytes = static_cast<uint32_t>(body.size());
    std::memcpy(msg.data, body.data(), body.size());
    ControlMsg m;
    if (!decode(msg, &m).empty()) continue;
    const MessageOp again = encode(m, 1);
    GDX_FUZZ_CHECK(again.bytes == msg.bytes && std::memcmp(again.data, msg.data, msg.bytes) == 0);
    if (m.type != MsgType::kKeyPart) continue;
    bool complete = false;
    KeyAssembly::Key key;
    if (!assembly.add(m, &complete, &key).empty()) {
      GDX_FUZZ_CHECK(!complete);
      model.erase(m.window);
      continue;
    }
    GDX_FUZZ_CHECK(assembly.unfinished() <= KeyAssembly::kMaxUnfinished);
    std::string& pieces = model[m.window];
    if (m.keyAt == 0) pieces.clear();
    GDX_FUZZ_CHECK(pieces.size() == m.keyAt);  // accepted pieces continue each other
    pieces += m.keyPiece;
    if (complete) {
      GDX_FUZZ_CHECK(key.window == m.window && key.bytes == m.bytes && key.key.size() == m.keyTotal);
      GDX_FUZZ_CHECK(key.key == pieces && key.key.size() <= kMaxKeyBytes);
      model.erase(m.window);
    } else {
      GDX_FUZZ_CHECK(pieces.size() < m.keyTotal);
    }
  }
}

/// A key cut by splitKey() and sent as messages comes back whole, completed by its last piece only.
void keyRoundTrip(fuzz::Input& in) {
  const uint32_t window = in.take<uint32_t>();
  const uint64_t bytes = in.take<uint64_t>();
  const std::string key = in.bytes(in.take<uint16_t>() % (kMaxKeyBytes + 1));
  const std::vector<ControlMsg> parts = splitKey(window, key, bytes);
  KeyAssembly assembly;
  for (size_t i = 0; i < parts.size(); ++i) {
    const MessageOp op = encode(parts[i], 0);
    RemoteMessage msg;
    msg.peer = 0;
    msg.bytes = op.bytes;
    std::memcpy(msg.data, op.data, op.bytes);
    ControlMsg m;
    GDX_FUZZ_CHECK(decode(msg, &m).empty());
    bool complete = false;
    KeyAssembly::Key k;
    GDX_FUZZ_CHECK(assembly.add(m, &complete, &k).empty());
    GDX_FUZZ_CHECK(complete == (i + 1 == parts.size()));
    if (complete) GDX_FUZZ_CHECK(k.window == window && k.bytes == bytes && k.key == key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  switch (in.take<uint8_t>() % 7) {
    case 0: controlMessages(in); break;
    case 1: keyRoundTrip(in); break;
    case 2: {
      const std::string bytes = in.rest();
      Descriptor d;
      if (decodeDescriptor(bytes, &d).empty()) GDX_FUZZ_CHECK(encodeDescriptor(d) == bytes);
      break;
    }
    case 3: {
      const std::string bytes = in.rest();
      IpcDescriptor d;
      if (!decodeIpc(bytes, &d).empty()) break;
      GDX_FUZZ_CHECK(encodeIpc(d) == bytes && d.device >= 0 && d.offset + d.bytes >= d.offset);
      break;
    }
    case 4: {
      const std::string bytes = in.rest();
      EndpointAddress a;
      if (!decodeMetadata(bytes, &a).empty()) break;
      GDX_FUZZ_CHECK(encodeMetadata(a) == bytes && !a.ip.empty() && a.ip.size() <= kMaxMetadataIpBytes);
      GDX_FUZZ_CHECK(a.port >= 1 && a.port <= 65535 && a.gpu >= -1);
      break;
    }
    case 5: {
      const std::string bytes = in.rest();
      Hello h;
      if (!decodeHello(bytes, &h).empty()) break;
      GDX_FUZZ_CHECK(encodeHello(h) == bytes && h.gpu >= -1 && h.transport.size() <= kMaxTransportNameBytes);
      if (h.transport == "tcp")
        GDX_FUZZ_CHECK(h.sockets >= 1 && h.sockets <= kMaxLinkSockets && h.chunkBytes >= 1 &&
                       h.chunkBytes <= kMaxLinkChunkBytes);
      break;
    }
    default: {
      const std::string bytes = in.rest();
      Answer a;
      if (!decodeAnswer(bytes, &a).empty()) break;
      GDX_FUZZ_CHECK(encodeAnswer(a) == bytes && (!a.ok || a.gpu >= -1));
      break;
    }
  }
  return 0;
}
