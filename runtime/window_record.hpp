// A window's registration record as the ranks exchange it through the bootstrap (Context::registerWindow and the
// signal window): id, size, the transport's key, and what the direct path needs (a CUDA IPC handle; empty for host
// windows). Layout, little-endian: u32 id | u64 bytes | u32 keyBytes | key | direct (the rest).
// A rank that could not register its memory sends a failure record instead (id kFailedWindowRecord, the reason in
// place of the key), so that every rank fails the registration together, naming it.
#pragma once

#include <cstdint>
#include <string>

namespace gdx {

/// The id of a failure record: above every window id.
constexpr uint32_t kFailedWindowRecord = 0xffffffffu;

struct WindowRecord {
  uint32_t id = 0;
  uint64_t bytes = 0;
  std::string key;  ///< a failure record: why the rank could not register
  std::string direct;
  bool failed() const { return id == kFailedWindowRecord; }
};

std::string encodeWindowRecord(uint32_t id, uint64_t bytes, const std::string& key, const std::string& direct = {});
/// The record of a rank whose own registration step failed for `reason`.
std::string encodeFailedWindowRecord(const std::string& reason);
/// The record `blob` from rank `peer`; throws Error(kProtocol) naming the peer when it is truncated.
WindowRecord decodeWindowRecord(const std::string& blob, int peer);

}  // namespace gdx
