// Tables and JSON of benchmark_nvlink's PeerCopyQueue and latency sections (the bandwidth table stays in
// benchmark_nvlink.cu): each prints its rows to stdout and appends its JSON members, each followed by a comma.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/nvlink_latency.cuh"
#include "benchmarks/run_info.hpp"
#include "gdx/peer_copy_queue.hpp"

namespace gdx::bench {

inline std::vector<uint64_t> sizesUpTo(uint64_t max) {
  std::vector<uint64_t> v;
  for (uint64_t s = 4096; s <= max; s *= 4) v.push_back(s);
  return v;
}

// The JSON member `name`, a list of {"bytes": b, "us": v} from results by size, and the comma after it.
inline std::string latencyJson(const char* name, const std::map<uint64_t, double>& us) {
  std::ostringstream js;
  js << "\n  \"" << name << "\": [";
  bool first = true;
  for (auto& [b, v] : us) {
    js << (first ? "\n" : ",\n") << "    {\"bytes\": " << b << ", \"us\": " << v << "}";
    first = false;
  }
  js << "\n  ],";
  return js.str();
}

using Results = std::map<std::string, std::map<uint64_t, double>>;

// PeerCopyQueue by size and by copy blocks beside the one-shot peerCopy and cudaMemcpyPeerAsync of the same run,
// and its 4 KiB forward latency beside the raw host -> GPU -> host round trip; JSON members end with a comma.
inline void printQueue(Results& r, const std::vector<std::string>& grid, const std::map<std::string, double>& forward,
                       uint64_t maxBytes, std::ostringstream& js) {
  auto get = [&](const char* k, uint64_t b) {
    auto it = r[k].find(b);
    return it == r[k].end() ? -1.0 : it->second;
  };
  std::printf(
      "\nPeerCopyQueue, %u copy blocks, transfers submitted back to back from the host (GB/s), beside the "
      "raw limits of this run:\n%12s %10s %14s %11s %11s %11s\n",
      PeerCopyQueue::Options::fromEnv().blocks, "bytes", "queue", "peerCopy (SM)", "memcpyPeer", "q/peerCopy",
      "q/memcpy");
  for (uint64_t b : sizesUpTo(maxBytes)) {
    const double q = get("queue", b), pc = get("peercopy", b), mc = get("memcpy", b);
    std::printf("%12llu %10.1f %14.1f %11.1f %10.2fx %10.2fx\n", (unsigned long long)b, q, pc, mc, pc > 0 ? q / pc : 0,
                mc > 0 ? q / mc : 0);
  }
  std::printf("PeerCopyQueue by copy blocks (peerCopy with its grid capped to as many blocks):\n");
  js << "\n  \"grid\": [";
  bool first = true;
  for (auto& line : grid) {
    std::istringstream ls(line);
    uint64_t b;
    unsigned blocks;
    double pc, q;
    if (!(ls >> b >> blocks >> pc >> q)) continue;
    const double mc = get("memcpy", b);
    std::printf("%12llu B, %3u blocks: PeerCopyQueue %6.1f  peerCopy %6.1f  cudaMemcpyPeerAsync %6.1f GB/s\n",
                (unsigned long long)b, blocks, q, pc, mc);
    js << (first ? "\n" : ",\n") << "    {\"bytes\": " << b << ", \"blocks\": " << blocks << ", \"peer_copy\": " << pc
       << ", \"peer_copy_queue\": " << q << ", \"cuda_memcpy_peer_async\": " << mc << "}";
    first = false;
  }
  js << "\n  ],";
  auto f = [&](const char* k) {
    auto it = forward.find(k);
    return it == forward.end() ? -1.0 : it->second;
  };
  std::printf(
      "PeerCopyQueue 4 KiB forward latency, one transfer at a time, medians timed on the host:\n"
      "  submit -> signal seen by a kernel on GPU 1 -> its ack seen by the host: %.2f us\n"
      "  submit -> the queue's completion count seen by the host:              %.2f us\n"
      "  raw: host writes host memory -> kernel on GPU 1 sees it -> ack seen:  %.2f us\n"
      "  (the first line less about half the raw round trip is the submit -> signal time itself)\n",
      f("signal"), f("completion"), f("raw"));
  js << "\n  \"peer_copy_queue_forward_latency_4KiB_us\": {\"submit_to_signal_on_gpu1_ack_seen_by_host\": "
     << f("signal") << ", \"submit_to_completion_seen_by_host\": " << f("completion")
     << ", \"raw_host_to_gpu1_to_host_round_trip\": " << f("raw") << "},";
}

// Put-with-signal latency by form and size beside a signal alone and NCCL, and the 8-byte put under each encoding
// of the signal's release; JSON members end with a comma.
inline void printLatency(const Results& latency, const std::map<int, double>& encodings,
                         const std::map<uint64_t, double>& ncclLatency, std::ostringstream& js) {
  std::printf(
      "\nput-with-signal latency, us one way (half a ping-pong round trip; -bound: windows bound once):\n%12s %10s "
      "%10s %10s %10s\n",
      "form", "signal", "8 B", "4 KiB", "64 KiB");
  auto at = [&](const char* form, uint64_t b) {
    auto f = latency.find(form);
    if (f == latency.end()) return -1.0;
    auto it = f->second.find(b);
    return it == f->second.end() ? -1.0 : it->second;
  };
  const double signalOnly = at("signal", 0);
  for (const char* form : {"thread", "warp", "block", "thread-bound", "warp-bound", "block-bound"})
    std::printf("%12s %10.2f %10.2f %10.2f %10.2f\n", form, signalOnly, at(form, 8), at(form, 4096), at(form, 65536));
  js << "\n  \"put_with_signal_latency_us_one_way\": [";
  bool first = true;
  for (auto& [form, bytes] : latency)
    for (auto& [b, us] : bytes) {
      js << (first ? "\n" : ",\n") << "    {\"form\": " << jsonString(form) << ", \"bytes\": " << b
         << ", \"us\": " << us << "}";
      first = false;
    }
  js << "\n  ],\n  \"signal_release_encodings_8B_us_one_way\": [";
  first = true;
  for (auto& [e, us] : encodings) {
    std::printf("8 B put, signal released with %s: %.2f us one way\n", encodingName(static_cast<Encoding>(e)), us);
    js << (first ? "\n" : ",\n") << "    {\"encoding\": " << jsonString(encodingName(static_cast<Encoding>(e)))
       << ", \"us\": " << us << "}";
    first = false;
  }
  js << "\n  ],";
  for (auto& [b, us] : ncclLatency)
    std::printf("peer: NCCL send/recv ping-pong, %llu B: %.2f us one way\n", (unsigned long long)b, us);
  js << latencyJson("nccl_latency_us_one_way", ncclLatency);
}

}  // namespace gdx::bench
