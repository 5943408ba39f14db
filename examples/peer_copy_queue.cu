// PeerCopyQueue from host code, without a Context: transfers (src, dst, bytes, signal) go to a persistent kernel on
// GPU 0 that copies them into GPU 1 over NVLink (into GPU 0 itself where the host has one GPU, or two that cannot
// address each other) and adds to a signal word after each transfer's data, in submission order. One process:
//
//   build/examples/example_peer_copy_queue 256M
//
// Arguments: [BYTES (default 4M)] [SEED (default 1)]. Exit code 0 when every byte arrived, 77 without a GPU.
#include <algorithm>
#include <cstdio>
#include <gdx/gdx.hpp>

#include "example_gpu.cuh"

namespace {

constexpr const char* kAbout =
    "PeerCopyQueue without a Context: a persistent kernel copies transfers from GPU 0 to GPU 1 over NVLink and\nraises "
    "a signal after each; every byte is checked. One process; needs a GPU.";

int copyThroughQueue(size_t bytes, uint64_t seed) {
  const int srcGpu = 0;
  example::cudaCheck(cudaSetDevice(srcGpu), "cudaSetDevice");
  const int dstGpu = example::gpuCount() > 1 && gdx::enablePeerAccess(1) ? 1 : 0;  // GPU 0 may now address GPU 1
  example::DeviceBuffer srcBuf(bytes);
  example::fillPatternOnGpu(srcBuf.get(), bytes, /*rank=*/0, seed);
  example::cudaCheck(cudaSetDevice(dstGpu), "cudaSetDevice");
  example::DeviceBuffer dstBuf(bytes), signalWord(sizeof(uint64_t));  // the signal sits with the data it announces
  example::cudaCheck(cudaMemset(signalWord.get(), 0, sizeof(uint64_t)), "cudaMemset");
  uint64_t* signal = reinterpret_cast<uint64_t*>(signalWord.get());
  const uint64_t pieces = 4, piece = (bytes + pieces - 1) / pieces;

  // [snippet:peer-copy-queue]
  gdx::PeerCopyQueue q(/*device=*/srcGpu);  // its kernel runs on srcGpu and must reach src, dst and signal
  // Each submit returns at once; the kernel adds 1 to *signal once that piece (and every earlier one) is in dst.
  for (uint64_t off = 0; off < bytes; off += piece)
    q.submit(srcBuf.get() + off, dstBuf.get() + off, std::min<uint64_t>(piece, bytes - off), signal, /*value=*/1);
  q.waitCompleted(q.submitted());  // bounded: throws gdx::Error(kTimeout) naming the device and the counts
  // [end-snippet]

  uint64_t signalled = 0;
  example::cudaCheck(cudaMemcpy(&signalled, signal, sizeof signalled, cudaMemcpyDeviceToHost), "cudaMemcpy");
  const uint64_t expected = (bytes + piece - 1) / piece;
  if (signalled != expected) {
    std::printf("peer_copy_queue: the signal is %llu after %llu transfers\n", (unsigned long long)signalled,
                (unsigned long long)expected);
    return 1;
  }
  char what[64];
  std::snprintf(what, sizeof what, "peer_copy_queue (GPU %d -> GPU %d)", srcGpu, dstGpu);
  return example::checkGpuBytes(what, /*rank=*/0, /*from=*/0, dstBuf.get(), bytes, seed);
}

}  // namespace

int main(int argc, char** argv) {
  const example::Args args = example::parseArgs(argc, argv, kAbout);
  return example::runWithGpu("peer_copy_queue", [&] { return copyThroughQueue(args.bytes, args.seed); });
}
