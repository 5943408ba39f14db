#include "ep/teardown.hpp"

#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "gdx/context.hpp"
#include "gdx/detail/log.hpp"

namespace gdx::ep::detail {

void teardownBarrier(const std::shared_ptr<gdx::detail::ContextLink>& link, int rank, const char* what) {
  try {
    cudaDeviceSynchronize();
    CollectiveTag tag;
    tag.kind = std::string(what) + " teardown";
    gdx::detail::ContextUse ctx(link.get());
    if (ctx)
      ctx->bootstrap().allGather(std::string(), tag);  // no peer stores into the memory any more once all are here
    else
      GDX_WARN("gdx::ep rank " << rank << ": " << what
                               << " destroyed after its Context: its memory is freed without the teardown barrier; "
                                  "destroy buffers before their Context");
  } catch (const std::exception& e) {
    GDX_WARN("gdx::ep rank " << rank << ": barrier at " << what << " teardown failed: " << e.what());
  }
}

}  // namespace gdx::ep::detail
