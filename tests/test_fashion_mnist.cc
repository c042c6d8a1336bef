// The Fashion-MNIST reader on small synthetic gzipped IDX files: parsing,
// normalisation, every malformed case, the missing-file message, and the
// workers' shards. No libtorch.
#include "training/fashion_mnist.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "idx_files.h"

namespace dblp::training {
namespace {

namespace fs = std::filesystem;
using test_util::ImagesIdx;
using test_util::LabelsIdx;
using test_util::Pixel;
using test_util::Put32;
using test_util::WriteGz;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

using FashionMnistFiles = test_util::TempDirTest;

TEST_F(FashionMnistFiles, ParsesAndNormalises) {
  WriteSplit(Split::kTrain, ImagesIdx(5), LabelsIdx(5));
  const Dataset d = LoadFashionMnist(dir_.string(), Split::kTrain);
  ASSERT_EQ(d.count, 5u);
  ASSERT_EQ(d.images.size(), 5u * 784);
  ASSERT_EQ(d.labels.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(d.labels[i], i % 10);
    for (uint32_t p = 0; p < 784; ++p) {
      const float want =
          (static_cast<float>(Pixel(i, p)) / 255.0f - kPixelMean) / kPixelStd;
      ASSERT_FLOAT_EQ(d.images[i * 784 + p], want) << i << " " << p;
    }
  }
  // The two extremes of the byte range.
  EXPECT_FLOAT_EQ(d.images[0], -kPixelMean / kPixelStd);  // pixel 0
  bool saw255 = false;
  for (uint32_t p = 0; p < 784; ++p) {
    if (Pixel(0, p) == 255) {
      EXPECT_FLOAT_EQ(d.images[p], (1.0f - kPixelMean) / kPixelStd);
      saw255 = true;
    }
  }
  EXPECT_TRUE(saw255);
}

TEST_F(FashionMnistFiles, SelectsIndicesInOrder) {
  WriteSplit(Split::kTest, ImagesIdx(7), LabelsIdx(7));
  const std::vector<uint32_t> idx = {6, 0, 3};
  const Dataset d = LoadFashionMnist(dir_.string(), Split::kTest, idx);
  ASSERT_EQ(d.count, 3u);
  const Dataset all = LoadFashionMnist(dir_.string(), Split::kTest);
  for (size_t k = 0; k < idx.size(); ++k) {
    EXPECT_EQ(d.labels[k], all.labels[idx[k]]);
    for (uint32_t p = 0; p < 784; ++p) {
      ASSERT_EQ(d.images[k * 784 + p], all.images[idx[k] * 784 + p]);
    }
  }
  const std::vector<uint32_t> bad = {7};
  EXPECT_THROW(LoadFashionMnist(dir_.string(), Split::kTest, bad),
               std::out_of_range);
}

TEST_F(FashionMnistFiles, ReadsUncompressedFilesToo) {
  // zlib reads a plain file transparently: an unpacked copy still works.
  const auto b = ImagesIdx(2);
  std::ofstream(ImagesPath(dir_.string(), Split::kTrain), std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()),
             static_cast<std::streamsize>(b.size()));
  WriteGz(LabelsPath(dir_.string(), Split::kTrain), LabelsIdx(2));
  EXPECT_EQ(LoadFashionMnist(dir_.string(), Split::kTrain).count, 2u);
}

TEST_F(FashionMnistFiles, MissingFileNamesPathAndPackage) {
  const std::string msg =
      ErrorOf([&] { LoadRawSplit(dir_.string(), Split::kTrain); });
  EXPECT_NE(msg.find(ImagesPath(dir_.string(), Split::kTrain)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data_dir"), std::string::npos) << msg;
  // Images present, labels missing: the labels file is the one named.
  WriteGz(ImagesPath(dir_.string(), Split::kTrain), ImagesIdx(1));
  const std::string msg2 =
      ErrorOf([&] { LoadRawSplit(dir_.string(), Split::kTrain); });
  EXPECT_NE(msg2.find(LabelsPath(dir_.string(), Split::kTrain)),
            std::string::npos)
      << msg2;
}

TEST_F(FashionMnistFiles, CountMismatch) {
  WriteSplit(Split::kTrain, ImagesIdx(4), LabelsIdx(3));
  const std::string msg =
      ErrorOf([&] { LoadRawSplit(dir_.string(), Split::kTrain); });
  EXPECT_NE(msg.find("4 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 labels"), std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, TruncatedGzipStream) {
  const std::string path = ImagesPath(dir_.string(), Split::kTrain);
  WriteGz(path, ImagesIdx(20));
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string msg = ErrorOf([&] { ReadGzipFile(path, 1 << 24); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, CorruptGzipData) {
  const std::string path = ImagesPath(dir_.string(), Split::kTrain);
  WriteGz(path, ImagesIdx(20));
  std::vector<char> bytes(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(bytes.data(),
      static_cast<std::streamsize>(bytes.size()));
  for (size_t i = 20; i < 60; ++i) bytes[i] = static_cast<char>(0xFF);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const std::string msg = ErrorOf([&] { ReadGzipFile(path, 1 << 24); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt gzip data"), std::string::npos) << msg;
}

TEST_F(FashionMnistFiles, DecompressedSizeBounded) {
  const std::string path = ImagesPath(dir_.string(), Split::kTrain);
  WriteGz(path, std::vector<uint8_t>(3 << 20, 0));  // compresses to ~3 KiB
  const std::string msg = ErrorOf([&] { ReadGzipFile(path, 1 << 20); });
  EXPECT_NE(msg.find("decompressed"), std::string::npos) << msg;
}

TEST(IdxImages, BadMagic) {
  const std::string msg = ErrorOf(
      [] { ParseIdxImages(ImagesIdx(1, 28, 28, kIdxLabelsMagic), "f"); });
  EXPECT_NE(msg.find("bad IDX magic 2049"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 2051"), std::string::npos) << msg;
  // Dimension count in the magic's low byte, data type in the next one.
  EXPECT_THROW(ParseIdxImages(ImagesIdx(1, 28, 28, 0x00000903), "f"),
               std::runtime_error);  // 3 dims, but i8 rather than u8
  EXPECT_THROW(ParseIdxImages(ImagesIdx(1, 28, 28, 0x00000802), "f"),
               std::runtime_error);  // u8, 2 dims
}

TEST(IdxImages, WrongDimensions) {
  for (auto [r, c] : {std::pair{27u, 28u}, {28u, 29u}, {32u, 32u}, {0u, 0u}}) {
    const std::string msg =
        ErrorOf([&] { ParseIdxImages(ImagesIdx(1, r, c), "f"); });
    EXPECT_NE(msg.find("expected 28x28"), std::string::npos) << msg;
  }
}

TEST(IdxImages, CountBounds) {
  std::vector<uint8_t> zero = ImagesIdx(0);
  EXPECT_NE(ErrorOf([&] { ParseIdxImages(zero, "f"); }).find("item count"),
            std::string::npos);
  // A header that claims more than the bound fails before any allocation.
  std::vector<uint8_t> huge;
  Put32(huge, kIdxImagesMagic);
  Put32(huge, kMaxIdxItems + 1);
  Put32(huge, 28);
  Put32(huge, 28);
  EXPECT_NE(ErrorOf([&] { ParseIdxImages(huge, "f"); }).find("item count"),
            std::string::npos);
}

TEST(IdxImages, TruncatedHeaderPayloadAndTrailingBytes) {
  std::vector<uint8_t> b = ImagesIdx(3);
  const std::vector<uint8_t> header(b.begin(), b.begin() + 10);
  EXPECT_NE(ErrorOf([&] { ParseIdxImages(header, "f"); })
                .find("truncated IDX header"),
            std::string::npos);
  const std::vector<uint8_t> shortp(b.begin(), b.end() - 1);
  EXPECT_NE(ErrorOf([&] { ParseIdxImages(shortp, "f"); }).find("truncated"),
            std::string::npos);
  b.push_back(0);
  EXPECT_NE(ErrorOf([&] { ParseIdxImages(b, "f"); }).find("trailing"),
            std::string::npos);
  EXPECT_NO_THROW(ParseIdxImages(ImagesIdx(3), "f"));
}

TEST(IdxLabels, Malformed) {
  EXPECT_NE(ErrorOf([] { ParseIdxLabels(LabelsIdx(2, kIdxImagesMagic), "f"); })
                .find("expected 2049"),
            std::string::npos);
  std::vector<uint8_t> b = LabelsIdx(4);
  const std::vector<uint8_t> shortp(b.begin(), b.end() - 2);
  EXPECT_NE(ErrorOf([&] { ParseIdxLabels(shortp, "f"); }).find("truncated"),
            std::string::npos);
  const std::vector<uint8_t> header(b.begin(), b.begin() + 5);
  EXPECT_NE(ErrorOf([&] { ParseIdxLabels(header, "f"); })
                .find("truncated IDX header"),
            std::string::npos);
  b.push_back(1);
  EXPECT_NE(ErrorOf([&] { ParseIdxLabels(b, "f"); }).find("trailing"),
            std::string::npos);
  std::vector<uint8_t> bad = LabelsIdx(3);
  bad.back() = 10;
  EXPECT_NE(ErrorOf([&] { ParseIdxLabels(bad, "f"); }).find("label 10"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ParseIdxLabels(LabelsIdx(0), "f"); })
                .find("item count"),
            std::string::npos);
  EXPECT_EQ(ParseIdxLabels(LabelsIdx(12), "f").size(), 12u);
}

TEST(Shards, PermutationIsDeterministicAndComplete) {
  const auto a = SeededPermutation(1000, 42);
  EXPECT_EQ(a, SeededPermutation(1000, 42));
  EXPECT_NE(a, SeededPermutation(1000, 43));
  EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), 1000u);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 999u);
  EXPECT_TRUE(SeededPermutation(0, 1).empty());
  EXPECT_EQ(SeededPermutation(1, 1), std::vector<uint32_t>{0});
  // Pinned values: a change to the shuffle would silently re-shard jobs
  // whose workers run different builds.
  EXPECT_EQ(SeededPermutation(8, 1),
            (std::vector<uint32_t>{4, 3, 2, 7, 5, 6, 0, 1}));
  EXPECT_EQ(ShardIndices(10, 1, 3, 1), (std::vector<uint32_t>{1, 9, 3}));
}

TEST(Shards, DisjointAndCovering) {
  for (uint32_t n : {1u, 7u, 100u, 60000u}) {
    for (uint32_t w : {1u, 2u, 3u, 7u}) {
      std::vector<int> seen(n, 0);
      size_t lo = n, hi = 0;
      for (uint32_t r = 0; r < w; ++r) {
        const auto s = ShardIndices(n, r, w, 9);
        EXPECT_EQ(s, ShardIndices(n, r, w, 9));  // same on every worker
        lo = std::min(lo, s.size());
        hi = std::max(hi, s.size());
        for (uint32_t i : s) {
          ASSERT_LT(i, n);
          ++seen[i];
        }
      }
      for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << n << " " << w;
      EXPECT_LE(hi - lo, 1u) << n << " " << w;
    }
  }
}

TEST(Shards, SubsetIsTheHeadOfThePermutation) {
  const auto perm = SeededPermutation(1000, 5);
  std::set<uint32_t> got;
  for (uint32_t r = 0; r < 3; ++r) {
    for (uint32_t i : ShardIndices(1000, r, 3, 5, 200)) {
      EXPECT_TRUE(got.insert(i).second);
    }
  }
  EXPECT_EQ(got, std::set<uint32_t>(perm.begin(), perm.begin() + 200));
  EXPECT_EQ(ShardIndices(1000, 1, 3, 5, 0), ShardIndices(1000, 1, 3, 5));
  EXPECT_EQ(ShardIndices(1000, 1, 3, 5, 1000), ShardIndices(1000, 1, 3, 5));
  EXPECT_THROW(ShardIndices(1000, 0, 3, 5, 1001), std::invalid_argument);
  EXPECT_THROW(ShardIndices(10, 3, 3, 5), std::invalid_argument);
  EXPECT_THROW(ShardIndices(10, 0, 0, 5), std::invalid_argument);
}

}  // namespace
}  // namespace dblp::training
