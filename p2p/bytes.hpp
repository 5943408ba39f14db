// Little-endian field packing for the p2p layer's messages, descriptors, metadata and handshake: a writer that
// appends fixed-size fields and a reader that fails (instead of reading past the end) when bytes are missing.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace gdx::p2p {

class ByteWriter {
 public:
  template <typename T>
  ByteWriter& put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // every host gdx supports is little-endian
    out_.append(b, sizeof(T));
    return *this;
  }
  /// A length-prefixed (u32) string.
  ByteWriter& putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  ByteWriter& putRaw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(const void* p, size_t n) : p_(static_cast<const char*>(p)), n_(n) {}
  explicit ByteReader(const std::string& s) : ByteReader(s.data(), s.size()) {}
  explicit ByteReader(std::string&&) = delete;  // it would read a string that is gone
  /// False (and the reader stays failed) when fewer than sizeof(T) bytes are left.
  template <typename T>
  bool get(T* v) {
    if (!ok_ || n_ - at_ < sizeof(T)) return ok_ = false;
    std::memcpy(v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  /// A length-prefixed string of at most `max` bytes.
  bool getString(std::string* s, size_t max) {
    uint32_t len = 0;
    if (!get(&len) || len > max || n_ - at_ < len) return ok_ = false;
    s->assign(p_ + at_, len);
    at_ += len;
    return true;
  }
  bool getRaw(void* dst, size_t n) {
    if (!ok_ || n_ - at_ < n) return ok_ = false;
    std::memcpy(dst, p_ + at_, n);
    at_ += n;
    return true;
  }
  bool ok() const { return ok_; }
  size_t consumed() const { return at_; }
  size_t left() const { return n_ - at_; }

 private:
  const char* p_;
  size_t n_;
  size_t at_ = 0;
  bool ok_ = true;
};

}  // namespace gdx::p2p
