// GDX_TRACE: a world of one sends puts and signals to itself with tracing on; the file written when the Context
// closes is valid JSON (checked by Python's json module) holding a pick-up, a post and a completion per operation,
// bounded by GDX_TRACE_EVENTS; a wait that times out logs the last events per peer; a bad GDX_TRACE_EVENTS is refused.
#include "proxy/trace.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "support/test_support.hpp"

namespace gdx {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string scratch(const std::string& name) {
  return ::testing::TempDir() + "gdx_trace_" + std::to_string(getpid()) + "_" + name;
}

// Each body runs as the single rank of a world of one, in a child process (a Context starts threads).
using test::runSolo;

TEST(Trace, PathPutsTheRankInEveryName) {
  EXPECT_EQ(tracePath("/tmp/t-%r.json", 3), "/tmp/t-3.json");
  EXPECT_EQ(tracePath("/tmp/t.json", 3), "/tmp/t.rank3.json");
  EXPECT_EQ(tracePath("/tmp/dir.d/trace", 0), "/tmp/dir.d/trace.rank0");
  EXPECT_EQ(tracePath("", 1), "");
}

TEST(Trace, EveryOperationIsPickedUpPostedAndCompletedInValidJson) {
  const std::string pattern = scratch("ops_%r.json"), path = tracePath(pattern, 0);
  std::remove(path.c_str());
  const int code = runSolo([&] {
    setenv("GDX_TRACE", pattern.c_str(), 1);
    Context ctx;
    std::vector<unsigned char> src(1 << 16, 7), dst(1 << 16, 0);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Channel ch = ctx.channel(0);
    // 10 puts that do not continue each other (one write each), then a putWithSignal.
    for (int i = 0; i < 10; ++i) ch.put(d, i * 1024, s, i * 2048, 100);
    ch.putWithSignal(d, 30000, s, 0, 64, 2, 1);
    ch.flush();
    ctx.wait(2, 1);
    return 0;
  });
  ASSERT_EQ(code, 0);
  const std::string cmd = "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << path << " is not valid JSON";
  const std::string text = slurp(path);
  EXPECT_EQ(count(text, "\"cat\":\"pickup\""), 11u) << text.substr(0, 2000);
  EXPECT_EQ(count(text, "\"cat\":\"post\""), 11u);
  EXPECT_EQ(count(text, "\"cat\":\"complete\""), 11u);
  EXPECT_EQ(count(text, "\"name\":\"putWithSignal\""), 1u);
  std::remove(path.c_str());
}

TEST(Trace, TheBufferKeepsTheNewestEventsOnly) {
  const std::string path = scratch("bounded.json");
  const std::string written = tracePath(path, 0);
  const int code = runSolo([&] {
    setenv("GDX_TRACE", path.c_str(), 1);
    setenv("GDX_TRACE_EVENTS", "50", 1);
    Context ctx;
    std::vector<unsigned char> src(4096, 1), dst(1 << 20, 0);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Channel ch = ctx.channel(0);
    for (int i = 0; i < 500; ++i) ch.put(d, i * 2048, s, 0, 8);
    ch.flush();
    return 0;
  });
  ASSERT_EQ(code, 0);
  const std::string text = slurp(written);
  // One proxy thread by default: at most 50 events (plus the two metadata records).
  EXPECT_LE(count(text, "\"ph\":\"i\""), 50u);
  EXPECT_GE(count(text, "\"ph\":\"i\""), 40u);
  std::remove(written.c_str());
}

TEST(Trace, AWaitThatTimesOutLogsTheLastEventsPerPeer) {
  const std::string path = scratch("timeout.json"), log = scratch("timeout.log");
  const int code = runSolo([&] {
    setenv("GDX_TRACE", path.c_str(), 1);
    // The log goes to stderr: keep it in a file to read it afterwards.
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0) return 3;
    Context ctx;
    std::vector<unsigned char> src(4096, 1), dst(4096, 0);
    Window s = ctx.registerWindow(src.data(), src.size());
    Window d = ctx.registerWindow(dst.data(), dst.size());
    Channel ch = ctx.channel(0);
    ch.putWithSignal(d, 0, s, 0, 128, 4, 1);
    ch.flush();
    try {
      ctx.wait(4, 2, 200ull * 1000 * 1000);  // the value never comes
      return 1;
    } catch (const Error& e) {
      return e.code() == ErrorCode::kTimeout ? 0 : 2;
    }
  });
  ASSERT_EQ(code, 0);
  const std::string text = slurp(log);
  EXPECT_NE(text.find("traced proxy events"), std::string::npos) << text;
  EXPECT_NE(text.find("peer 0: last"), std::string::npos) << text;
  EXPECT_NE(text.find("pickup putWithSignal peer 0 window"), std::string::npos) << text;
  std::remove(log.c_str());
  std::remove(tracePath(path, 0).c_str());
}

TEST(Trace, AnEventCountOutOfRangeIsRefusedByName) {
  const int code = runSolo([] {
    setenv("GDX_TRACE", "/dev/null", 1);
    setenv("GDX_TRACE_EVENTS", "0", 1);
    try {
      Context ctx;
      return 1;
    } catch (const Error& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "%s\n", what.c_str());
      return what.find("GDX_TRACE_EVENTS") != std::string::npos && what.find("0") != std::string::npos ? 0 : 2;
    }
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace gdx
