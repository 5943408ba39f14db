// Owned verbs objects and the few steps every RC connection needs: picking a device port and a GID, and the
// queue pair transitions RESET -> INIT -> RTR -> RTS (and -> ERR), each a named function with the attribute mask
// bits next to the fields they set. Also the page-aligned, zeroed host buffers the transport registers.
//
// Ownership: every ibv_* object is a unique_ptr with a deleter that logs (never throws) when destruction fails.
// Owners declare them in creation order, so C++ destroys them in reverse (memory regions and queue pairs before
// the completion queues they use, those before the protection domain, that before the device context).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gdx::verbs {

struct ContextDeleter {
  void operator()(ibv_context* p) const;
};
struct PdDeleter {
  void operator()(ibv_pd* p) const;
};
struct ChannelDeleter {
  void operator()(ibv_comp_channel* p) const;
};
struct CqDeleter {
  void operator()(ibv_cq* p) const;
};
struct QpDeleter {
  void operator()(ibv_qp* p) const;
};
struct MrDeleter {
  void operator()(ibv_mr* p) const;
};

using UniqueContext = std::unique_ptr<ibv_context, ContextDeleter>;
using UniquePd = std::unique_ptr<ibv_pd, PdDeleter>;
using UniqueChannel = std::unique_ptr<ibv_comp_channel, ChannelDeleter>;
using UniqueCq = std::unique_ptr<ibv_cq, CqDeleter>;
using UniqueQp = std::unique_ptr<ibv_qp, QpDeleter>;
using UniqueMr = std::unique_ptr<ibv_mr, MrDeleter>;

struct AlignedFree {
  void operator()(char* p) const;
};
/// Host memory from std::aligned_alloc, freed with std::free.
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;
/// A zeroed buffer of at least `bytes` (rounded up to whole 4 KiB pages), page-aligned as memory to register should
/// be. Throws gdx::SystemError when the allocation fails.
AlignedBuffer alignedBuffer(size_t bytes);

/// The device port this transport uses, as chosen by openPort().
struct PortInfo {
  std::string device;
  int port = 1;
  int gidIndex = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  bool ethernet = false;  ///< RoCE: addresses are GIDs (global routing); InfiniBand: LIDs
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t maxMsgBytes = 0;
  ibv_device_attr device_attr{};
};

/// Opens the first active port allowed by `hca` (NCCL_IB_HCA syntax) and picks its GID (`gidIndex` < 0: the first
/// RoCE v2 IPv4-mapped GID on Ethernet, 0 on InfiniBand). Throws gdx::Error(kVerbs) when none qualifies.
UniqueContext openPort(const std::string& hca, int gidIndex, PortInfo* info);

/// "a.b.c.d" for an IPv4-mapped GID, else the usual colon-separated hex.
std::string gidString(const ibv_gid& gid);

/// What one side tells the other to connect a queue pair to it.
struct QpAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
};

struct PathOptions {
  int port = 1;
  int gidIndex = 0;
  bool ethernet = false;
  int serviceLevel = 0;
  int trafficClass = 0;
  int timeout = 14;
  int retryCount = 7;
  int maxRdAtomic = 1;  ///< outstanding RDMA atomics (requester) and responder resources
};

void toInit(ibv_qp* qp, int port);
void toRtr(ibv_qp* qp, const QpAddress& remote, const PathOptions& path);
void toRts(ibv_qp* qp, uint32_t psn, const PathOptions& path);
/// Moves `qp` to the error state (every outstanding work request completes with a flush error); never throws,
/// returns the errno value (0 on success).
int toError(ibv_qp* qp);

}  // namespace gdx::verbs
