// Test helper: small synthetic Fashion-MNIST-shaped gzipped IDX files.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "training/fashion_mnist.h"

namespace dblp::training::test_util {

inline void Put32(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(static_cast<uint8_t>(v >> 24));
  b.push_back(static_cast<uint8_t>(v >> 16));
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}

// Pixel p of image i: a pattern that covers 0..255.
inline uint8_t Pixel(uint32_t i, uint32_t p) {
  return static_cast<uint8_t>((i * 31 + p * 7) % 256);
}

inline std::vector<uint8_t> ImagesIdx(uint32_t count, uint32_t rows = 28,
                                      uint32_t cols = 28,
                                      uint32_t magic = kIdxImagesMagic) {
  std::vector<uint8_t> b;
  Put32(b, magic);
  Put32(b, count);
  Put32(b, rows);
  Put32(b, cols);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < rows * cols; ++p) b.push_back(Pixel(i, p));
  }
  return b;
}

inline std::vector<uint8_t> LabelsIdx(uint32_t count,
                                      uint32_t magic = kIdxLabelsMagic) {
  std::vector<uint8_t> b;
  Put32(b, magic);
  Put32(b, count);
  for (uint32_t i = 0; i < count; ++i) {
    b.push_back(static_cast<uint8_t>(i % 10));
  }
  return b;
}

inline void WriteGz(const std::filesystem::path& path,
                    const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A fresh directory under /tmp, removed with the fixture.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dblp-training-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void WriteSplit(Split split, const std::vector<uint8_t>& images,
                  const std::vector<uint8_t>& labels) {
    WriteGz(ImagesPath(dir_.string(), split), images);
    WriteGz(LabelsPath(dir_.string(), split), labels);
  }
  std::filesystem::path dir_;
};

}  // namespace dblp::training::test_util
