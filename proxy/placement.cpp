#include "proxy/placement.hpp"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>

#include <memory>

#include "base/host_buffer.hpp"
#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

namespace gdx {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using Topology = std::unique_ptr<std::remove_pointer_t<hwloc_topology_t>, TopologyDeleter>;

Topology loadTopology(bool withPci) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) throw Error(ErrorCode::kSystem, "hwloc_topology_init failed");
  Topology topo(t);
  if (withPci) hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t) != 0) throw Error(ErrorCode::kSystem, "hwloc_topology_load failed");
  return topo;
}

// CPUs of `cpuset` that this process is allowed to run on.
std::vector<int> allowedCpus(hwloc_const_cpuset_t cpuset) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof mine, &mine);
  std::vector<int> cpus;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, cpuset) {
    if (i < CPU_SETSIZE && CPU_ISSET(i, &mine)) cpus.push_back(static_cast<int>(i));
  }
  hwloc_bitmap_foreach_end();
  return cpus;
}

}  // namespace

Placement placementForPciBusId(const std::string& busId) {
  Topology topo = loadTopology(true);
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo.get(), busId.c_str());
  if (!dev) throw Error(ErrorCode::kInvalidArgument, "hwloc does not know PCI device " + busId);
  hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(topo.get(), dev);
  Placement p;
  p.numaNode = 0;
  if (parent && parent->nodeset && !hwloc_bitmap_iszero(parent->nodeset))
    p.numaNode = hwloc_bitmap_first(parent->nodeset);
  if (parent && parent->cpuset) p.cpus = allowedCpus(parent->cpuset);
  p.reason = "nearest to PCI device " + busId;
  return p;
}

Placement placementForNode(int node) {
  Topology topo = loadTopology(false);
  hwloc_obj_t obj = nullptr;
  while ((obj = hwloc_get_next_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE, obj)) != nullptr) {
    if (static_cast<int>(obj->os_index) == node) {
      Placement p;
      p.numaNode = node;
      p.cpus = allowedCpus(obj->cpuset);
      p.reason = "NUMA node " + std::to_string(node);
      return p;
    }
  }
  throw Error(ErrorCode::kInvalidArgument, "NUMA node " + std::to_string(node) + " does not exist");
}

Placement defaultPlacement() {
  const int64_t node = envInt("GDX_NUMA_NODE", -1);
  if (node < 0) {
    Placement p = placementForNode(currentNumaNode());
    p.reason += " (the node of the calling thread)";
    return p;
  }
  try {
    Placement p = placementForNode(static_cast<int>(node));
    p.reason += " (GDX_NUMA_NODE)";
    return p;
  } catch (const Error& e) {
    throw Error(e.code(), "GDX_NUMA_NODE=" + std::to_string(node) + ": " + e.what());
  }
}

void pinCurrentThread(const Placement& placement) {
  if (placement.cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : placement.cpus) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) GDX_WARN("pinning a proxy thread to NUMA node " << placement.numaNode << " failed: errno " << rc);
}

}  // namespace gdx
