// Host/device compilation macros. Every public header that holds code callable from a kernel includes this
// file; only functions are guarded, never data members or struct layouts, so a struct has the same layout in
// host code, in device code and in a plain C++ translation unit.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GDX_HOST_DEVICE __host__ __device__
#define GDX_DEVICE __device__
#define GDX_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#define GDX_DEVICE_INLINE __device__ __forceinline__
#else
#define GDX_HOST_DEVICE
#define GDX_DEVICE
#define GDX_HOST_DEVICE_INLINE inline
#define GDX_DEVICE_INLINE inline
#endif

/// True while compiling the device side of a CUDA translation unit.
#if defined(__CUDA_ARCH__)
#define GDX_DEVICE_COMPILE 1
#else
#define GDX_DEVICE_COMPILE 0
#endif
