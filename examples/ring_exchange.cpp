// Ring exchange with the host API: every rank puts a buffer into the next rank's receive window and checks every
// byte it received from the previous rank. Start it as N processes, like any torchrun / mpirun program:
//
//   examples/run_ranks.sh 3 build/examples/example_ring_exchange 64M      (or torchrun / mpirun -n 3 ...)
//
// Arguments: [BYTES (default 4M)] [SEED (default 1)]. Exit code 0 only when every byte arrived intact.
#include <gdx/gdx.hpp>
#include <vector>

#include "example_util.hpp"

namespace {

constexpr const char* kAbout =
    "Ring exchange with the host API: every rank puts BYTES into the next rank's receive window and checks\nevery byte "
    "from the previous one. Start N copies (examples/run_ranks.sh N PROGRAM, torchrun, mpirun).";

int exchange(size_t bytes, uint64_t seed) {
  // [snippet:host-exchange]
  gdx::Context ctx;  // joins the job: GDX_RANK / RANK, GDX_WORLD_SIZE / WORLD_SIZE, GDX_MASTER_ADDR, ...
  const int next = (ctx.rank() + 1) % ctx.worldSize();
  const int prev = (ctx.rank() + ctx.worldSize() - 1) % ctx.worldSize();
  std::vector<unsigned char> sendBuf(bytes), recvBuf(bytes);
  example::fillPattern(sendBuf.data(), bytes, ctx.rank(), seed);  // the data to send
  // Two windows: prev's put lands in recv while our own put may still be reading send. One window as both
  // would let the incoming data overwrite bytes that are still on their way out.
  gdx::Window send = ctx.registerWindow(sendBuf.data(), bytes);  // collective: same order on every rank
  gdx::Window recv = ctx.registerWindow(recvBuf.data(), bytes);
  gdx::Channel ch = ctx.channel(next);
  ch.putWithSignal(recv, 0, send, 0, bytes, /*signalId=*/0, /*value=*/1);  // next's recv <- our send, then +1
  ctx.wait(/*signalId=*/0, 1);  // prev's data is in recvBuf; bounded: throws gdx::Error naming rank and values
  ch.flush();                   // our put completed at the source: sendBuf may be reused
  ctx.barrier();                // nobody closes its connections while a peer still receives
  // [end-snippet]
  return example::checkAndReport("ring_exchange", ctx.rank(), prev, recvBuf.data(), bytes, seed);
}

}  // namespace

int main(int argc, char** argv) {
  const example::Args args = example::parseArgs(argc, argv, kAbout);
  return example::run("ring_exchange", [&] { return exchange(args.bytes, args.seed); });
}
