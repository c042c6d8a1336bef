// Byte-stream helpers shared by the fuzz targets and the seed generator.
//
// The targets read their parameters front to back, big-endian, and read 0
// once the input is exhausted, so every input is valid and a short input
// simply means "all remaining choices are zero". The seed generator writes
// with the mirror-image Writer, so a seed says exactly what it means.
// (libFuzzer's FuzzedDataProvider reads integers from the end of the input,
// which makes hand-written seeds awkward.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace dblp::fuzz {

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  size_t remaining() const { return n_ - pos_; }
  bool empty() const { return pos_ == n_; }

  uint8_t U8() { return pos_ < n_ ? p_[pos_++] : 0; }
  uint16_t U16() {
    const uint16_t hi = U8();
    return static_cast<uint16_t>((hi << 8) | U8());
  }
  uint32_t U32() {
    const uint32_t hi = U16();
    return (hi << 16) | U16();
  }
  uint64_t U64() {
    const uint64_t hi = U32();
    return (hi << 32) | U32();
  }
  // Up to `n` bytes (fewer at the end of the input), without copying.
  const uint8_t* Bytes(size_t n, size_t* got) {
    *got = n < remaining() ? n : remaining();
    const uint8_t* at = p_ + pos_;
    pos_ += *got;
    return at;
  }
  // Everything not read yet.
  const uint8_t* Rest(size_t* got) { return Bytes(remaining(), got); }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) {
    U8(static_cast<uint8_t>(v >> 8));
    U8(static_cast<uint8_t>(v));
  }
  void U32(uint32_t v) {
    U16(static_cast<uint16_t>(v >> 16));
    U16(static_cast<uint16_t>(v));
  }
  void U64(uint64_t v) {
    U32(static_cast<uint32_t>(v >> 32));
    U32(static_cast<uint32_t>(v));
  }
  void Bytes(const std::vector<uint8_t>& b) {
    out_.insert(out_.end(), b.begin(), b.end());
  }
  const std::vector<uint8_t>& bytes() const { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// A broken promise: print what and where, then abort so libFuzzer records
// the input as a crash (a plain return would hide it).
[[noreturn]] inline void Fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "FUZZ INVARIANT VIOLATED at %s:%d: %s\n", file, line,
               what);
  std::abort();
}

}  // namespace dblp::fuzz

// Checked in every build type: the fuzz build may define NDEBUG.
#define FUZZ_CHECK(cond)                                        \
  do {                                                          \
    if (!(cond)) ::dblp::fuzz::Fail(__FILE__, __LINE__, #cond); \
  } while (0)
