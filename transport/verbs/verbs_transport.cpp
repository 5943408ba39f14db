// VerbsTransport: options, construction (device, protection domain, receive completion queue, lanes), peer
// failure and shutdown. The protocol is described in verbs_transport.hpp, which also says where the rest lives.
#include "transport/verbs/verbs_transport.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

namespace gdx {

VerbsTransportOptions VerbsTransportOptions::fromEnv(int rank, int worldSize) {
  VerbsTransportOptions o;
  o.rank = rank;
  o.worldSize = worldSize;
  o.lanes = static_cast<int>(envInt("GDX_PROXY_THREADS", o.lanes));
  o.hca = envString("GDX_IB_HCA", "");
  o.fault = envString("GDX_FAULT", "");
  o.gidIndex = static_cast<int>(envInt("GDX_IB_GID_INDEX", o.gidIndex));
  o.serviceLevel = static_cast<int>(envInt("GDX_IB_SL", o.serviceLevel));
  o.trafficClass = static_cast<int>(envInt("GDX_IB_TC", o.trafficClass));
  o.sendDepth = static_cast<int>(envInt("GDX_IB_SEND_DEPTH", o.sendDepth));
  o.recvDepth = static_cast<int>(envInt("GDX_IB_RECV_DEPTH", o.recvDepth));
  o.timeout = static_cast<int>(envInt("GDX_IB_TIMEOUT", o.timeout));
  o.retryCount = static_cast<int>(envInt("GDX_IB_RETRY_CNT", o.retryCount));
  o.nativeAtomics = envBool("GDX_IB_NATIVE_ATOMICS", false);
  o.signalEvery = static_cast<int>(envInt("GDX_IB_SIGNAL_EVERY", o.signalEvery));
  o.stageAllWindows = envBool("GDX_IB_FORCE_STAGING", false);
  o.timeoutNs = defaultTimeoutNs();
  return o;
}

std::unique_ptr<Transport> makeVerbsTransport(const VerbsTransportOptions& options) {
  return std::make_unique<verbs::VerbsTransport>(options);
}

namespace verbs {

VerbsTransport::VerbsTransport(const VerbsTransportOptions& o)
    : options_(o),
      rank_(o.rank),
      world_(o.worldSize),
      fault_(common::FaultPlan::parse(o.fault, o.worldSize)),
      rxCopier_(o.timeoutNs) {
  if (fault_.plan().action != common::FaultAction::kNone)
    GDX_WARN("verbs transport rank " << rank_ << ": will " << fault_.plan().describe());
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw Error(ErrorCode::kInvalidArgument, "verbs transport: rank " + std::to_string(rank_) + " of world " +
                                                 std::to_string(world_) + " is not valid");
  if (o.lanes < 1 || o.lanes > 64)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": lanes (GDX_PROXY_THREADS) " + std::to_string(o.lanes) + " not in [1, 64]");
  if (o.sendDepth < 1 || o.recvDepth < 1 || o.signalEvery < 1 || o.timeoutNs == 0)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": sendDepth " + std::to_string(o.sendDepth) + " (GDX_IB_SEND_DEPTH), recvDepth " +
                    std::to_string(o.recvDepth) + " (GDX_IB_RECV_DEPTH), signalEvery " + std::to_string(o.signalEvery) +
                    " (GDX_IB_SIGNAL_EVERY) and timeoutNs (GDX_TIMEOUT_MS) must be positive");
  peerFailed_.reset(new std::atomic<bool>[world_]);
  for (int p = 0; p < world_; ++p) peerFailed_[p].store(false);
  heardNs_.reset(new std::atomic<uint64_t>[world_]);
  for (int p = 0; p < world_; ++p) heardNs_[p].store(0);
  windows_.setPeers(world_);

  ctx_ = openPort(o.hca, o.gidIndex, &port_);
  const ibv_device_attr& dev = port_.device_attr;
  sendDepth_ = std::min(o.sendDepth, dev.max_qp_wr);
  recvDepth_ = std::min(o.recvDepth, dev.max_qp_wr);
  nativeAtomics_ = o.nativeAtomics && dev.atomic_cap != IBV_ATOMIC_NONE;
  path_.port = port_.port;
  path_.gidIndex = port_.gidIndex;
  path_.ethernet = port_.ethernet;
  path_.serviceLevel = o.serviceLevel;
  path_.trafficClass = o.trafficClass;
  path_.timeout = o.timeout;
  path_.retryCount = o.retryCount;
  path_.maxRdAtomic = std::max(1, std::min({dev.max_qp_rd_atom, dev.max_qp_init_rd_atom, 16}));

  pd_.reset(ibv_alloc_pd(ctx_.get()));
  if (!pd_) throw VerbsError("ibv_alloc_pd", errno, __FILE__, __LINE__);
  channel_.reset(ibv_create_comp_channel(ctx_.get()));
  if (!channel_) throw VerbsError("ibv_create_comp_channel", errno, __FILE__, __LINE__);
  // Non-blocking: the receiver thread poll()s the fd and then takes every waiting event without blocking.
  if (int flags = fcntl(channel_->fd, F_GETFL); flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    throw VerbsError("fcntl(O_NONBLOCK) on the completion channel", errno, __FILE__, __LINE__);
  const size_t qpsTotal = static_cast<size_t>(o.lanes) * world_;
  const int recvCqe = static_cast<int>(std::min<size_t>(qpsTotal * recvDepth_, dev.max_cqe));
  recvCq_.reset(ibv_create_cq(ctx_.get(), recvCqe, nullptr, channel_.get(), 0));
  if (!recvCq_) throw VerbsError("ibv_create_cq (receive, " + std::to_string(recvCqe) + ")", errno, __FILE__, __LINE__);
  recvBuffer_ = alignedBuffer(qpsTotal * recvDepth_ * kRecvSlotBytes);
  recvMr_.reset(
      ibv_reg_mr(pd_.get(), recvBuffer_.get(), qpsTotal * recvDepth_ * kRecvSlotBytes, IBV_ACCESS_LOCAL_WRITE));
  if (!recvMr_) throw VerbsError("ibv_reg_mr (receive slots)", errno, __FILE__, __LINE__);
  for (int l = 0; l < o.lanes; ++l) lanes_.push_back(std::make_unique<VerbsLane>(*this, l));

  address_ = makeAddress();
  GDX_INFO(who() << ": device " << port_.device << " port " << port_.port << ", GID index " << port_.gidIndex << " ("
                 << gidString(port_.gid) << "), " << (port_.ethernet ? "RoCE v2" : "InfiniBand")
                 << (port_.ethernet ? "" : " LID " + std::to_string(port_.lid)) << ", MTU " << (128 << port_.mtu)
                 << ", send depth " << sendDepth_ << ", max inline " << lanes_[0]->maxInline() << ", atomics "
                 << (nativeAtomics_ ? "native fetch-and-add" : "software (receiver thread)"));
}

TransportLane& VerbsTransport::lane(int index) {
  if (!connected_ || index < 0 || index >= numLanes_)
    throw Error(ErrorCode::kInvalidArgument, who() + ": lane " + std::to_string(index) + " does not exist (" +
                                                 std::to_string(numLanes()) + " lanes connected)");
  return *lanes_[index];
}

void VerbsTransport::failPeer(int peer, const std::string& why) {
  if (peerFailed_[peer].exchange(true)) return;
  for (auto& l : lanes_)
    if (int rc = l->qp(peer) ? toError(l->qp(peer)) : 0; rc != 0)
      GDX_WARN(who() << ": moving the QP to rank " << peer << " to the error state failed: " << std::strerror(rc));
  if (stopping_.load()) return;
  GDX_ERROR(who() << ": rank " << peer << " failed: " << why);
  failureHandler_.notify(peer, why);
}

void VerbsTransport::shutdown() {
  std::lock_guard<std::mutex> lock(shutdownMutex_);
  if (shutDown_) return;
  shutDown_ = true;
  stopping_.store(true);
  rxStop_.store(true, std::memory_order_release);
  if (receiver_.joinable()) receiver_.join();
  // Destroying the QPs is the goodbye: a peer still writing sees its work requests fail and marks this rank failed.
  // The lanes stay (a caller may still hold one); everything they had pending completes with kShutdown.
  for (int p = 0; p < world_; ++p) peerFailed_[p].store(true);
  for (auto& l : lanes_) l->abandon();
  {
    std::unique_lock<std::shared_mutex> wl(windows_.mutex());
    windows_.clearLocal();
  }
}

}  // namespace verbs
}  // namespace gdx
