// A window's registration record as the ranks exchange it through the bootstrap (Context::registerWindow and the
// signal window): id, size, the transport's key, and what the direct path needs (a CUDA IPC handle; empty for host
// windows). Layout, little-endian: u32 id | u64 bytes | u32 keyBytes | key | direct (the rest).
#pragma once

#include <cstdint>
#include <string>

namespace gdx {

struct WindowRecord {
  uint32_t id = 0;
  uint64_t bytes = 0;
  std::string key;
  std::string direct;
};

constexpr size_t kWindowRecordHeaderBytes = 16;

std::string encodeWindowRecord(uint32_t id, uint64_t bytes, const std::string& key, const std::string& direct = {});
/// The record `blob` from rank `peer`; throws Error(kProtocol) naming the peer when it is truncated.
WindowRecord decodeWindowRecord(const std::string& blob, int peer);

}  // namespace gdx
