// A relayed channel: the sender reaches a GPU of another host through a rank on that host. Its puts cross the
// network once, into the relay's copy of the destination's window, and the relay forwards them over NVLink into the
// destination's GPU, then raises the destination's signal. Three ranks on one machine stand for two hosts:
//   rank 0  relay, GPU 0
//   rank 1  destination, GPU 1 (GPU 0 where the host has one)
//   rank 2  sender, started with GDX_DIRECT=0 so that it reaches the others only through the proxy and TCP, as
//           from another host
//
//   examples/run_ranks.sh --rank-env 2 GDX_DIRECT=0 3 build/examples/example_relayed_channel 64M
//
// The sender sends the first half of its buffer with the host API and the second half from a kernel; the destination
// checks every byte. Arguments: [BYTES (default 4M)] [SEED (default 1)]. Exit code 0 on success, 77 without a GPU.
#include <cstdio>
#include <gdx/device/channel.hpp>
#include <gdx/gdx.hpp>

#include "example_gpu.cuh"

namespace {

constexpr const char* kAbout =
    "A relayed channel: rank 2 reaches rank 1's GPU through rank 0 (network, then NVLink); rank 1 checks every\nbyte. "
    "Three ranks (examples/run_ranks.sh 3 PROGRAM, rank 2 with GDX_DIRECT=0); needs a GPU.";

constexpr int kRelay = 0, kDestination = 1, kSender = 2;

// The second half, from a kernel, through the same relay (the device handle of a relayed channel).
__global__ void sendSecondHalf(gdx::ChannelDeviceHandle ch, uint32_t recv, uint32_t send, uint64_t offset,
                               uint64_t bytes, gdx::Status* status) {
  gdx::Status s = ch.putWithSignalWarp(recv, offset, send, offset, bytes, /*signalId=*/0, /*value=*/1);
  if (s == gdx::Status::kOk) s = ch.flushWarp();
  if (s != gdx::Status::kOk) *status = s;
}

int runRank(size_t bytes, uint64_t seed) {
  example::selectGpu();
  gdx::Context ctx;
  example::requireWorldSize(ctx.worldSize(), 3);
  example::DeviceBuffer sendBuf(bytes), recvBuf(bytes);
  example::KernelStatus status;
  if (ctx.rank() == kSender) example::fillPatternOnGpu(sendBuf.get(), bytes, ctx.rank(), seed);
  // Symmetric windows: every rank registers the same windows in the same order, so the relay holds a copy of the
  // destination's `recv` (same id, same offsets) for the data to land in before it is forwarded.
  gdx::Window send = ctx.registerWindow(sendBuf.get(), bytes, gdx::MemoryKind::kCuda);
  gdx::Window recv = ctx.registerWindow(recvBuf.get(), bytes, gdx::MemoryKind::kCuda);
  const uint64_t half = bytes / 2;
  int rc = 0;
  if (ctx.rank() == kRelay && !ctx.isDirect(kDestination)) {  // it would drop the forward requests
    std::printf("relayed_channel: rank %d cannot reach rank %d's GPU directly (GDX_LOG_LEVEL=INFO says why)\n", kRelay,
                kDestination);
    rc = 1;
  }
  if (ctx.rank() == kSender) {
    // [snippet:relay-host]
    gdx::Channel ch = ctx.relayChannel(kDestination, kRelay);  // to rank kDestination, through rank kRelay
    ch.putWithSignal(recv, 0, send, 0, half, /*signalId=*/0, /*value=*/1);
    ch.flush();
    // [end-snippet]
    sendSecondHalf<<<1, 32>>>(ctx.deviceRelayChannel(kDestination, kRelay), recv.id(), send.id(), half, bytes - half,
                              status.get());
    example::cudaCheck(cudaDeviceSynchronize(), "sendSecondHalf");
    rc = status.report("relayed_channel", ctx.rank());
  }
  if (ctx.rank() == kDestination) {
    ctx.wait(/*signalId=*/0, 2);  // both halves forwarded (the relay raises the signal after each one's data)
    rc = example::checkGpuBytes("relayed_channel", ctx.rank(), kSender, recvBuf.get(), bytes, seed);
  }
  ctx.barrier();  // the relay stays until the destination has everything
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const example::Args args = example::parseArgs(argc, argv, kAbout);
  return example::runWithGpu("relayed_channel", [&] { return runRank(args.bytes, args.seed); });
}
