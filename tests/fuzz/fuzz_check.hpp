// What every fuzz target shares: an assertion that stays on in every build (a failed one aborts, which libFuzzer
// reports as a crash and saves the input), and a cursor that takes fields off the fuzzer's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define GDX_FUZZ_CHECK(cond)                                                             \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace gdx::fuzz {

/// Takes values off the front of the input; past its end every value is zero, so any input is a valid script.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <class T>
  T take() {
    T v{};
    const size_t n = sizeof v < size_ - pos_ ? sizeof v : size_ - pos_;
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  /// Up to `n` bytes (fewer at the end of the input).
  std::string bytes(size_t n) {
    if (n > size_ - pos_) n = size_ - pos_;
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string rest() { return bytes(size_ - pos_); }
  bool empty() const { return pos_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace gdx::fuzz
