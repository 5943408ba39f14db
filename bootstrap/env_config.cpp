// BootstrapConfig::fromEnv: the launcher's variables, so that torchrun, mpirun and srun start gdx unchanged.
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "bootstrap/bootstrap.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

namespace gdx {
namespace {

// The value of a variable as the user wrote it, for messages about how it relates to another one.
struct EnvValue {
  const char* name = nullptr;
  std::string value;
  bool set() const { return name != nullptr; }
};

std::string nameList(std::initializer_list<const char*> names) {
  std::string s;
  for (const char* n : names) s += (s.empty() ? "" : " / ") + std::string(n);
  return s;
}

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, what);
}

// An integer from the first variable of `names` that is set, checked against its row of the configuration table
// (gdx/config.hpp); `required` ones throw when none is.
long long intFrom(std::initializer_list<const char*> names, bool required, long long fallback, EnvValue* used) {
  const char* name = envFirstSet(names);
  *used = {};
  if (!name) {
    if (required) invalid(nameList(names) + " is not set (the rank and world size come from the launcher)");
    return fallback;
  }
  *used = {name, std::getenv(name)};
  return envInt(name, fallback);
}

// A job id known to every rank and to no stranger who does not know the job.
std::string deriveSecret(const std::string& masterAddr, int masterPort) {
  if (std::string v = envString("GDX_JOB_SECRET", ""); !v.empty()) return v;
  if (std::string v = envString("TORCHELASTIC_RUN_ID", ""); !v.empty()) return "torchelastic:" + v;
  if (std::string v = envString("SLURM_JOB_ID", ""); !v.empty()) return "slurm:" + v;
  // Last resort, public knowledge: it only keeps out another job that happens to use the same port by
  // accident (a stale process, a second job on the node), not someone who wants to join.
  return "master:" + masterAddr + ":" + std::to_string(masterPort);
}

}  // namespace

BootstrapConfig BootstrapConfig::fromEnv() {
  BootstrapConfig c;
  EnvValue rankVar, worldVar, localVar, portVar;
  long long rank = intFrom({"GDX_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, true, 0, &rankVar);
  long long world =
      intFrom({"GDX_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, true, 1, &worldVar);
  long long local =
      intFrom({"GDX_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, false, -1, &localVar);
  long long port = intFrom({"GDX_MASTER_PORT", "MASTER_PORT"}, false, 29500, &portVar);

  if (rank < 0 || rank >= world)
    invalid(std::string(rankVar.name) + "=" + rankVar.value + " is out of range for world size " +
            std::to_string(world) + " (from " + worldVar.name + ")");
  if (localVar.set() && (local < 0 || local >= world))
    invalid(std::string(localVar.name) + "=" + localVar.value + " is out of range for world size " +
            std::to_string(world));

  c.rank = static_cast<int>(rank);
  c.worldSize = static_cast<int>(world);
  c.localRank = static_cast<int>(local);
  c.masterPort = static_cast<int>(port);
  c.masterAddr = envFirst({"GDX_MASTER_ADDR", "MASTER_ADDR"}, "127.0.0.1");
  c.secret = deriveSecret(c.masterAddr, c.masterPort);

  EnvValue hostIdVar, hostsVar;
  const long long hostId = intFrom({"GDX_HOST_ID"}, false, -1, &hostIdVar);
  const long long hosts = intFrom({"GDX_HOSTS"}, false, 0, &hostsVar);
  if (hostIdVar.set()) {
    c.emulatedHost = static_cast<int>(hostId);
  } else if (hostsVar.set()) {
    if (hosts > world || world % hosts != 0)
      invalid("GDX_HOSTS=" + hostsVar.value + " must divide the world size " + std::to_string(world));
    c.emulatedHost = static_cast<int>(rank / (world / hosts));
  }

  EnvValue timeoutVar;
  long long timeoutMs = intFrom({"GDX_BOOTSTRAP_TIMEOUT_MS"}, false, 0, &timeoutVar);
  if (timeoutVar.set()) {
    c.timeoutNs = static_cast<uint64_t>(timeoutMs) * 1000000ull;
  } else {
    c.timeoutNs = defaultTimeoutNs();
  }
  return c;
}

}  // namespace gdx
