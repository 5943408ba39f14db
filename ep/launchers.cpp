// The queries of ep/launchers.hpp that span two kernels: each kernel's own occupancy is asked for in its file (only
// there is the kernel a symbol), and the smaller of the two is taken here.
#include "ep/launchers.hpp"

#include <algorithm>

namespace gdx::ep::detail {

cudaError_t maxCoResidentBlocks(int device, int numThreads, int* out) {
  int sms = 0, dispatchPerSm = 0, combinePerSm = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = dispatchBlocksPerSm(numThreads, &dispatchPerSm);
  if (e == cudaSuccess) e = combineBlocksPerSm(numThreads, &combinePerSm);
  *out = sms * std::min(dispatchPerSm, combinePerSm);
  return e;
}

int llMaxResidentBlocks(int threads) {
  int device = 0, sms = 0, dispatchPerSm = 0, combinePerSm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      llDispatchBlocksPerSm(threads, &dispatchPerSm) != cudaSuccess ||
      llCombineBlocksPerSm(threads, &combinePerSm) != cudaSuccess)
    return 0;
  return sms * std::min(dispatchPerSm, combinePerSm);
}

}  // namespace gdx::ep::detail
