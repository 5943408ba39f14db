// The device API between two GPUs: a kernel puts a GPU window into the peer's window with a signal, waits for the
// peer's put into its own window, and reports the gdx::Status of every call; the host then checks every byte.
// Two ranks, one GPU each where the host has two, both on GPU 0 where it has one (GDX_CUDA_DEVICE overrides):
//
//   examples/run_ranks.sh 2 build/examples/example_device_put_signal 64M
//   GDX_DIRECT=0 examples/run_ranks.sh 2 ...     the same through the command ring, the proxy and TCP
//
// Arguments: [BYTES (default 4M)] [SEED (default 1)]. Exit code 0 when every byte arrived, 77 without a GPU.
#include <gdx/device/channel.hpp>
#include <gdx/gdx.hpp>

#include "example_gpu.cuh"

// [snippet:device-kernel]
// One warp puts `bytes` of our window `send` into the peer's window `recv` and adds 1 to the peer's signal 0 once
// the data is there, then waits until the peer's put into our `recv` raised our signal 0. Every call returns a
// gdx::Status and is bounded by GDX_TIMEOUT_MS: a timeout or a failed peer is reported, nothing hangs or traps.
__global__ void exchange(gdx::ChannelDeviceHandle ch, uint32_t recv, uint32_t send, uint64_t bytes,
                         gdx::Status* status) {
  gdx::Status s = ch.put(recv, 0, send, 0, bytes, gdx::device::Signal{/*id=*/0, /*value=*/1}, gdx::device::Warp{});
  if (s == gdx::Status::kOk) s = ch.waitWarp(/*signalId=*/0, 1);  // the peer's data is in our recv window
  if (s == gdx::Status::kOk) s = ch.flushWarp();                  // our put completed: send may be rewritten
  if (s != gdx::Status::kOk) *status = s;
}
// [end-snippet]

namespace {

constexpr const char* kAbout =
    "The device API between two GPUs: a kernel puts a GPU window into the peer's with a signal and waits for "
    "the\npeer's; the host checks every byte. Two ranks (examples/run_ranks.sh 2 PROGRAM); needs a GPU.";

int runRank(size_t bytes, uint64_t seed) {
  example::selectGpu();
  gdx::Context ctx;
  example::requireWorldSize(ctx.worldSize(), 2);
  const int peer = 1 - ctx.rank();
  const char* what = ctx.isDirect(peer) ? "device_put_signal (direct path)" : "device_put_signal (proxy path)";
  example::DeviceBuffer sendBuf(bytes), recvBuf(bytes);
  example::KernelStatus status;
  example::fillPatternOnGpu(sendBuf.get(), bytes, ctx.rank(), seed);

  // [snippet:device-launch]
  gdx::Window send = ctx.registerWindow(sendBuf.get(), bytes, gdx::MemoryKind::kCuda);  // cudaMalloc'd memory
  gdx::Window recv = ctx.registerWindow(recvBuf.get(), bytes, gdx::MemoryKind::kCuda);  // collective, in order
  exchange<<<1, 32>>>(ctx.deviceChannel(peer), recv.id(), send.id(), bytes, status.get());
  // [end-snippet]
  example::cudaCheck(cudaDeviceSynchronize(), "exchange kernel");
  int rc = status.report(what, ctx.rank());
  if (rc == 0) rc = example::checkGpuBytes(what, ctx.rank(), peer, recvBuf.get(), bytes, seed);
  ctx.barrier();  // nobody closes its connections while the peer still receives
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const example::Args args = example::parseArgs(argc, argv, kAbout);
  return example::runWithGpu("device_put_signal", [&] { return runRank(args.bytes, args.seed); });
}
