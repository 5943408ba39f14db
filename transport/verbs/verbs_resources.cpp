#include "transport/verbs/verbs_resources.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/log.hpp"
#include "gdx/error.hpp"

namespace gdx::verbs {

void ContextDeleter::operator()(ibv_context* p) const {
  if (p && ibv_close_device(p) != 0) GDX_ERROR("ibv_close_device failed: " << std::strerror(errno));
}
void PdDeleter::operator()(ibv_pd* p) const {
  if (!p) return;
  if (int rc = ibv_dealloc_pd(p)) GDX_ERROR("ibv_dealloc_pd failed: " << std::strerror(rc));
}
void ChannelDeleter::operator()(ibv_comp_channel* p) const {
  if (!p) return;
  if (int rc = ibv_destroy_comp_channel(p)) GDX_ERROR("ibv_destroy_comp_channel failed: " << std::strerror(rc));
}
void CqDeleter::operator()(ibv_cq* p) const {
  if (!p) return;
  if (int rc = ibv_destroy_cq(p)) GDX_ERROR("ibv_destroy_cq failed: " << std::strerror(rc));
}
void QpDeleter::operator()(ibv_qp* p) const {
  if (!p) return;
  if (int rc = ibv_destroy_qp(p)) GDX_ERROR("ibv_destroy_qp failed: " << std::strerror(rc));
}
void MrDeleter::operator()(ibv_mr* p) const {
  if (!p) return;
  if (int rc = ibv_dereg_mr(p)) GDX_ERROR("ibv_dereg_mr failed: " << std::strerror(rc));
}
void AlignedFree::operator()(char* p) const {
  std::free(p);
}

AlignedBuffer alignedBuffer(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  char* p = static_cast<char*>(std::aligned_alloc(4096, rounded));
  if (!p) throw SystemError("aligned_alloc", ENOMEM, __FILE__, __LINE__);
  std::memset(p, 0, rounded);
  return AlignedBuffer(p);
}

namespace {

struct DeviceListDeleter {
  void operator()(ibv_device** l) const { ibv_free_device_list(l); }
};

/// One entry of an NCCL_IB_HCA-style list: a device name (prefix unless the list started with '='), optional port.
struct HcaFilter {
  std::string name;
  int port = -1;
};

struct HcaSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<HcaFilter> entries;
};

HcaSpec parseHca(const std::string& text) {
  HcaSpec spec;
  std::string s = text;
  if (!s.empty() && s[0] == '^') {
    spec.exclude = true;
    s = s.substr(1);
  }
  if (!s.empty() && s[0] == '=') {
    spec.exact = true;
    s = s.substr(1);
  }
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    HcaFilter f;
    size_t colon = item.find(':');
    f.name = item.substr(0, colon);
    if (colon != std::string::npos) {
      try {
        f.port = std::stoi(item.substr(colon + 1));
      } catch (const std::exception&) {
        throw Error(ErrorCode::kInvalidArgument, "GDX_IB_HCA: bad port in '" + item + "'");
      }
    }
    spec.entries.push_back(f);
  }
  return spec;
}

bool allowed(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.entries.empty()) return true;
  bool match = false;
  for (const HcaFilter& f : spec.entries) {
    bool nameOk = spec.exact ? device == f.name : device.compare(0, f.name.size(), f.name) == 0;
    if (nameOk && (f.port < 0 || f.port == port)) match = true;
  }
  return spec.exclude ? !match : match;
}

bool ipv4Mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, 12) == 0;
}

/// The GID index to use on an Ethernet port: the first RoCE v2 IPv4-mapped one, else the first RoCE v2, else -1.
int pickRoceGid(ibv_context* ctx, int port, int tableLength) {
  int firstV2 = -1;
  for (int i = 0; i < tableLength; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(ctx, port, i, &entry, 0) != 0) continue;
    if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    if (ipv4Mapped(entry.gid)) return i;
    if (firstV2 < 0) firstV2 = i;
  }
  return firstV2;
}

}  // namespace

std::string gidString(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ipv4Mapped(gid)) {
    inet_ntop(AF_INET, gid.raw + 12, buf, sizeof buf);
    return buf;
  }
  inet_ntop(AF_INET6, gid.raw, buf, sizeof buf);
  return buf;
}

UniqueContext openPort(const std::string& hca, int gidIndex, PortInfo* info) {
  HcaSpec spec = parseHca(hca);
  int num = 0;
  std::unique_ptr<ibv_device*, DeviceListDeleter> list(ibv_get_device_list(&num));
  if (!list)
    throw Error(ErrorCode::kVerbs,
                std::string("verbs: no RDMA devices (ibv_get_device_list: ") + std::strerror(errno) + ")");
  std::string seen;
  for (int d = 0; d < num; ++d) {
    const std::string name = ibv_get_device_name(list.get()[d]);
    UniqueContext ctx(ibv_open_device(list.get()[d]));
    if (!ctx) {
      GDX_WARN("verbs: cannot open " << name << ": " << std::strerror(errno));
      continue;
    }
    ibv_device_attr dev{};
    if (int rc = ibv_query_device(ctx.get(), &dev)) {
      GDX_WARN("verbs: ibv_query_device(" << name << ") failed: " << std::strerror(rc));
      continue;
    }
    for (int port = 1; port <= dev.phys_port_cnt; ++port) {
      ibv_port_attr pa{};
      if (ibv_query_port(ctx.get(), port, &pa) != 0) continue;
      seen += " " + name + ":" + std::to_string(port) + "(" + ibv_port_state_str(pa.state) + ")";
      if (pa.state != IBV_PORT_ACTIVE || !allowed(spec, name, port)) continue;
      PortInfo p;
      p.device = name;
      p.port = port;
      p.lid = pa.lid;
      p.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      p.mtu = pa.active_mtu;
      p.maxMsgBytes = pa.max_msg_sz;
      p.device_attr = dev;
      p.gidIndex = gidIndex;
      if (p.gidIndex < 0) p.gidIndex = p.ethernet ? pickRoceGid(ctx.get(), port, pa.gid_tbl_len) : 0;
      if (p.gidIndex < 0) {
        GDX_WARN("verbs: " << name << ":" << port << " has no RoCE v2 GID; skipped");
        continue;
      }
      if (int rc = ibv_query_gid(ctx.get(), port, p.gidIndex, &p.gid))
        throw VerbsError("ibv_query_gid(" + name + ", index " + std::to_string(p.gidIndex) + ")", rc, __FILE__,
                         __LINE__);
      *info = p;
      return ctx;
    }
  }
  throw Error(ErrorCode::kVerbs, "verbs: no active RDMA port" +
                                     (hca.empty() ? std::string() : " allowed by GDX_IB_HCA='" + hca + "'") +
                                     " (ports seen:" + (seen.empty() ? " none" : seen) + ")");
}

void toInit(ibv_qp* qp, int port) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT, mask |= IBV_QP_STATE;
  a.pkey_index = 0, mask |= IBV_QP_PKEY_INDEX;
  a.port_num = static_cast<uint8_t>(port), mask |= IBV_QP_PORT;
  a.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
  mask |= IBV_QP_ACCESS_FLAGS;
  GDX_IBV_CHECK(ibv_modify_qp(qp, &a, mask));
}

void toRtr(ibv_qp* qp, const QpAddress& remote, const PathOptions& path) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_RTR, mask |= IBV_QP_STATE;
  a.path_mtu = remote.mtu, mask |= IBV_QP_PATH_MTU;
  a.dest_qp_num = remote.qpn, mask |= IBV_QP_DEST_QPN;
  a.rq_psn = remote.psn, mask |= IBV_QP_RQ_PSN;
  a.max_dest_rd_atomic = static_cast<uint8_t>(path.maxRdAtomic), mask |= IBV_QP_MAX_DEST_RD_ATOMIC;
  a.min_rnr_timer = 12, mask |= IBV_QP_MIN_RNR_TIMER;  // 0.64 ms
  a.ah_attr.port_num = static_cast<uint8_t>(path.port), mask |= IBV_QP_AV;
  a.ah_attr.sl = static_cast<uint8_t>(path.serviceLevel);
  a.ah_attr.dlid = remote.lid;
  if (path.ethernet) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(path.gidIndex);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(path.trafficClass);
  }
  GDX_IBV_CHECK(ibv_modify_qp(qp, &a, mask));
}

void toRts(ibv_qp* qp, uint32_t psn, const PathOptions& path) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_RTS, mask |= IBV_QP_STATE;
  a.sq_psn = psn, mask |= IBV_QP_SQ_PSN;
  a.timeout = static_cast<uint8_t>(path.timeout), mask |= IBV_QP_TIMEOUT;
  a.retry_cnt = static_cast<uint8_t>(path.retryCount), mask |= IBV_QP_RETRY_CNT;
  a.rnr_retry = 7, mask |= IBV_QP_RNR_RETRY;  // the receiver thread reposts at once; wait for it
  a.max_rd_atomic = static_cast<uint8_t>(path.maxRdAtomic), mask |= IBV_QP_MAX_QP_RD_ATOMIC;
  GDX_IBV_CHECK(ibv_modify_qp(qp, &a, mask));
}

int toError(ibv_qp* qp) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_ERR, mask |= IBV_QP_STATE;
  return ibv_modify_qp(qp, &a, mask);
}

}  // namespace gdx::verbs
