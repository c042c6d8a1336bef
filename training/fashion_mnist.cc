#include "training/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace dblp::training {
namespace {

[[noreturn]] void Fail(const std::string& what, const std::string& why) {
  throw std::runtime_error(what + ": " + why);
}

uint32_t BigEndian32(std::span<const uint8_t> b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) |
         (uint32_t{b[at + 2]} << 8) | uint32_t{b[at + 3]};
}

// Magic number check shared by both decoders; a message that says what was
// expected is what lets someone tell a swapped images/labels file apart
// from a corrupt one.
void CheckMagic(std::span<const uint8_t> bytes, size_t header,
                uint32_t expected, const char* kind, const std::string& what) {
  if (bytes.size() < header) {
    Fail(what, "truncated IDX header (" + std::to_string(bytes.size()) +
                   " bytes, need " + std::to_string(header) + ")");
  }
  const uint32_t magic = BigEndian32(bytes, 0);
  if (magic != expected) {
    Fail(what, "bad IDX magic " + std::to_string(magic) + ", expected " +
                   std::to_string(expected) + " (" + kind + ")");
  }
}

void CheckCount(uint32_t count, const std::string& what) {
  if (count == 0 || count > kMaxIdxItems) {
    Fail(what, "item count " + std::to_string(count) + " outside 1.." +
                   std::to_string(kMaxIdxItems));
  }
}

void CheckSize(size_t got, uint64_t want, const std::string& what) {
  if (got < want) {
    Fail(what, "truncated: " + std::to_string(got) + " bytes, header says " +
                   std::to_string(want));
  }
  if (got > want) {
    Fail(what, std::to_string(got - want) +
                   " trailing bytes after the IDX payload");
  }
}

std::string FileName(Split split, const char* kind) {
  return std::string(split == Split::kTrain ? "train" : "t10k") + "-" + kind;
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::string ImagesPath(const std::string& dir, Split split) {
  return dir + "/" + FileName(split, "images-idx3-ubyte.gz");
}

std::string LabelsPath(const std::string& dir, Split split) {
  return dir + "/" + FileName(split, "labels-idx1-ubyte.gz");
}

std::vector<uint8_t> ReadGzipFile(const std::string& path, size_t max_bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      Fail(path, std::string("not found; install the Debian package ") +
                     kFashionMnistPackage + " (apt-get install " +
                     kFashionMnistPackage +
                     ") or point --data_dir at a directory holding the "
                     "Fashion-MNIST *-ubyte.gz files");
    }
    Fail(path, std::strerror(err));
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) Fail(path, std::string("cannot open: ") +
                                   std::strerror(errno));
  std::vector<uint8_t> out;
  constexpr size_t kStep = 1 << 20;
  for (;;) {
    const size_t at = out.size();
    out.resize(at + kStep);
    const int n = gzread(f, out.data() + at, kStep);
    if (n < 0) {
      int zerr = 0;
      std::string msg = gzerror(f, &zerr);
      // zlib prefixes its message with the path we already print.
      if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);
      gzclose_r(f);
      Fail(path, "corrupt gzip data (" + msg + ")");
    }
    out.resize(at + static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      gzclose_r(f);
      Fail(path, "more than " + std::to_string(max_bytes) +
                     " bytes once decompressed");
    }
    if (n == 0) break;
  }
  // zlib reports a stream cut short only here: gzread returns what it had.
  const int rc = gzclose_r(f);
  if (rc == Z_BUF_ERROR) Fail(path, "truncated gzip stream");
  if (rc != Z_OK) Fail(path, "gzip read error " + std::to_string(rc));
  return out;
}

IdxImages ParseIdxImages(std::span<const uint8_t> bytes,
                         const std::string& what) {
  constexpr size_t kHeader = 16;
  CheckMagic(bytes, kHeader, kIdxImagesMagic, "images, u8, 3 dimensions",
             what);
  IdxImages im;
  im.count = BigEndian32(bytes, 4);
  im.rows = BigEndian32(bytes, 8);
  im.cols = BigEndian32(bytes, 12);
  CheckCount(im.count, what);
  if (im.rows != kImageSide || im.cols != kImageSide) {
    Fail(what, "images are " + std::to_string(im.rows) + "x" +
                   std::to_string(im.cols) + ", expected 28x28");
  }
  const uint64_t payload = uint64_t{im.count} * kImagePixels;
  CheckSize(bytes.size(), kHeader + payload, what);
  im.pixels.assign(bytes.begin() + kHeader, bytes.end());
  return im;
}

std::vector<uint8_t> ParseIdxLabels(std::span<const uint8_t> bytes,
                                    const std::string& what) {
  constexpr size_t kHeader = 8;
  CheckMagic(bytes, kHeader, kIdxLabelsMagic, "labels, u8, 1 dimension",
             what);
  const uint32_t count = BigEndian32(bytes, 4);
  CheckCount(count, what);
  CheckSize(bytes.size(), kHeader + uint64_t{count}, what);
  std::vector<uint8_t> labels(bytes.begin() + kHeader, bytes.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kNumClasses) {
      Fail(what, "label " + std::to_string(labels[i]) + " at index " +
                     std::to_string(i) + " is not a class 0..9");
    }
  }
  return labels;
}

RawSplit LoadRawSplit(const std::string& dir, Split split) {
  const std::string ipath = ImagesPath(dir, split);
  const std::string lpath = LabelsPath(dir, split);
  RawSplit raw;
  raw.images = ParseIdxImages(
      ReadGzipFile(ipath, 16 + size_t{kMaxIdxItems} * kImagePixels), ipath);
  raw.labels =
      ParseIdxLabels(ReadGzipFile(lpath, 8 + size_t{kMaxIdxItems}), lpath);
  if (raw.labels.size() != raw.images.count) {
    Fail(dir, ipath + " holds " + std::to_string(raw.images.count) +
                  " images but " + lpath + " holds " +
                  std::to_string(raw.labels.size()) + " labels");
  }
  return raw;
}

Dataset Normalize(const RawSplit& raw, std::span<const uint32_t> indices) {
  const uint32_t n = raw.images.count;
  std::vector<uint32_t> all;
  if (indices.empty()) {
    all.resize(n);
    for (uint32_t i = 0; i < n; ++i) all[i] = i;
    indices = all;
  }
  Dataset d;
  d.count = static_cast<uint32_t>(indices.size());
  d.images.resize(size_t{d.count} * kImagePixels);
  d.labels.resize(d.count);
  for (size_t k = 0; k < indices.size(); ++k) {
    const uint32_t i = indices[k];
    if (i >= n) {
      throw std::out_of_range("image index " + std::to_string(i) +
                              " beyond the split's " + std::to_string(n));
    }
    const uint8_t* src = raw.images.pixels.data() + size_t{i} * kImagePixels;
    float* dst = d.images.data() + k * kImagePixels;
    for (uint32_t p = 0; p < kImagePixels; ++p) {
      dst[p] = (static_cast<float>(src[p]) / 255.0f - kPixelMean) / kPixelStd;
    }
    d.labels[k] = raw.labels[i];
  }
  return d;
}

Dataset LoadFashionMnist(const std::string& dir, Split split,
                         std::span<const uint32_t> indices) {
  return Normalize(LoadRawSplit(dir, split), indices);
}

std::vector<uint32_t> SeededPermutation(uint32_t n, uint64_t seed) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  uint64_t state = seed;
  for (uint32_t i = n; i > 1; --i) {
    // Modulo bias is below n / 2^64: irrelevant for a shuffle of images.
    const uint32_t j = static_cast<uint32_t>(SplitMix64(state) % i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

std::vector<uint32_t> ShardIndices(uint32_t n, uint32_t rank,
                                   uint32_t num_shards, uint64_t seed,
                                   uint32_t subset) {
  if (num_shards == 0 || rank >= num_shards) {
    throw std::invalid_argument("shard rank " + std::to_string(rank) +
                                " of " + std::to_string(num_shards) +
                                " workers");
  }
  if (subset > n) {
    throw std::invalid_argument("subset of " + std::to_string(subset) +
                                " out of " + std::to_string(n) + " items");
  }
  const uint64_t m = subset == 0 ? n : subset;
  const std::vector<uint32_t> p = SeededPermutation(n, seed);
  const uint64_t begin = m * rank / num_shards;
  const uint64_t end = m * (rank + 1) / num_shards;
  return {p.begin() + static_cast<std::ptrdiff_t>(begin),
          p.begin() + static_cast<std::ptrdiff_t>(end)};
}

}  // namespace dblp::training
