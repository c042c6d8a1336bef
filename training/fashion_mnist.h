// Fashion-MNIST from the gzipped IDX files of Debian's dataset-fashion-mnist
// (or the original distribution): reader, normalisation and the workers'
// training shards. No libtorch here, so the parsing and sharding rules are
// unit-tested without compiling torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dblp::training {

inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";
inline constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist";

inline constexpr uint32_t kIdxImagesMagic = 2051;  // u8 data, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 2049;  // u8 data, 1 dimension
inline constexpr uint32_t kImageSide = 28;
inline constexpr uint32_t kImagePixels = kImageSide * kImageSide;
inline constexpr uint32_t kNumClasses = 10;
// Bounds what a corrupt or hostile header can make us allocate: the real
// sets hold 60000 and 10000 images.
inline constexpr uint32_t kMaxIdxItems = 250000;
// Training-set statistics of the pixels scaled to [0, 1] (the values the
// PyTorch examples use), so inputs are roughly zero-mean, unit-variance.
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

enum class Split { kTrain, kTest };

// Images as float [count, 28, 28], row-major, normalised
// (x / 255 - kPixelMean) / kPixelStd; labels in 0..9.
struct Dataset {
  uint32_t count = 0;
  std::vector<float> images;
  std::vector<uint8_t> labels;
};

struct IdxImages {
  uint32_t count = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
};

// The files of a split inside `dir`.
std::string ImagesPath(const std::string& dir, Split split);
std::string LabelsPath(const std::string& dir, Split split);

// Whole gzip file, decompressed; throws std::runtime_error naming `path`
// when it is missing (and the Debian package that provides it), unreadable,
// truncated, corrupt or larger than `max_bytes` once decompressed.
std::vector<uint8_t> ReadGzipFile(const std::string& path, size_t max_bytes);

// IDX decoders over decompressed bytes. They check the magic number, the
// dimensions (28x28 images), the item count bound and that the size is
// exactly header + payload; `what` names the source in the error.
IdxImages ParseIdxImages(std::span<const uint8_t> bytes,
                         const std::string& what);
std::vector<uint8_t> ParseIdxLabels(std::span<const uint8_t> bytes,
                                    const std::string& what);

// A split as stored: validated bytes, images and labels counts equal.
struct RawSplit {
  IdxImages images;
  std::vector<uint8_t> labels;
};

// Reads and validates both files of a split. Throws std::runtime_error
// (missing or malformed files, image and label counts that differ).
RawSplit LoadRawSplit(const std::string& dir, Split split);

// The images at `indices` (in that order; empty = all), normalised.
// Throws std::out_of_range for an index beyond the split.
Dataset Normalize(const RawSplit& raw, std::span<const uint32_t> indices);

// Loads a split from `dir`, keeping only the images at `indices` (in that
// order; empty = all) so a worker converts only its shard to float.
// LoadRawSplit then Normalize.
Dataset LoadFashionMnist(const std::string& dir, Split split,
                         std::span<const uint32_t> indices = {});

// A permutation of [0, n) from `seed` (Fisher-Yates over splitmix64), the
// same on every platform and standard library, so that workers built or run
// elsewhere still agree on the shards.
std::vector<uint32_t> SeededPermutation(uint32_t n, uint64_t seed);

// Worker `rank` of `num_shards`: the first `subset` entries (0 = all n) of
// SeededPermutation(n, seed) cut into `num_shards` contiguous parts whose
// sizes differ by at most one, part `rank`. The shards of one job are
// disjoint and together cover the subset (all of [0, n) by default).
std::vector<uint32_t> ShardIndices(uint32_t n, uint32_t rank,
                                   uint32_t num_shards, uint64_t seed,
                                   uint32_t subset = 0);

}  // namespace dblp::training
