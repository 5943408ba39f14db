// Every launcher of the EP kernels, in one place and by topology: framework-free (raw device pointers in the argument
// structs, a cudaStream_t), each returning its launch's cudaError_t, so that the host side (ep/buffer.cpp,
// ep/low_latency.cpp) is the only code that knows tensors, handles or exceptions. The argument structs and the protocol
// they implement: ep/protocol.hpp (normal mode), ep/low_latency_protocol.hpp (low-latency mode).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ep/low_latency_protocol.hpp"
#include "ep/protocol.hpp"

namespace gdx::ep::detail {

// ---- normal mode: the ranks of this host over NVLink, other hosts through one relay each --------------------------
// One kernel per operation serves both topologies: it stores straight into the rows of the ranks of its host and
// stages what goes to another host for that host's relay (ep/normal_relay.cuh), which forwards it over its NVLink.

/// getDispatchLayout: tokens per rank and per expert (ep/normal_prepare.cu).
cudaError_t launchLayout(const Team& team, const LayoutArgs& a, cudaStream_t stream);
/// The routing of a dispatch and the exchange of its counts with every rank (ep/normal_prepare.cu).
cudaError_t launchPrepare(const Team& team, const PrepareArgs& a, cudaStream_t stream);
/// The dispatch, with the relay's forward of what other hosts sent this rank (ep/normal_dispatch.cu).
cudaError_t launchDispatch(const Team& team, const DispatchArgs& a, const Config& cfg, cudaStream_t stream);
/// The combine, with the relay's sum of the rows it sends back to other hosts (ep/normal_combine.cu).
cudaError_t launchCombine(const Team& team, const CombineArgs& a, const Config& cfg, cudaStream_t stream);
/// How many blocks of `numThreads` threads of the dispatch and of the combine kernel (the fewer) `device` runs at
/// once. Their blocks wait for each other's flags, so a launch of more blocks would wait for blocks that never start.
cudaError_t maxCoResidentBlocks(int device, int numThreads, int* out);
/// The occupancy of each of the two, per SM (what maxCoResidentBlocks takes the smaller of).
cudaError_t dispatchBlocksPerSm(int numThreads, int* out);
cudaError_t combineBlocksPerSm(int numThreads, int* out);

// ---- low-latency mode: one message per (token, rank), stored on this host, put through the proxy to others --------

/// gdx::ep::ll::dispatch: `phases` (LlPhase) its send phase, its receive phase or both (ep/low_latency_dispatch.cu).
cudaError_t launchLlDispatch(const LlTeam& team, const LlDispatchArgs& a, int phases, cudaStream_t stream);
/// gdx::ep::ll::combine, likewise (ep/low_latency_combine.cu).
cudaError_t launchLlCombine(const LlTeam& team, const LlCombineArgs& a, int phases, cudaStream_t stream);
/// Masks the ranks of `mask` (kMaskedByUser) and unmasks those of `unmask` that no kernel masked (the others stay
/// masked and are reported as kUnmaskRefused) (ep/low_latency_mask.cu).
cudaError_t launchLlSetMask(const LlTeam& team, uint32_t mask, uint32_t unmask, cudaStream_t stream);
/// out[r] = 1 when rank r is masked, else 0 (r < numRanks) (ep/low_latency_mask.cu).
cudaError_t launchLlQueryMask(const LlTeam& team, int32_t* out, cudaStream_t stream);
/// Whether the kernels were compiled for sm_90 or later, and so wait for the kernel before them (a build for an older
/// architecture run on sm_90 through its PTX has no wait): programmatic launch is used only then.
bool llKernelsWaitForPrevious();
/// The most blocks of `threads` threads of the dispatch and of the combine kernel that are resident on the current
/// device at once (a launch of both phases must not have a block wait for one that is not running yet); 0 when the
/// device cannot say.
int llMaxResidentBlocks(int threads);
/// The occupancy of each of the two, per SM (what llMaxResidentBlocks takes the smaller of).
cudaError_t llDispatchBlocksPerSm(int threads, int* out);
cudaError_t llCombineBlocksPerSm(int threads, int* out);

}  // namespace gdx::ep::detail
