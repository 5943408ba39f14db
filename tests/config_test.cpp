// Configuration: every variable is read through the one table (gdx/config.hpp). The parsing functions are called
// directly; that a Context refuses a bad variable before it joins the job is tested with real processes.
#include "gdx/config.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "base/window_registry.hpp"
#include "gdx/context.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/error.hpp"
#include "proxy/proxy.hpp"
#include "support/test_support.hpp"
#include "transport/tcp/wire.hpp"

namespace gdx {
namespace {

// Sets variables for one test and puts every variable of the table back as it was afterwards.
class EnvGuard {
 public:
  EnvGuard() {
    size_t n = 0;
    const EnvVar* vars = envVariables(&n);
    for (size_t i = 0; i < n; ++i) {
      if (const char* v = std::getenv(vars[i].name)) saved_[vars[i].name] = v;
      unsetenv(vars[i].name);
    }
  }
  ~EnvGuard() {
    size_t n = 0;
    const EnvVar* vars = envVariables(&n);
    for (size_t i = 0; i < n; ++i) {
      auto it = saved_.find(vars[i].name);
      if (it != saved_.end())
        setenv(vars[i].name, it->second.c_str(), 1);
      else
        unsetenv(vars[i].name);
    }
  }
  void set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

 private:
  std::map<std::string, std::string> saved_;
};

// The message of the kInvalidArgument error `f` throws; a failure when it throws nothing or something else.
template <typename F>
std::string invalidMessage(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Config, TableRowsAreConsistent) {
  size_t n = 0;
  const EnvVar* vars = envVariables(&n);
  ASSERT_GT(n, 40u);
  for (size_t i = 0; i < n; ++i) {
    const EnvVar& v = vars[i];
    EXPECT_EQ(&envVar(v.name), &v) << v.name << " appears twice";
    EXPECT_TRUE(v.help && *v.help && v.fallback && *v.fallback) << v.name;
    if (v.kind == EnvKind::kInt) {
      EXPECT_LE(v.min, v.max) << v.name;
    }
    if (v.kind == EnvKind::kChoice) {
      EXPECT_TRUE(v.choices && *v.choices) << v.name;
    }
    if (v.kind == EnvKind::kString) {
      EXPECT_GT(v.max, 0) << v.name;
    }
  }
  // Bounds that restate a constant of a higher layer.
  EXPECT_EQ(static_cast<uint64_t>(envVar("GDX_TCP_CHUNK").max), tcp::kMaxChunkBytes);
  EXPECT_EQ(static_cast<uint64_t>(envVar("GDX_JOB_SECRET").max), tcp::kMaxSecretBytes);
  EXPECT_EQ(envVar("GDX_NUM_SIGNALS").max, int64_t{kMaxSignals});
}

TEST(Config, AVariableMissingFromTheTableIsAnInternalError) {
  EXPECT_EQ(test::errorCodeOf([] { envInt("GDX_NO_SUCH_VARIABLE", 1); }), ErrorCode::kInternal);
  EXPECT_EQ(test::errorCodeOf([] { envFirstSet({"GDX_RANK", "GDX_NO_SUCH_VARIABLE"}); }), ErrorCode::kInternal);
  EXPECT_EQ(test::errorCodeOf([] { envBool("GDX_RING_SIZE", false); }), ErrorCode::kInternal);  // wrong type
}

TEST(Config, ReadsValuesAndFallbacks) {
  EnvGuard env;
  EXPECT_EQ(envInt("GDX_RING_SIZE", 4096), 4096);
  env.set("GDX_RING_SIZE", "");  // empty counts as unset
  EXPECT_EQ(envInt("GDX_RING_SIZE", 4096), 4096);
  env.set("GDX_RING_SIZE", "16777216");
  EXPECT_EQ(envInt("GDX_RING_SIZE", 4096), 1 << 24);
  env.set("GDX_RING_SIZE", "0x100");
  EXPECT_EQ(envInt("GDX_RING_SIZE", 4096), 256);
  env.set("GDX_TCP_SOCKETS", "010");  // decimal, not octal
  EXPECT_EQ(envInt("GDX_TCP_SOCKETS", 4), 10);
  env.set("GDX_NUMA_NODE", "-1");
  EXPECT_EQ(envInt("GDX_NUMA_NODE", 0), -1);
  env.set("GDX_DIRECT", "off");
  EXPECT_FALSE(envBool("GDX_DIRECT", true));
  env.set("GDX_DIRECT", "1");
  EXPECT_TRUE(envBool("GDX_DIRECT", false));
  env.set("GDX_TRANSPORT", "VERBS");
  EXPECT_EQ(envChoice("GDX_TRANSPORT", "tcp"), "verbs");
  env.set("GDX_LOG_LEVEL", "debug");
  EXPECT_EQ(envChoice("GDX_LOG_LEVEL", "WARN"), "DEBUG");
  env.set("MASTER_ADDR", "node-3");
  EXPECT_EQ(envFirst({"GDX_MASTER_ADDR", "MASTER_ADDR"}, "127.0.0.1"), "node-3");
  EXPECT_STREQ(envFirstSet({"GDX_MASTER_ADDR", "MASTER_ADDR"}), "MASTER_ADDR");
  EXPECT_EQ(envFirstSet({"GDX_RANK", "RANK"}), nullptr);
  EXPECT_NO_THROW(checkEnvironment());
}

TEST(Config, OutOfRangeNamesTheVariableTheValueAndTheBounds) {
  EnvGuard env;
  struct Case {
    const char* name;
    const char* value;
    const char* bounds;
  };
  for (const Case& c :
       {Case{"GDX_PROXY_THREADS", "1000", "[1, 64]"}, Case{"GDX_PROXY_THREADS", "0", "[1, 64]"},
        Case{"GDX_TCP_SOCKETS", "65", "[1, 64]"}, Case{"GDX_TIMEOUT_MS", "86400001", "86400000]"},
        Case{"GDX_TIMEOUT_MS", "-5", "[1, "}, Case{"GDX_BOOTSTRAP_TIMEOUT_MS", "0", "[1, "},
        Case{"GDX_TCP_CHUNK", "1073741825", "1073741824]"}, Case{"GDX_IB_SL", "16", "[0, 15]"},
        Case{"GDX_RING_SIZE", "33554432", "16777216]"}, Case{"GDX_MASTER_PORT", "70000", "65535]"},
        Case{"GDX_COPY_QUEUE_BLOCKS", "4096", "[1, 1024]"}, Case{"GDX_RINGS_PER_THREAD", "128", "127]"}}) {
    env.set(c.name, c.value);
    const std::string m = invalidMessage([&] { envInt(c.name, 0); });
    EXPECT_TRUE(has(m, std::string(c.name) + "='" + c.value + "'")) << m;
    EXPECT_TRUE(has(m, "out of range")) << m;
    EXPECT_TRUE(has(m, c.bounds)) << m;
    unsetenv(c.name);
  }
}

TEST(Config, SixtyFourBitValuesAreNeverTruncated) {
  EnvGuard env;
  env.set("GDX_NUM_SIGNALS", "4294967297");  // 2^32 + 1: was read as 1
  std::string m = invalidMessage([] { envInt("GDX_NUM_SIGNALS", 1024); });
  EXPECT_TRUE(has(m, "GDX_NUM_SIGNALS='4294967297' is out of range")) << m;
  EXPECT_TRUE(has(m, std::to_string(kMaxSignals))) << m;
  // The same through the Context's own reading of its options.
  m = invalidMessage([] { ContextOptions::fromEnv(); });
  EXPECT_TRUE(has(m, "GDX_NUM_SIGNALS='4294967297'")) << m;
  env.set("GDX_NUM_SIGNALS", "99999999999999999999");  // past 64 bits
  m = invalidMessage([] { envInt("GDX_NUM_SIGNALS", 1024); });
  EXPECT_TRUE(has(m, "GDX_NUM_SIGNALS='99999999999999999999' does not fit in 64 bits")) << m;
  env.set("GDX_RING_SIZE", "4294967298");  // a power of two plus 2^32 would have been 2 as a 32-bit int
  m = invalidMessage([] { envInt("GDX_RING_SIZE", 4096); });
  EXPECT_TRUE(has(m, "GDX_RING_SIZE='4294967298'")) << m;
}

TEST(Config, NonNumericValuesAreRefused) {
  EnvGuard env;
  for (const char* bad : {"abc", "12abc", " 5", "5 ", "0x", "1e3", "4k", "--1", "+-1", "0x-10"}) {
    env.set("GDX_TCP_SOCKETS", bad);
    const std::string m = invalidMessage([] { envInt("GDX_TCP_SOCKETS", 4); });
    EXPECT_TRUE(has(m, std::string("GDX_TCP_SOCKETS='") + bad + "' is not an integer")) << m;
    EXPECT_TRUE(has(m, "[1, 64]")) << m;
  }
}

TEST(Config, PowerOfTwoAndMultipleOf16) {
  EnvGuard env;
  env.set("GDX_RING_SIZE", "3000");
  std::string m = invalidMessage([] { envInt("GDX_RING_SIZE", 4096); });
  EXPECT_TRUE(has(m, "GDX_RING_SIZE='3000' is not a power of two")) << m;
  env.set("GDX_COPY_QUEUE_CHUNK", "1000");
  m = invalidMessage([] { envInt("GDX_COPY_QUEUE_CHUNK", 65536); });
  EXPECT_TRUE(has(m, "GDX_COPY_QUEUE_CHUNK='1000' is not a multiple of 16")) << m;
}

TEST(Config, UnknownEnumeratedValuesAreRefusedWithTheList) {
  EnvGuard env;
  env.set("GDX_LOG_LEVEL", "verbose");
  std::string m = invalidMessage([] { envChoice("GDX_LOG_LEVEL", "WARN"); });
  EXPECT_TRUE(has(m, "GDX_LOG_LEVEL='verbose' is not a known value")) << m;
  EXPECT_TRUE(has(m, "ERROR, WARN, INFO, DEBUG, TRACE")) << m;
  env.set("GDX_TRANSPORT", "foo");
  m = invalidMessage([] { envChoice("GDX_TRANSPORT", "tcp"); });
  EXPECT_TRUE(has(m, "GDX_TRANSPORT='foo' is not a known value; allowed: tcp, verbs, loopback")) << m;
  env.set("GDX_DIRECT", "2");  // was read as "on"
  m = invalidMessage([] { envBool("GDX_DIRECT", true); });
  EXPECT_TRUE(has(m, "GDX_DIRECT='2' is not a boolean")) << m;
}

TEST(Config, LongStringsAreRefusedWithoutPrintingThem) {
  EnvGuard env;
  const std::string secret(5000, 's');
  env.set("GDX_JOB_SECRET", secret);
  const std::string m = invalidMessage([] { envString("GDX_JOB_SECRET", ""); });
  EXPECT_TRUE(has(m, "GDX_JOB_SECRET is 5000 bytes long; allowed: at most 4096")) << m;
  EXPECT_FALSE(has(m, "sssss")) << "the secret itself is in the message";
}

TEST(Config, CheckEnvironmentListsEveryBadVariable) {
  EnvGuard env;
  env.set("GDX_RING_SIZE", "3000");
  env.set("GDX_LOG_LEVEL", "verbose");
  env.set("GDX_IB_RETRY_CNT", "8");  // read only by the verbs transport: checked all the same
  env.set("GDX_TCP_SOCKETS", "4");   // a good one is not listed
  const std::string m = invalidMessage([] { checkEnvironment(); });
  EXPECT_TRUE(has(m, "GDX_RING_SIZE='3000'")) << m;
  EXPECT_TRUE(has(m, "GDX_LOG_LEVEL='verbose'")) << m;
  EXPECT_TRUE(has(m, "GDX_IB_RETRY_CNT='8'")) << m;
  EXPECT_FALSE(has(m, "GDX_TCP_SOCKETS")) << m;
}

TEST(Config, AMisspeltVariableIsReported) {
  // In a child, whose stderr is read back from a file.
  char path[] = "/tmp/gdx_config_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  pid_t pid = test::forkChild([&] {
    if (!std::freopen(path, "w", stderr)) return 2;
    setenv("GDX_PROXY_THREAD", "4", 1);   // GDX_PROXY_THREADS
    setenv("GDX_BENCH_MACHINE", "x", 1);  // a benchmark's own variable, not a typo
    checkEnvironment();
    return 0;
  });
  EXPECT_EQ(test::waitChild(pid, 60), 0);
  std::FILE* f = std::fopen(path, "r");
  ASSERT_NE(f, nullptr);
  std::string log;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) log += buf;
  std::fclose(f);
  std::remove(path);
  EXPECT_TRUE(has(log, "GDX_PROXY_THREAD is set but gdx reads no such variable")) << log;
  EXPECT_FALSE(has(log, "GDX_BENCH_MACHINE")) << log;
}

TEST(Config, ProxyOptionsSetInCodeNameTheirVariable) {
  Proxy::Options o;
  o.ringCapacity = 3000;
  std::string m = invalidMessage([&] { o.validate(); });
  EXPECT_TRUE(has(m, "GDX_RING_SIZE=3000 is not a power of two")) << m;
  o.ringCapacity = 4096;
  o.threads = 1000;
  m = invalidMessage([&] { o.validate(); });
  EXPECT_TRUE(has(m, "GDX_PROXY_THREADS=1000 is out of range; allowed: [1, 64]")) << m;
  // The largest rings on the most threads need terabytes: refused up front, naming the ring size.
  o.threads = 64;
  o.ringsPerThread = 127;
  o.ringCapacity = uint64_t{1} << 24;
  m = invalidMessage([&] { o.validate(); });
  EXPECT_TRUE(has(m, "GDX_RING_SIZE=16777216")) << m;
  EXPECT_TRUE(has(m, "more than this machine's memory")) << m;
}

TEST(Config, ARingThatCannotBeAllocatedNamesGdxRingSize) {
  // In a child whose address space is capped below one 256 MiB ring: the allocation fails as it would on a full
  // machine, and the error says which setting asked for the memory.
  pid_t pid = test::forkChild([] {
    rlimit limit{size_t{512} << 20, size_t{512} << 20};
    if (setrlimit(RLIMIT_AS, &limit) != 0) return 2;
    Proxy::Options o;
    o.ringsPerThread = 4;
    o.ringCapacity = uint64_t{1} << 24;
    WindowRegistry registry(0, 1, kMaxWindows);
    try {
      Proxy proxy(o, nullptr, registry);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return has(e.what(), "GDX_RING_SIZE=16777216") ? 0 : 3;
    } catch (const std::bad_alloc&) {
      return 4;
    }
    return 5;
  });
  EXPECT_EQ(test::waitChild(pid, 60), 0);
}

// A Context made in a child where `name`=`value` and no other rank exists. The bootstrap would wait 20 s for the
// missing rank; the child exits 0 when the constructor threw kInvalidArgument naming the variable within a second.
int contextRefusesBeforeJoining(int rank, const char* name, const char* value) {
  const int port = test::freePort();
  pid_t pid = test::forkChild([=] {
    setenv("GDX_RANK", std::to_string(rank).c_str(), 1);
    setenv("GDX_WORLD_SIZE", "2", 1);
    setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
    setenv("GDX_MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "20000", 1);
    setenv(name, value, 1);
    const auto start = std::chrono::steady_clock::now();
    try {
      Context ctx;
      return 10;  // joined a job that does not exist
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "after %.3f s: %s\n", s, e.what());
      if (e.code() != ErrorCode::kInvalidArgument) return 11;
      if (!has(e.what(), std::string(name) + "='" + value + "'")) return 12;
      return s < 1.0 ? 0 : 13;
    }
  });
  return test::waitChild(pid, 60);
}

TEST(Config, ContextRefusesABadVariableBeforeJoiningTheJob) {
  struct Case {
    const char* name;
    const char* value;
  };
  // Rank 0 would serve the rendezvous, rank 1 would keep connecting to it: neither may get that far.
  for (int rank : {0, 1})
    for (const Case& c :
         {Case{"GDX_RING_SIZE", "3000"}, Case{"GDX_NUM_SIGNALS", "4294967297"}, Case{"GDX_PROXY_THREADS", "1000"},
          Case{"GDX_LOG_LEVEL", "verbose"}, Case{"GDX_TRANSPORT", "foo"}, Case{"GDX_TCP_CHUNK", "abc"},
          Case{"GDX_IB_SL", "16"}, Case{"GDX_COPY_QUEUE_CHUNK", "1000"}})
      EXPECT_EQ(contextRefusesBeforeJoining(rank, c.name, c.value), 0) << "rank " << rank << " " << c.name;
}

TEST(Config, ContextRefusesBadOptionsSetInCodeBeforeJoining) {
  const int port = test::freePort();
  pid_t pid = test::forkChild([=] {
    setenv("GDX_RANK", "1", 1);
    setenv("GDX_WORLD_SIZE", "2", 1);
    setenv("GDX_MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("GDX_BOOTSTRAP_TIMEOUT_MS", "20000", 1);
    const auto start = std::chrono::steady_clock::now();
    int failures = 0;
    auto expectRefused = [&](ContextOptions o, const char* part) {
      try {
        Context ctx(o);
        ++failures;
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        if (e.code() != ErrorCode::kInvalidArgument || !has(e.what(), part)) ++failures;
      }
    };
    ContextOptions o = ContextOptions::fromEnv();
    o.proxy.ringCapacity = 3000;
    expectRefused(o, "GDX_RING_SIZE=3000");
    o = ContextOptions::fromEnv();
    o.transport = "foo";
    expectRefused(o, "GDX_TRANSPORT='foo'");
    o = ContextOptions::fromEnv();
    o.transport = "loopback";  // a world of two
    expectRefused(o, "GDX_TRANSPORT=loopback needs a world of one rank");
    o = ContextOptions::fromEnv();
    o.numSignals = 0;
    expectRefused(o, "GDX_NUM_SIGNALS=0");
    // Within every bound alone, too many sockets together for this process's descriptor limit.
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = 1024;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) return 2;
    o = ContextOptions::fromEnv();
    o.proxy.threads = 64;
    o.tcpSockets = 8;
    expectRefused(o, "GDX_PROXY_THREADS=64 x GDX_TCP_SOCKETS=8 x 2 ranks need 2048 sockets");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return failures == 0 && s < 2.0 ? 0 : 1;
  });
  EXPECT_EQ(test::waitChild(pid, 60), 0);
}

}  // namespace
}  // namespace gdx
