#include "proxy/trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "gdx/device/impl/command.hpp"
#include "gdx/error.hpp"

namespace gdx {
namespace {

const char* kindName(TraceKind k) {
  switch (k) {
    case TraceKind::kPickup: return "pickup";
    case TraceKind::kPost: return "post";
    case TraceKind::kComplete: return "complete";
    case TraceKind::kReject: return "reject";
  }
  return "?";
}

std::string eventName(const TraceEvent& e) {
  if (e.kind == TraceKind::kPost) return "write";
  if (e.kind == TraceKind::kComplete) return "completion";
  return opcodeName(static_cast<Opcode>(e.opcode));
}

void describe(std::ostream& os, const TraceEvent& e) {
  os << kindName(e.kind) << ' ' << eventName(e) << " peer " << e.peer;
  if (e.kind == TraceKind::kComplete)
    os << " status " << e.status << " cookie " << e.position;
  else
    os << " window " << e.window << " offset " << e.offset << " bytes " << e.bytes
       << (e.kind == TraceKind::kPost ? " cookie " : " position ") << e.position;
}

}  // namespace

std::vector<TraceEvent> TraceBuffer::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t kept = std::min<uint64_t>(next_, events_.size());
  std::vector<TraceEvent> out;
  out.reserve(kept);
  for (uint64_t i = next_ - kept; i < next_; ++i) out.push_back(events_[i % events_.size()]);
  return out;
}

std::string tracePath(const std::string& pattern, int rank) {
  if (pattern.empty()) return {};
  const std::string r = std::to_string(rank);
  std::string path = pattern;
  const size_t at = path.find("%r");
  if (at != std::string::npos) return path.replace(at, 2, r);
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) return path.insert(dot, ".rank" + r);
  return path + ".rank" + r;
}

void checkTraceWritable(const std::string& path) {
  if (path.empty()) return;
  std::FILE* f = std::fopen(path.c_str(), "a");  // creates it, keeps what is there until the trace replaces it
  if (!f) {
    const int err = errno;
    throw Error(ErrorCode::kInvalidArgument,
                "GDX_TRACE: cannot write " + path + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
  }
  std::fclose(f);
}

void writeChromeTrace(const std::string& path, int rank, const std::vector<const TraceBuffer*>& threads) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw Error(ErrorCode::kInvalidArgument, "GDX_TRACE: cannot write " + path);
  std::fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
  std::fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"gdx rank %d\"}}", rank,
               rank);
  for (size_t t = 0; t < threads.size(); ++t) {
    std::fprintf(f,
                 ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%zu,\"args\":{\"name\":\"proxy %zu\"}}",
                 rank, t, t);
    for (const TraceEvent& e : threads[t]->snapshot())
      std::fprintf(f,
                   ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%d,\"tid\":%zu,"
                   "\"args\":{\"ring\":%u,\"peer\":%d,\"window\":%u,\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64
                   ",\"position\":%" PRIu64 ",\"status\":%u}}",
                   eventName(e).c_str(), kindName(e.kind), static_cast<double>(e.ns) / 1000.0, rank, t, e.ring, e.peer,
                   e.window, e.offset, e.bytes, e.position, e.status);
  }
  std::fprintf(f, "\n]}\n");
  if (std::fclose(f) != 0) throw Error(ErrorCode::kInvalidArgument, "GDX_TRACE: writing " + path + " failed");
}

std::string recentByPeer(const std::vector<const TraceBuffer*>& threads, size_t perPeer) {
  std::map<int, std::vector<TraceEvent>> byPeer;
  for (const TraceBuffer* b : threads)
    for (const TraceEvent& e : b->snapshot()) byPeer[e.peer].push_back(e);
  std::ostringstream os;
  for (auto& [peer, events] : byPeer) {
    std::sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.ns < b.ns; });
    const size_t from = events.size() > perPeer ? events.size() - perPeer : 0;
    os << "\n  peer " << peer << ": last " << events.size() - from << " of " << events.size() << " traced events";
    for (size_t i = from; i < events.size(); ++i) {
      os << "\n    " << events[i].ns << " ns: ";
      describe(os, events[i]);
    }
  }
  return os.str();
}

}  // namespace gdx
