// The small kernels of the low-latency mode's masks: LowLatencyBuffer::updateMask / cleanMask (set and clear bits of
// LlState::mask, refusing to unmask a rank a call's wait masked) and queryMask. They follow the stream's previous
// kernel as the dispatch and the combine do (ep/low_latency_device.cuh, followPreviousKernel).
#include "ep/launchers.hpp"
#include "ep/low_latency_device.cuh"

namespace gdx::ep::detail {
namespace {

/// Masks (kMaskedByUser) the ranks of `mask`, unmasks those of `unmask` unless a kernel masked them (failedMask: they
/// stay masked, reported as kUnmaskRefused). One thread: the masks are small.
__global__ void llSetMask(LlTeam lt, uint32_t mask, uint32_t unmask) {
  followPreviousKernel(lt.nextKernelEarly);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const uint32_t failed = atomicLoad(&lt.ll->failedMask, kRelaxed), refused = unmask & failed;
  unmask &= ~failed;
  atomicOr(&lt.ll->mask, mask);
  atomicAnd(&lt.ll->mask, ~unmask);
  for (int r = 0; r < lt.t.numRanks; ++r) {
    if ((mask >> r) & 1u && !((failed >> r) & 1u)) lt.maskHost[r] = kMaskedByUser;
    if ((unmask >> r) & 1u) lt.maskHost[r] = 0;
  }
  if (refused) report(lt.t, kUnmaskRefused, 0, __ffs(refused) - 1, refused, 0, lt.ll->sendSeq);
}

__global__ void llQueryMask(LlTeam lt, int32_t* out) {
  followPreviousKernel(lt.nextKernelEarly);
  const uint32_t mask = atomicLoad(&lt.ll->mask, kRelaxed);
  for (int r = threadIdx.x; r < lt.t.numRanks; r += blockDim.x) out[r] = int32_t((mask >> r) & 1u);
}

}  // namespace

cudaError_t launchLlSetMask(const LlTeam& team, uint32_t mask, uint32_t unmask, cudaStream_t stream) {
  return launchLlKernel(llSetMask, team, 1, 32, stream, team, mask, unmask);
}
cudaError_t launchLlQueryMask(const LlTeam& team, int32_t* out, cudaStream_t stream) {
  return launchLlKernel(llQueryMask, team, 1, 32, stream, team, out);
}

}  // namespace gdx::ep::detail
