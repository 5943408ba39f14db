// Little-endian field packing for the records gdx peers exchange (bootstrap frames, transport hellos and
// addresses, window records, p2p messages and handshakes): a writer that appends fixed-size fields and a reader that
// fails (instead of reading past the end) when bytes are missing. A field is its bytes as they lie in memory, which
// is the wire's little-endian order on every host gdx supports; a struct field is its whole layout, padding included
// (the structs sent this way have none).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace gdx {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gdx's wire records are little-endian");

class ByteWriter {
 public:
  template <typename T>
  ByteWriter& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>, "a field is copied as its bytes");
    return putRaw(&v, sizeof(T));
  }
  /// A length-prefixed (u32) string.
  ByteWriter& putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    return putBytes(s);
  }
  /// The bytes of `s` without a length: a field whose length the reader knows (fixed, given before, or the rest).
  ByteWriter& putBytes(const std::string& s) {
    out_.append(s);
    return *this;
  }
  ByteWriter& putRaw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  /// Room for `n` bytes in all, for a writer that knows how long its record will be.
  void reserve(size_t n) { out_.reserve(n); }
  const std::string& bytes() const { return out_; }
  /// The record, leaving the writer empty.
  std::string take() { return std::move(out_); }

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
    static_assert(std::is_trivially_copyable_v<T>, "a field is copied as its bytes");
    return getRaw(v, sizeof(T));
  }
  /// A length-prefixed string of at most `max` bytes.
  bool getString(std::string* s, size_t max) {
    uint32_t len = 0;
    if (!get(&len) || len > max) return ok_ = false;
    return getBytes(s, len);
  }
  /// Exactly `n` bytes as a string (a field whose length the record gave before).
  bool getBytes(std::string* s, size_t n) {
    if (!ok_ || n_ - at_ < n) return ok_ = false;
    s->assign(p_ + at_, n);
    at_ += n;
    return true;
  }
  /// Every byte left.
  bool getRest(std::string* s) { return getBytes(s, left()); }
  bool getRaw(void* dst, size_t n) {
    if (!ok_ || n_ - at_ < n) return ok_ = false;
    std::memcpy(dst, p_ + at_, n);
    at_ += n;
    return true;
  }
  /// Passes over `n` bytes (fields this reader has no use for).
  bool skip(size_t n) {
    if (!ok_ || n_ - at_ < n) return ok_ = false;
    at_ += n;
    return true;
  }
  bool ok() const { return ok_; }
  /// Every field read and nothing left over.
  bool done() const { return ok_ && at_ == n_; }
  size_t consumed() const { return at_; }
  /// The bytes the reader was given.
  size_t size() const { return n_; }
  size_t left() const { return n_ - at_; }

 private:
  const char* p_;
  size_t n_;
  size_t at_ = 0;
  bool ok_ = true;
};

}  // namespace gdx
