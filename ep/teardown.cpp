#include "ep/teardown.hpp"

#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "base/log.hpp"
#include "gdx/context.hpp"

namespace gdx::ep::detail {

void teardownBarrier(const ContextRef& link, int rank, const char* what) {
  try {
    cudaDeviceSynchronize();
    CollectiveTag tag;
    tag.kind = std::string(what) + " teardown";
    ContextRef::Use ctx = link.use();
    if (ctx)
      ctx->allGather(std::string(), tag);  // no peer stores into the memory any more once all are here
    else
      GDX_WARN("gdx::ep rank " << rank << ": " << what
                               << " destroyed after its Context: its memory is freed without the teardown barrier; "
                                  "destroy buffers before their Context");
  } catch (const std::exception& e) {
    GDX_WARN("gdx::ep rank " << rank << ": barrier at " << what << " teardown failed: " << e.what());
  }
}

}  // namespace gdx::ep::detail
