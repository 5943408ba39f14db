#include "gdx/config.hpp"

#include <strings.h>
#include <unistd.h>  // environ (g++ defines _GNU_SOURCE)

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "base/log.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/error.hpp"

namespace gdx {
namespace {

// Bounds that several rows share. The bootstrap can describe more ranks than a Context can address (kMaxPeers,
// checked by the Context before it joins); the bound here only keeps the numbers sane.
constexpr int64_t kMaxRanks = int64_t{1} << 20;
constexpr int64_t kMaxHostName = 255;
constexpr int64_t kMaxSecret = 4096;  // tcp::kMaxSecretBytes: a longer secret could not be presented to peers

constexpr EnvKind kInt = EnvKind::kInt;
constexpr EnvKind kBool = EnvKind::kBool;
constexpr EnvKind kChoice = EnvKind::kChoice;
constexpr EnvKind kString = EnvKind::kString;

// The upper bounds are what gdx can use, not what a machine could hold: a value past them is a typo or a
// misunderstanding (GDX_PROXY_THREADS=1000 once started thousands of threads and sockets and never returned).
const EnvVar kVariables[] = {
    // Launcher: gdx's own names first, then torchrun's, Open MPI's, PMI's and Slurm's, read in that order.
    {"GDX_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "required", "this process's rank"},
    {"RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "required", "rank (torchrun)"},
    {"OMPI_COMM_WORLD_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "required", "rank (Open MPI)"},
    {"PMI_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "required", "rank (PMI)"},
    {"SLURM_PROCID", kInt, 0, kMaxRanks - 1, 0, nullptr, "required", "rank (Slurm)"},
    {"GDX_WORLD_SIZE", kInt, 1, kMaxRanks, 0, nullptr, "required", "number of ranks"},
    {"WORLD_SIZE", kInt, 1, kMaxRanks, 0, nullptr, "required", "number of ranks (torchrun)"},
    {"OMPI_COMM_WORLD_SIZE", kInt, 1, kMaxRanks, 0, nullptr, "required", "number of ranks (Open MPI)"},
    {"PMI_SIZE", kInt, 1, kMaxRanks, 0, nullptr, "required", "number of ranks (PMI)"},
    {"SLURM_NTASKS", kInt, 1, kMaxRanks, 0, nullptr, "required", "number of ranks (Slurm)"},
    {"GDX_LOCAL_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "from the hostnames", "rank on this host"},
    {"LOCAL_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "from the hostnames", "rank on this host (torchrun)"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", kInt, 0, kMaxRanks - 1, 0, nullptr, "from the hostnames",
     "rank on this host (Open MPI)"},
    {"SLURM_LOCALID", kInt, 0, kMaxRanks - 1, 0, nullptr, "from the hostnames", "rank on this host (Slurm)"},
    {"GDX_MASTER_ADDR", kString, 0, kMaxHostName, 0, nullptr, "127.0.0.1", "host of rank 0's rendezvous"},
    {"MASTER_ADDR", kString, 0, kMaxHostName, 0, nullptr, "127.0.0.1", "host of the rendezvous (torchrun)"},
    {"GDX_MASTER_PORT", kInt, 1, 65535, 0, nullptr, "29500", "port of the rendezvous"},
    {"MASTER_PORT", kInt, 1, 65535, 0, nullptr, "29500", "port of the rendezvous (torchrun)"},
    // The derived secret carries a prefix ("torchelastic:", "slurm:"), hence the room left below kMaxSecret.
    {"GDX_JOB_SECRET", kString, 0, kMaxSecret, 0, nullptr, "derived from the launcher's job id",
     "per-job secret every connection must present"},
    {"TORCHELASTIC_RUN_ID", kString, 0, kMaxSecret - 64, 0, nullptr, "unset", "job id the secret is derived from"},
    {"SLURM_JOB_ID", kString, 0, kMaxSecret - 64, 0, nullptr, "unset", "job id the secret is derived from"},
    {"GDX_TIMEOUT_MS", kInt, 1, kMaxTimeoutMs, 0, nullptr, "30000", "bound of every wait (host and device), ms"},
    {"GDX_BOOTSTRAP_TIMEOUT_MS", kInt, 1, kMaxTimeoutMs, 0, nullptr, "GDX_TIMEOUT_MS", "bound of joining the job, ms"},
    {"GDX_TRANSPORT", kChoice, 0, 0, 0, "tcp,verbs,loopback", "tcp", "transport between hosts"},
    // Verbs: the bounds are those of the fields the values end up in (ibv_ah_attr, ibv_qp_attr).
    {"GDX_IB_HCA", kString, 0, 4096, 0, nullptr, "first active port", "verbs devices, NCCL_IB_HCA syntax"},
    {"GDX_IB_GID_INDEX", kInt, 0, 255, 0, nullptr, "first RoCE v2 IPv4-mapped GID", "GID index"},
    {"GDX_IB_SL", kInt, 0, 15, 0, nullptr, "0", "service level"},
    {"GDX_IB_TC", kInt, 0, 255, 0, nullptr, "0", "traffic class"},
    {"GDX_IB_SEND_DEPTH", kInt, 1, 1 << 20, 0, nullptr, "see transport.hpp", "send queue depth"},
    {"GDX_IB_RECV_DEPTH", kInt, 1, 1 << 20, 0, nullptr, "see transport.hpp", "receive queue depth"},
    {"GDX_IB_TIMEOUT", kInt, 0, 31, 0, nullptr, "see transport.hpp", "RC local ACK timeout (4.096 us * 2^value)"},
    {"GDX_IB_RETRY_CNT", kInt, 0, 7, 0, nullptr, "see transport.hpp", "RC retries"},
    {"GDX_IB_SIGNAL_EVERY", kInt, 1, 1 << 20, 0, nullptr, "16", "signal one send work request in this many"},
    {"GDX_IB_FORCE_STAGING", kBool, 0, 0, 0, nullptr, "0", "stage host windows like unregistrable GPU windows"},
    {"GDX_IB_NATIVE_ATOMICS", kBool, 0, 0, 0, nullptr, "0", "remote adds with the NIC's fetch-and-add"},
    // GPU and the direct path.
    {"GDX_CUDA_DEVICE", kInt, 0, 1023, 0, nullptr, "the current CUDA device", "GPU this process drives"},
    {"GDX_DIRECT", kBool, 0, 0, 0, nullptr, "1", "reach same-host GPU peers directly over NVLink"},
    {"GDX_COPY_QUEUE_BLOCKS", kInt, 1, 1024, 0, nullptr, "32", "copy blocks of a PeerCopyQueue"},
    {"GDX_COPY_QUEUE_DEPTH", kInt, 2, 1 << 24, 0, nullptr, "1024", "transfers in flight in a PeerCopyQueue"},
    {"GDX_COPY_QUEUE_CHUNK", kInt, 16, int64_t{1} << 31, kEnvMultipleOf16, nullptr, "65536",
     "smallest piece of a transfer a copy block copies"},
    {"GDX_COPY_QUEUE_IDLE_US", kInt, 0, kMaxTimeoutMs * 1000, 0, nullptr, "1000",
     "the persistent copy kernel leaves after this long without work, us"},
    // TCP.
    {"GDX_TCP_SOCKETS", kInt, 1, 64, 0, nullptr, "4", "sockets per peer and lane"},
    // The bound is tcp::kMaxChunkBytes (transport/tcp/wire.hpp; config_test checks that they agree).
    {"GDX_TCP_CHUNK", kInt, 1, int64_t{1} << 30, 0, nullptr, "1048576", "writes above this are split over sockets"},
    {"GDX_P2P_PORT", kInt, 1, 65535, 0, nullptr, "19500", "p2p endpoints listen on this port + their GPU index"},
    {"GDX_P2P_HELLO_MS", kInt, 1, kMaxTimeoutMs, 0, nullptr, "5000 (at most GDX_TIMEOUT_MS)",
     "a client connecting to a p2p endpoint sends its hello within this, ms"},
    // The TCPX session API's own names (gdx/p2p/tcpx_session.hpp says what each maps to).
    {"UCCL_TCPX_NUM_CHANNELS", kInt, 1, 64, 0, nullptr, "2", "TcpxSession: connections (channels) per peer"},
    {"NCCL_NSOCKS_PERTHREAD", kInt, 1, 64, 0, nullptr, "2", "TcpxSession: TCP sockets per channel"},
    {"UCCL_TCPX_CHUNK_BYTES", kInt, 1, int64_t{1} << 30, 0, nullptr, "524288",
     "TcpxSession: posts are cut into pieces of this size, dealt over the channels"},
    {"GDX_TCP_BIND_ADDR", kString, 0, kMaxHostName, 0, nullptr, "the address that reaches the master",
     "interface address the TCP transport listens on"},
    // Proxy.
    {"GDX_PROXY_THREADS", kInt, 1, 64, 0, nullptr, "1", "proxy threads (each with its own transport lane)"},
    {"GDX_RINGS_PER_THREAD", kInt, 0, 127, 0, nullptr, "1", "command rings per proxy thread"},
    {"GDX_DEVICE_RINGS_PER_THREAD", kInt, 0, 127, 0, nullptr, "4 with a GPU, else 0",
     "command rings for GPU producers per proxy thread"},
    {"GDX_RING_SIZE", kInt, 2, int64_t{1} << 24, kEnvPowerOfTwo, nullptr, "4096", "slots per command ring"},
    {"GDX_PROXY_TIMING", kBool, 0, 0, 0, nullptr, "0", "proxy threads time their work (ProxyCounters)"},
    {"GDX_PROXY_MAX_INFLIGHT", kInt, 1, 1 << 20, 0, nullptr, "1024", "operations in flight per proxy thread"},
    {"GDX_NUMA_NODE", kInt, -1, 4095, 0, nullptr, "the GPU's node, else the calling thread's",
     "NUMA node for proxy threads and rings (-1: the default)"},
    {"GDX_NUM_SIGNALS", kInt, 1, kMaxSignals, 0, nullptr, "1024", "64-bit signals per rank"},
    {"GDX_LOG_LEVEL", kChoice, 0, 0, 0, "ERROR,WARN,INFO,DEBUG,TRACE", "WARN", "least severe message logged"},
    // Post-mortems and fault injection (proxy/trace.hpp, transport/common/fault.hpp).
    {"GDX_TRACE", kString, 0, 4096, 0, nullptr, "unset", "file the proxy's trace is written to (%r: the rank)"},
    {"GDX_TRACE_EVENTS", kInt, 1, int64_t{1} << 24, 0, nullptr, "65536", "trace events kept per proxy thread"},
    {"GDX_FAULT", kString, 0, 256, 0, nullptr, "unset", "tests only: ACTION:PEER:N[:MS] (transport/common/fault.hpp)"},
    // Emulated hosts (tests and benchmarks of the internode path on one machine).
    {"GDX_HOSTS", kInt, 1, kMaxRanks, 0, nullptr, "unset", "split the ranks into this many emulated hosts"},
    {"GDX_HOST_ID", kInt, 0, kMaxRanks - 1, 0, nullptr, "unset", "this rank's emulated host"},
};

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, what);
}

// The value of a set variable, or nullptr; an empty value counts as unset (launchers export empty variables).
const char* valueOf(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

std::string allowedRange(const EnvVar& var) {
  std::string s = "[" + std::to_string(var.min) + ", " + std::to_string(var.max) + "]";
  if (var.flags & kEnvPowerOfTwo) s = "a power of two in " + s;
  if (var.flags & kEnvMultipleOf16) s = "a multiple of 16 in " + s;
  return s;
}

// "NAME='value' <problem>; allowed: ... (meaning)": every error about a variable says all of that.
[[noreturn]] void refuse(const EnvVar& var, const char* value, const std::string& problem, const std::string& allowed) {
  invalid(std::string(var.name) + "='" + value + "' " + problem + "; allowed: " + allowed + " (" + var.help + ")");
}

int64_t parseInt(const EnvVar& var, const char* v) {
  // Decimal, or hexadecimal with 0x. Not strtoll's base 0: that reads "010" as octal 8.
  const char* digits = v;
  if (*digits == '+' || *digits == '-') ++digits;
  const bool hex = digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X');
  // strtoll skips leading spaces and takes a sign after "0x"; neither is a number as written here.
  const char* first = hex ? digits + 2 : digits;
  const bool digitFirst =
      hex ? std::isxdigit(static_cast<unsigned char>(*first)) : std::isdigit(static_cast<unsigned char>(*first));
  errno = 0;
  char* end = nullptr;
  const long long x = digitFirst ? std::strtoll(v, &end, hex ? 16 : 10) : 0;
  if (!digitFirst || end == v || *end != '\0') refuse(var, v, "is not an integer", allowedRange(var));
  if (errno == ERANGE) refuse(var, v, "does not fit in 64 bits", allowedRange(var));
  if (x < var.min || x > var.max) refuse(var, v, "is out of range", allowedRange(var));
  if ((var.flags & kEnvPowerOfTwo) && (x & (x - 1)) != 0) refuse(var, v, "is not a power of two", allowedRange(var));
  if ((var.flags & kEnvMultipleOf16) && x % 16 != 0) refuse(var, v, "is not a multiple of 16", allowedRange(var));
  return x;
}

bool parseBool(const EnvVar& var, const char* v) {
  for (const char* t : {"1", "true", "yes", "on"})
    if (!strcasecmp(v, t)) return true;
  for (const char* f : {"0", "false", "no", "off"})
    if (!strcasecmp(v, f)) return false;
  refuse(var, v, "is not a boolean", "0 or 1 (false/true, no/yes, off/on)");
}

std::string parseChoice(const EnvVar& var, const char* v) {
  std::string list = var.choices;
  for (size_t start = 0; start <= list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string choice = list.substr(start, comma - start);
    if (!strcasecmp(v, choice.c_str())) return choice;
    start = comma + 1;
  }
  std::string shown;
  for (char c : list) shown += c == ',' ? std::string(", ") : std::string(1, c);
  refuse(var, v, "is not a known value", shown);
}

void checkString(const EnvVar& var, const char* v) {
  if (static_cast<int64_t>(std::strlen(v)) > var.max)
    invalid(std::string(var.name) + " is " + std::to_string(std::strlen(v)) + " bytes long; allowed: at most " +
            std::to_string(var.max) + " (" + var.help + ")");
}

// Variables of gdx's own programs (benchmarks, tests, the build), not of the library: not typos.
bool programVariable(const std::string& name) {
  for (const char* prefix : {"GDX_BENCH_", "GDX_PLOT_", "GDX_TEST_"})
    if (name.compare(0, std::strlen(prefix), prefix) == 0) return true;
  for (const char* suffix : {"_CHILD", "_RESULTS"})
    if (name.size() >= std::strlen(suffix) &&
        name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
      return true;
  for (const char* exact : {"GDX_NO_APT", "GDX_REQUIRE_RDMA", "GDX_RING_STRESS_COUNT", "GDX_VERBS_WORLD"})
    if (name == exact) return true;
  return false;
}

// A GDX_ variable that nothing reads is most likely a misspelt one (GDX_PROXY_THREAD=4 would otherwise change
// nothing, silently). A warning, once per name: it may also be meant for another version of gdx.
void warnUnknownVariables() {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string name(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    if (name.compare(0, 4, "GDX_") != 0 || programVariable(name) || warned.count(name)) continue;
    bool known = false;
    for (const EnvVar& var : kVariables) known = known || name == var.name;
    if (known) continue;
    warned.insert(name);
    GDX_WARN(name << " is set but gdx reads no such variable (README.md lists them)");
  }
}

const EnvVar& rowOfKind(const char* name, EnvKind kind) {
  const EnvVar& var = envVar(name);
  if (var.kind != kind) throw Error(ErrorCode::kInternal, std::string(name) + " is read as another type");
  return var;
}

}  // namespace

const EnvVar* envVariables(size_t* count) {
  *count = sizeof kVariables / sizeof kVariables[0];
  return kVariables;
}

const EnvVar& envVar(const char* name) {
  for (const EnvVar& var : kVariables)
    if (!std::strcmp(var.name, name)) return var;
  throw Error(ErrorCode::kInternal, std::string(name) + " is read but is not in the configuration table");
}

int64_t envInt(const char* name, int64_t fallback) {
  const EnvVar& var = rowOfKind(name, EnvKind::kInt);
  const char* v = valueOf(name);
  return v ? parseInt(var, v) : fallback;
}

bool envBool(const char* name, bool fallback) {
  const EnvVar& var = rowOfKind(name, EnvKind::kBool);
  const char* v = valueOf(name);
  return v ? parseBool(var, v) : fallback;
}

std::string envChoice(const char* name, const std::string& fallback) {
  const EnvVar& var = rowOfKind(name, EnvKind::kChoice);
  const char* v = valueOf(name);
  return v ? parseChoice(var, v) : fallback;
}

std::string envString(const char* name, const std::string& fallback) {
  const EnvVar& var = rowOfKind(name, EnvKind::kString);
  const char* v = valueOf(name);
  if (!v) return fallback;
  checkString(var, v);
  return v;
}

const char* envFirstSet(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    envVar(n);  // every name read must have its row
    if (valueOf(n)) return n;
  }
  return nullptr;
}

std::string envFirst(std::initializer_list<const char*> names, const std::string& fallback) {
  const char* n = envFirstSet(names);
  return n ? envString(n, fallback) : fallback;
}

void checkEnvironment() {
  std::string errors;
  for (const EnvVar& var : kVariables) {
    const char* v = valueOf(var.name);
    if (!v) continue;
    try {
      switch (var.kind) {
        case EnvKind::kInt: parseInt(var, v); break;
        case EnvKind::kBool: parseBool(var, v); break;
        case EnvKind::kChoice: parseChoice(var, v); break;
        case EnvKind::kString: checkString(var, v); break;
      }
    } catch (const Error& e) {
      // One message for all of them: drop each one's "gdx invalid argument: " prefix.
      const std::string prefix = std::string("gdx ") + errorCodeName(ErrorCode::kInvalidArgument) + ": ";
      std::string m = e.what();
      if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
      errors += (errors.empty() ? "" : "; ") + m;
    }
  }
  if (!errors.empty()) invalid("invalid configuration: " + errors);
  warnUnknownVariables();
}

uint64_t defaultTimeoutNs() {
  const int64_t ms = envInt("GDX_TIMEOUT_MS", static_cast<int64_t>(kDefaultTimeoutNs / 1000000));
  return static_cast<uint64_t>(ms) * 1000000ull;
}

}  // namespace gdx
