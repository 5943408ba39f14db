// Memory registration of the verbs transport: host windows as memory regions, GPU windows through dmabuf or
// peermem (or, when neither works or stageAllWindows asks for it, as staged windows), the keys that tell peers how
// to reach them, and the peers' keys.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "base/gpu.hpp"
#include "base/log.hpp"
#include "gdx/error.hpp"
#include "transport/common/cuda_staging.hpp"
#include "transport/common/window_table.hpp"
#include "transport/verbs/verbs_transport.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace gdx::verbs {

UniqueMr VerbsTransport::registerCuda(void* base, size_t bytes, int access, std::string* how) {
#if defined(GDX_HAVE_CUDA)
  using GetHandleFn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  if (void* fn = cudaDriverEntry("cuMemGetHandleForAddressRange", 11070)) {
    const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + bytes + page - 1) & ~(page - 1);
    int fd = -1;
    if (reinterpret_cast<GetHandleFn>(fn)(&fd, static_cast<CUdeviceptr>(start), end - start,
                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS) {
      UniqueMr mr(ibv_reg_dmabuf_mr(pd_.get(), reinterpret_cast<uintptr_t>(base) - start, bytes,
                                    reinterpret_cast<uint64_t>(base), fd, access));
      int err = errno;
      ::close(fd);
      if (mr) {
        *how = "dmabuf";
        return mr;
      }
      *how = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(err);
    } else {
      *how = "cuMemGetHandleForAddressRange failed";
    }
  } else {
    *how = "no cuMemGetHandleForAddressRange in the driver";
  }
  UniqueMr mr(ibv_reg_mr(pd_.get(), base, bytes, access));
  if (mr) {
    *how = "peermem";
    return mr;
  }
  *how += std::string("; ibv_reg_mr (peermem): ") + std::strerror(errno);
  return nullptr;
#else
  (void)base, (void)bytes, (void)access;
  *how = "gdx was built without CUDA";
  return nullptr;
#endif
}

std::string VerbsTransport::registerWindow(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
  return registerWindowFor(id, base, bytes, kind, RemoteAccess::kWrite);
}

std::string VerbsTransport::registerWindowFor(uint32_t id, void* base, size_t bytes, MemoryKind kind,
                                              RemoteAccess remote) {
  std::string w = who() + ": window " + std::to_string(id);
  common::checkWindowArguments(w, base, bytes, kind);
  {
    std::shared_lock<std::shared_mutex> lock(windows_.mutex());
    if (windows_.local(id)) throw Error(ErrorCode::kInvalidArgument, w + " is already registered");
  }
  LocalWindow win;
  win.base = static_cast<char*>(base);
  win.bytes = bytes;
  win.kind = kind;
  win.access = remote;
  const int access = accessFlags(remote);
  if (kind == MemoryKind::kCuda) {
    if (!common::cudaStagingBuiltIn())
      throw Error(ErrorCode::kInvalidArgument,
                  w + ": GPU memory (MemoryKind::kCuda) needs gdx built with CUDA; this build has no CUDA");
    win.device = common::cudaWindowDevice(base, bytes, w);  // throws unless it is CUDA memory
  }
  if (options_.stageAllWindows) {
    win.staged = true;
  } else if (bytes > 0) {
    if (kind == MemoryKind::kHost) {
      win.mr.reset(ibv_reg_mr(pd_.get(), base, bytes, access));
      win.mrAccess = access;
      if (!win.mr)
        throw VerbsError("ibv_reg_mr (" + w + ", " + std::to_string(bytes) + " bytes)", errno, __FILE__, __LINE__);
    } else {
      std::string how;
      win.mr = registerCuda(base, bytes, access, &how);
      win.mrAccess = access;
      if (win.mr) {
        GDX_INFO(w << ": GPU memory registered through " << how);
      } else {
        win.staged = true;
        GDX_INFO(w << ": GPU memory cannot be registered with " << port_.device << " (" << how
                   << "); it is staged through registered host buffers");
      }
    }
  }
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  if (win.staged) ensureStagingArea();
  WindowKey key{};
  key.addr = reinterpret_cast<uint64_t>(base);
  key.bytes = bytes;
  key.rkey = win.mr ? win.mr->rkey : 0;
  key.cuda = kind == MemoryKind::kCuda ? 1u : 0u;
  if (win.staged) {
    key.staged = 1;
    key.stagingAddr = reinterpret_cast<uint64_t>(staging_.get());
    key.stagingRkey = stagingMr_->rkey;
    key.stagingLanes = static_cast<uint32_t>(options_.lanes);
  }
  windows_.addLocal(id, std::move(win), w);
  return std::string(reinterpret_cast<const char*>(&key), sizeof key);
}

int VerbsTransport::accessFlags(RemoteAccess remote) const {
  if (remote == RemoteAccess::kNone) return IBV_ACCESS_LOCAL_WRITE;
  int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (port_.device_attr.atomic_cap != IBV_ATOMIC_NONE) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  return flags;
}

void VerbsTransport::setRemoteAccess(uint32_t id, RemoteAccess access) {
  const std::string w = who() + ": window " + std::to_string(id);
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  LocalWindow* win = windows_.mutableLocal(id);
  if (!win) throw Error(ErrorCode::kInvalidArgument, w + " is not registered");
  win->access = access;
  if (!win->mr) return;
  const int flags = accessFlags(access);
  if (flags == win->mrAccess) return;
  const uint32_t lkey = win->mr->lkey, rkey = win->mr->rkey;
  errno = 0;
  if (ibv_rereg_mr(win->mr.get(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, flags) != 0) {
    const int err = errno ? errno : EOPNOTSUPP;
    // The region keeps the access it has. Narrowing is protection only; widening is needed for the peer's writes.
    if (access == RemoteAccess::kNone) {
      GDX_INFO(w << ": " << port_.device << " cannot take remote write access from a memory region (ibv_rereg_mr: "
                 << std::strerror(err) << "); a peer that knows its key could still write it");
      return;
    }
    throw VerbsError("ibv_rereg_mr (" + w + ": remote write access)", err, __FILE__, __LINE__);
  }
  win->mrAccess = flags;
  // The keys were handed out with the window's key blob and are in posted work requests: a device that changed them
  // here would leave both stale. Providers that change only the access keep them (rxe, mlx5 with UMR).
  if (win->mr->lkey != lkey || win->mr->rkey != rkey)
    throw Error(ErrorCode::kInternal, w + ": " + port_.device +
                                          " gave the memory region new keys when only its access changed; the window "
                                          "must be registered again");
}

void VerbsTransport::deregisterWindow(uint32_t id) {
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  windows_.removeLocal(id, who());
}

void VerbsTransport::addRemoteWindow(int peer, uint32_t id, size_t bytes, const std::string& key) {
  if (peer < 0 || peer >= world_)
    throw Error(ErrorCode::kInvalidArgument,
                who() + ": remote window " + std::to_string(id) + " of unknown peer " + std::to_string(peer));
  WindowKey k{};
  std::string bad = decodeWindowKey(key, bytes, &k);
  if (!bad.empty())
    throw Error(ErrorCode::kInvalidArgument, who() + ": the key of window " + std::to_string(id) + " of rank " +
                                                 std::to_string(peer) + " is not a verbs key for " +
                                                 std::to_string(bytes) + " bytes (" + bad + ")");
  RemoteWindow window;
  window.bytes = k.bytes;
  window.cuda = k.cuda != 0;
  window.skew = static_cast<uint8_t>(k.addr % 8);
  window.key = k;
  std::unique_lock<std::shared_mutex> lock(windows_.mutex());
  windows_.setRemote(peer, id, std::move(window));
}

}  // namespace gdx::verbs
