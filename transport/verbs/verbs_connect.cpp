// Connection setup of the verbs transport: each lane's queue pairs (one RC QP per peer, itself included, created
// with the lane), the address blob that carries their numbers, and the collective connect() that moves every QP
// through INIT, RTR and RTS towards the QP of the peer that addressed it.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "gdx/error.hpp"
#include "transport/verbs/verbs_transport.hpp"

namespace gdx::verbs {

VerbsLane::VerbsLane(VerbsTransport& t, int index) : t_(t), index_(index), copier_(t.options_.timeoutNs) {
  creditEnd_ = 64 + (static_cast<size_t>(t.world_) * kWordBytes + 63) / 64 * 64;
  const size_t bufferBytes = creditEnd_ + static_cast<size_t>(t.world_) * t.sendDepth_ * kControlSlotBytes;
  buffer_ = alignedBuffer(bufferBytes);
  mr_.reset(ibv_reg_mr(t.pd_.get(), buffer_.get(), bufferBytes, IBV_ACCESS_LOCAL_WRITE));
  if (!mr_) throw VerbsError("ibv_reg_mr (lane scratch)", errno, __FILE__, __LINE__);
  const int cqe = std::min(t.world_ * t.sendDepth_, t.port_.device_attr.max_cqe);
  // On the transport's completion channel (cq_context: this lane), so that the receiver thread, which waits on it
  // anyway, can wake a caller that armed the send CQ instead of polling it (armCompletion()).
  sendCq_.reset(ibv_create_cq(t.ctx_.get(), cqe, this, t.channel_.get(), 0));
  if (!sendCq_) throw VerbsError("ibv_create_cq (send, " + std::to_string(cqe) + ")", errno, __FILE__, __LINE__);
  std::random_device rd;
  qps_.resize(t.world_);
  for (int p = 0; p < t.world_; ++p) {
    ibv_qp_init_attr a{};
    a.send_cq = sendCq_.get();
    a.recv_cq = t.recvCq_.get();
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 0;
    a.cap.max_send_wr = static_cast<uint32_t>(t.sendDepth_);
    a.cap.max_recv_wr = static_cast<uint32_t>(t.recvDepth_);
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    // Room for a control message of any length inline; else what the device allows (0: no inline sends).
    for (uint32_t inlineBytes : {uint32_t{sizeof(MessageRecord)}, uint32_t{64}, uint32_t{0}}) {
      a.cap.max_inline_data = inlineBytes;
      qps_[p].qp.reset(ibv_create_qp(t.pd_.get(), &a));
      if (qps_[p].qp) break;
    }
    if (!qps_[p].qp) throw VerbsError("ibv_create_qp (RC)", errno, __FILE__, __LINE__);
    maxInline_ = a.cap.max_inline_data;
    qps_[p].psn = rd() & 0xffffff;
  }
  ops_.reserve(1024);
}

std::string VerbsTransport::makeAddress() const {
  AddressHeader h{};
  h.magic = kAddressMagic;
  h.rank = static_cast<uint32_t>(rank_);
  h.world = static_cast<uint32_t>(world_);
  h.lanes = static_cast<uint32_t>(options_.lanes);
  h.lid = port_.lid;
  h.mtu = static_cast<uint8_t>(port_.mtu);
  h.ethernet = port_.ethernet ? 1 : 0;
  std::memcpy(h.gid, port_.gid.raw, 16);
  std::vector<AddressEntry> entries;
  for (int l = 0; l < options_.lanes; ++l)
    for (int p = 0; p < world_; ++p) entries.push_back(AddressEntry{lanes_[l]->qp(p)->qp_num, lanes_[l]->psn(p)});
  return encodeAddress(h, entries.data(), entries.size());
}

void VerbsTransport::connect(const std::vector<std::string>& addresses, int lanes) {
  if (connectStarted_) throw Error(ErrorCode::kInvalidArgument, who() + ": connect() may be called once");
  if (static_cast<int>(addresses.size()) != world_)
    throw Error(ErrorCode::kInvalidArgument, who() + ": connect() got " + std::to_string(addresses.size()) +
                                                 " addresses for a world of " + std::to_string(world_));
  if (lanes < 1 || lanes > options_.lanes)
    throw Error(ErrorCode::kInvalidArgument, who() + ": " + std::to_string(lanes) + " lanes requested, " +
                                                 std::to_string(options_.lanes) +
                                                 " prepared (VerbsTransportOptions::lanes / GDX_PROXY_THREADS)");
  if (stopping_.load()) throw Error(ErrorCode::kShutdown, who() + ": connect() after shutdown()");
  connectStarted_ = true;
  std::vector<AddressHeader> headers(world_);
  for (int p = 0; p < world_; ++p) {
    std::string bad = decodeAddress(addresses[p], p, world_, lanes, port_.ethernet, &headers[p]);
    if (!bad.empty())
      throw Error(ErrorCode::kProtocol, who() + ": the address of rank " + std::to_string(p) +
                                            " is not a verbs address of this world with " + std::to_string(lanes) +
                                            " lanes (" + std::to_string(addresses[p].size()) + " bytes: " + bad + ")");
  }
  for (int l = 0; l < lanes; ++l)
    for (int p = 0; p < world_; ++p) {
      ibv_qp* qp = lanes_[l]->qp(p);
      toInit(qp, port_.port);
      for (int s = 0; s < recvDepth_; ++s) postReceive(l, p, static_cast<uint32_t>(s));
      const AddressHeader& h = headers[p];
      AddressEntry e = addressEntry(addresses[p], l, world_, rank_);
      QpAddress remote;
      remote.qpn = e.qpn;
      remote.psn = e.psn;
      remote.lid = h.lid;
      std::memcpy(remote.gid.raw, h.gid, 16);
      remote.mtu = static_cast<ibv_mtu>(std::min<int>(h.mtu, port_.mtu));
      toRtr(qp, remote, path_);
      toRts(qp, lanes_[l]->psn(p), path_);
    }
  numLanes_ = lanes;
  receiver_ = std::thread([this] { receiverLoop(); });
  connected_ = true;
}

}  // namespace gdx::verbs
