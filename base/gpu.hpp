// The GPU this process drives, if any: chosen by GDX_CUDA_DEVICE, else the current CUDA device (torch and
// most launchers set it from LOCAL_RANK). A build without CUDA, or a machine without a GPU, has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gdx/gpu_info.hpp"

namespace gdx {

/// Selects (cudaSetDevice) and describes the GPU; returns an empty GpuInfo where there is none.
GpuInfo selectGpu();

/// The CUDA driver function `name` in the ABI of CUDA `version` (12000 for 12.0), through the runtime's
/// cudaGetDriverEntryPointByVersion so that libcuda is never linked; null where the driver has none (or no CUDA).
void* cudaDriverEntry(const char* name, unsigned version);

/// The device of the calling thread's current CUDA context, or -1 when the thread has none yet (it has made no CUDA
/// call that needs one) or there is no CUDA. cudaGetDevice() answers 0 in that case, and setting 0 back with
/// cudaSetDevice() would create a context on GPU 0 (CUDA 12 initialises a device's primary context there): a rank
/// driving GPU 1 would then hold memory and a context on GPU 0 through its library threads. So code that selects a
/// device for a call and restores the caller's afterwards (DeviceGuard, the transports' staging copies) restores only
/// a device the thread really had.
int cudaThreadDevice();

/// The CUDA allocation `p` lies in (cuMemGetAddressRange, through cudaDriverEntry): true with its base and size, false
/// for anything else (host memory, no CUDA, no driver). CUDA IPC handles name allocations, so their users need the base
/// and the offset of `p` in it.
bool cudaAllocationRange(const void* p, uintptr_t* base, size_t* bytes);

}  // namespace gdx
