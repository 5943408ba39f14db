// A program outside the gdx tree: it includes only <gdx/gdx.hpp> and is built against the installed package
// (find_package(gdx) and pkg-config gdx, tests/install/run.sh). A world of one rank puts random bytes from one
// window into another through the proxy and checks every byte.
#include <cstdio>
#include <gdx/gdx.hpp>
#include <random>
#include <vector>

int main() {
  try {
    gdx::Context ctx;
    std::vector<unsigned char> src(1 << 20), dst(src.size(), 0xee);
    std::mt19937 rng(7);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    gdx::Window s = ctx.registerWindow(src.data(), src.size());
    gdx::Window d = ctx.registerWindow(dst.data(), dst.size());
    gdx::Channel ch = ctx.channel(ctx.rank());
    ch.putWithSignal(d, 0, s, 0, src.size(), /*signalId=*/0, 1);
    ctx.wait(0, 1);
    ch.flush();
    if (dst != src) {
      std::fprintf(stderr, "consumer: the received bytes differ from the sent ones\n");
      return 1;
    }
    std::printf("consumer: %zu bytes put and checked\n", src.size());
    return 0;
  } catch (const gdx::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
