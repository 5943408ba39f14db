// Where proxy threads run and where their rings live: one NUMA node and its CPUs. For a GPU the node is the
// one nearest its PCI bus id (hwloc); otherwise GDX_NUMA_NODE, else the node of the calling thread.
#pragma once

#include <string>
#include <vector>

#include "gdx/context_options.hpp"

namespace gdx {

/// The node nearest the PCI device with this bus id ("0000:17:00.0"); throws gdx::Error(kInvalidArgument)
/// when hwloc does not know the device.
Placement placementForPciBusId(const std::string& busId);
/// The given node; throws when it does not exist.
Placement placementForNode(int node);
/// GDX_NUMA_NODE when set, else the calling thread's node.
Placement defaultPlacement();
/// Restricts the calling thread to the placement's CPUs (no-op when the list is empty).
void pinCurrentThread(const Placement& placement);

}  // namespace gdx
