#include "dblp/control/control.h"

#include <array>
#include <bit>
#include <cmath>
#include <concepts>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dblp/security/frame_auth.h"

namespace dblp {
namespace {

// The wire type byte is the variant index + 1; keep the two in lock step.
static_assert(
    std::is_same_v<std::variant_alternative_t<0, ControlMessage>, JoinMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<1, ControlMessage>, WelcomeMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<2, ControlMessage>,
                             RoundBeginMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<3, ControlMessage>, ProbeMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<4, ControlMessage>, BitmapMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<5, ControlMessage>, StopMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<6, ControlMessage>, ByeMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<7, ControlMessage>, ErrorMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<8, ControlMessage>, AcceptedMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<9, ControlMessage>,
                             ChallengeMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<10, ControlMessage>, ProofMsg>);
static_assert(
    std::is_same_v<std::variant_alternative_t<11, ControlMessage>, TagMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<12, ControlMessage>,
                             ShardHelloMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<13, ControlMessage>,
                             ShardAssignMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<14, ControlMessage>,
                             PhasePartialMsg>);
static_assert(std::is_same_v<std::variant_alternative_t<15, ControlMessage>,
                             PhaseDecisionMsg>);
static_assert(std::variant_size_v<ControlMessage> == 16);

// Smallest encodings, used to bound a declared count by the bytes left
// before anything is reserved.
constexpr size_t kMinLayerBytes = 2 + 4;  // empty name + zero dims
constexpr size_t kDimBytes = 8;
constexpr size_t kWordBytes = 8;
constexpr size_t kShardEntryBytes = 4 + 2 + 4 + 6 + 2 + 2 + 4 + 4;

uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Words needed for num_bits, computed in 64 bits: (bits + 63) / 64 in 32-bit
// arithmetic wraps for num_bits near 2^32.
uint64_t WordsFor(uint32_t num_bits) { return (uint64_t{num_bits} + 63) / 64; }

// ---------------------------------------------------------------------------
// One field list per message (Fields, below), walked by three visitors: the
// Writer encodes it, the Reader decodes it (structural checks: lengths and
// counts, before any allocation), the Checker validates its values (for
// the encoder before writing, for the decoder after reading). Every
// visitor call names the field for the error text.

template <class M, class T>
concept Like = std::same_as<std::remove_const_t<M>, T>;

template <class V>
bool Fields(V& v, Like<JoinMsg> auto& m) {
  return v.U16(m.protocol_version, "protocol_version") &&
         v.U32(m.session, "session") &&
         v.Str(m.worker_name, kMaxControlString, "worker_name") &&
         v.U64(m.total_bytes, "total_bytes") && v.U32(m.mtu, "mtu") &&
         v.Layers(m.layers) && v.Bytes(m.nonce, "nonce") &&
         v.Bytes(m.data_mac, "data_mac") && v.U32(m.data_ipv4, "data_ipv4") &&
         v.U16(m.data_udp_port, "data_udp_port") &&
         v.U16(m.shard_index, "shard_index") &&
         v.U16(m.shard_count, "shard_count") &&
         v.U32(m.first_chunk, "first_chunk") &&
         v.U32(m.shard_chunks, "shard_chunks") &&
         v.U16(m.rank_plus_one, "rank_plus_one") &&
         v.Bytes(m.directory_nonce, "directory_nonce") && v.Whole(m);
}
template <class V>
bool Fields(V& v, Like<ChallengeMsg> auto& m) {
  return v.Bytes(m.nonce, "nonce") && v.Bytes(m.proof, "proof");
}
template <class V>
bool Fields(V& v, Like<ProofMsg> auto& m) {
  return v.Bytes(m.proof, "proof");
}
template <class V>
bool Fields(V& v, Like<TagMsg> auto& m) {
  return v.U64(m.seq, "seq") && v.Bytes(m.mac, "mac");
}
template <class V>
bool Fields(V& v, Like<WelcomeMsg> auto& m) {
  return v.U32(m.session, "session") && v.U16(m.rank, "rank") &&
         v.U16(m.num_workers, "num_workers") && v.U32(m.mtu, "mtu") &&
         v.U32(m.chunk_payload, "chunk_payload") &&
         v.U32(m.num_chunks, "num_chunks") &&
         v.U64(m.total_bytes, "total_bytes") &&
         v.U16(m.udp_base_port, "udp_base_port") && v.U16(m.lanes, "lanes") &&
         v.U32(m.resync_every, "resync_every") &&
         v.Flag(m.push_feedback, "push_feedback") &&
         v.Flag(m.consistent_broadcast, "consistent_broadcast") &&
         v.U32(m.server_ipv4, "server_ipv4") &&
         v.Bytes(m.server_mac, "server_mac") &&
         v.Str(m.policy, kMaxControlString, "policy") && v.Layers(m.layers) &&
         v.U32(m.worker_ipv4, "worker_ipv4") &&
         v.Enum(m.frame_auth, kMaxFrameAuthMode, "frame_auth") &&
         v.Bytes(m.job_nonce, "job_nonce") && v.Bytes(m.mac, "mac") &&
         v.U16(m.shard_index, "shard_index") &&
         v.U16(m.shard_count, "shard_count") &&
         v.U32(m.first_chunk, "first_chunk") &&
         v.U64(m.model_bytes, "model_bytes") && v.Shards(m.shards) &&
         v.Whole(m);
}
template <class V>
bool Fields(V& v, Like<RoundBeginMsg> auto& m) {
  // p must stay below 1 (a round needs a chunk); a deadline's floor may
  // ask for every chunk (LTP's --ltp_min_fraction is in (0, 1]).
  return v.U32(m.round, "round") && v.U32(m.iteration, "iteration") &&
         v.Dir(m.direction) && v.Fraction(m.p, "p", false) &&
         v.U64(m.deadline_ns, "deadline_ns") &&
         v.Fraction(m.min_fraction, "min_fraction", true) &&
         v.Flag(m.critical, "critical");
}
template <class V>
bool Fields(V& v, Like<ProbeMsg> auto& m) {
  return v.U32(m.round, "round") && v.Dir(m.direction) &&
         v.U32(m.pass, "pass") && v.U16(m.lane, "shard");
}
template <class V>
bool Fields(V& v, Like<BitmapMsg> auto& m) {
  return v.U32(m.round, "round") && v.Dir(m.direction) &&
         v.Words(m.num_bits, m.words) && v.U16(m.lane, "shard");
}
template <class V>
bool Fields(V& v, Like<AcceptedMsg> auto& m) {
  return v.U32(m.round, "round") && v.Words(m.num_bits, m.words);
}
template <class V>
bool Fields(V& v, Like<StopMsg> auto& m) {
  return v.U32(m.round, "round") && v.Dir(m.direction) &&
         v.U32(m.received, "received") && v.Reason(m.reason);
}
template <class V>
bool Fields(V& v, Like<ShardHelloMsg> auto& m) {
  return v.U16(m.shard_index, "shard_index") &&
         v.U16(m.shard_count, "shard_count") &&
         v.U32(m.control_ipv4, "control_ipv4") &&
         v.U16(m.control_port, "control_port") &&
         v.U32(m.data_ipv4, "data_ipv4") && v.Bytes(m.data_mac, "data_mac") &&
         v.U16(m.udp_base_port, "udp_base_port") && v.U16(m.queues, "queues") &&
         v.U32(m.mtu, "mtu") &&
         v.Str(m.job_flags, kMaxControlString, "job_flags") && v.Whole(m);
}
template <class V>
bool Fields(V& v, Like<ShardAssignMsg> auto& m) {
  return v.U16(m.shard_index, "shard_index") &&
         v.U16(m.shard_count, "shard_count") &&
         v.U32(m.first_chunk, "first_chunk") &&
         v.U32(m.num_chunks, "num_chunks") &&
         v.U32(m.chunk_payload, "chunk_payload") &&
         v.U64(m.model_bytes, "model_bytes") &&
         v.Bytes(m.directory_nonce, "directory_nonce") && v.Whole(m);
}
template <class V>
bool Fields(V& v, Like<PhasePartialMsg> auto& m) {
  return v.U64(m.iteration, "iteration") && v.Flag(m.resync, "resync") &&
         v.U64(m.push_ns, "push_ns") && v.Doubles(m.squares, "squares");
}
template <class V>
bool Fields(V& v, Like<PhaseDecisionMsg> auto& m) {
  return v.U64(m.iteration, "iteration") && v.F64(m.norm, "norm") &&
         v.Fraction(m.p, "p", false) && v.U64(m.deadline_ns, "deadline_ns") &&
         v.Fraction(m.min_fraction, "min_fraction", true) &&
         v.Flag(m.critical, "critical");
}
template <class V>
bool Fields(V& v, Like<ByeMsg> auto& m) {
  return v.Str(m.reason, kMaxControlString, "reason");
}
template <class V>
bool Fields(V& v, Like<ErrorMsg> auto& m) {
  return v.U16(m.code, "code") && v.Str(m.text, kMaxControlString, "text");
}

// A field's error: "<MSG>.<field>: <why>".
class FieldErrors {
 public:
  explicit FieldErrors(const char* msg) : msg_(msg) {}
  bool Fail(ControlError e, std::string_view field, const std::string& why) {
    err_ = e;
    text_ = std::string(msg_) + "." + std::string(field) + ": " + why;
    return false;
  }
  ControlError err() const { return err_; }
  std::string& text() { return text_; }

 private:
  const char* msg_;
  ControlError err_ = ControlError::kNone;
  std::string text_;
};

// ---------------------------------------------------------------------------
// Validation of the values (shared by encoder and decoder).

class Checker : public FieldErrors {
 public:
  using FieldErrors::FieldErrors;

  template <class T>
  bool U16(const T&, std::string_view) {
    return true;
  }
  template <class T>
  bool U32(const T&, std::string_view) {
    return true;
  }
  template <class T>
  bool U64(const T&, std::string_view) {
    return true;
  }
  bool Flag(bool, std::string_view) { return true; }
  // A NaN is refused: it means nothing a peer could act on (a non-finite
  // norm travels as +inf), and it is the one value that would not equal
  // itself after a decode.
  bool F64(double v, std::string_view field) {
    if (std::isnan(v)) return Fail(ControlError::kBadValue, field, "NaN");
    return true;
  }
  template <size_t N>
  bool Bytes(const std::array<uint8_t, N>&, std::string_view) {
    return true;
  }
  bool Doubles(const std::vector<double>& v, std::string_view field) {
    if (v.size() > kMaxPhaseBlocks) {
      return Fail(ControlError::kTooManyItems, field,
                  std::to_string(v.size()) + " > limit " +
                      std::to_string(kMaxPhaseBlocks));
    }
    for (double x : v) {
      if (!F64(x, field)) return false;
    }
    return true;
  }

  bool Str(const std::string& s, size_t limit, std::string_view field) {
    if (s.size() > limit) {
      return Fail(
          ControlError::kStringTooLong, field,
          std::to_string(s.size()) + " bytes > limit " + std::to_string(limit));
    }
    return true;
  }

  bool Layers(const std::vector<LayerInfo>& layers) {
    if (layers.size() > kMaxLayers) {
      return Fail(ControlError::kTooManyItems, "layers",
                  std::to_string(layers.size()) + " > limit " +
                      std::to_string(kMaxLayers));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string field = "layers[" + std::to_string(i) + "]";
      const LayerInfo& l = layers[i];
      if (!Str(l.name, kMaxLayerName, field + ".name")) return false;
      if (l.shape.size() > kMaxShapeDims) {
        return Fail(ControlError::kTooManyItems, field + ".shape",
                    std::to_string(l.shape.size()) + " dims > limit " +
                        std::to_string(kMaxShapeDims));
      }
      for (size_t d = 0; d < l.shape.size(); ++d) {
        if (l.shape[d] < 0) {
          return Fail(ControlError::kBadValue,
                      field + ".shape[" + std::to_string(d) + "]",
                      "negative dim " + std::to_string(l.shape[d]));
        }
      }
    }
    return true;
  }

  bool Dir(Direction d) {
    const auto v = static_cast<uint8_t>(d);
    if (v > static_cast<uint8_t>(Direction::kBroadcast)) {
      return Fail(ControlError::kBadValue, "direction",
                  "unknown value " + std::to_string(v));
    }
    return true;
  }

  bool Reason(StopReason r) {
    const auto v = static_cast<uint8_t>(r);
    if (v > static_cast<uint8_t>(StopReason::kComplete)) {
      return Fail(ControlError::kBadValue, "reason",
                  "unknown value " + std::to_string(v));
    }
    return true;
  }

  bool Enum(uint8_t v, uint8_t max, std::string_view field) {
    if (v > max) {
      return Fail(ControlError::kBadValue, field,
                  "unknown mode " + std::to_string(v));
    }
    return true;
  }

  bool Fraction(double x, std::string_view field, bool one_allowed) {
    // Written so that NaN fails too.
    if (!(std::isfinite(x) && x >= 0.0 &&
          (x < 1.0 || (one_allowed && x == 1.0)))) {
      return Fail(ControlError::kBadValue, field,
                  std::to_string(x) +
                      (one_allowed ? " not in [0, 1]" : " not in [0, 1)"));
    }
    return true;
  }

  bool Shards(const std::vector<ShardEntry>& shards) {
    if (shards.size() > kMaxServerShards) {
      return Fail(ControlError::kTooManyItems, "shards",
                  std::to_string(shards.size()) + " > limit " +
                      std::to_string(kMaxServerShards));
    }
    // The map covers the gradient from chunk 0 in index order, no gaps.
    uint64_t next = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string field = "shards[" + std::to_string(i) + "]";
      if (shards[i].queues == 0) {
        return Fail(ControlError::kBadValue, field + ".queues", "0 queues");
      }
      if (shards[i].first_chunk != next) {
        return Fail(ControlError::kBadValue, field + ".first_chunk",
                    std::to_string(shards[i].first_chunk) +
                        " but the shards before it end at " +
                        std::to_string(next));
      }
      next += shards[i].num_chunks;
    }
    if (next > std::numeric_limits<uint32_t>::max()) {
      return Fail(ControlError::kBadValue, "shards",
                  std::to_string(next) + " chunks in all, more than 2^32 - 1");
    }
    return true;
  }

  // The rules between fields.
  bool Whole(const JoinMsg& m) {
    if (!Place(m.shard_index, m.shard_count)) return false;
    if (uint64_t{m.first_chunk} + m.shard_chunks >
        std::numeric_limits<uint32_t>::max()) {
      return Fail(ControlError::kBadValue, "shard_chunks",
                  "first_chunk + shard_chunks past 2^32 - 1");
    }
    return true;
  }
  // Every default-constructed message is valid (the fuzzers' seeds); what
  // a registry or a shard needs beyond these rules it checks itself.
  bool Whole(const ShardHelloMsg& m) {
    if (!Place(m.shard_index, m.shard_count)) return false;
    if (m.queues == 0) {
      return Fail(ControlError::kBadValue, "queues", "0 queues");
    }
    return true;
  }
  bool Whole(const ShardAssignMsg& m) {
    if (!Place(m.shard_index, m.shard_count)) return false;
    if (m.chunk_payload % 4 != 0) {
      return Fail(
          ControlError::kBadValue, "chunk_payload",
          std::to_string(m.chunk_payload) + " bytes would split a float");
    }
    if (m.num_chunks > 0 &&
        (uint64_t{m.first_chunk} + m.num_chunks - 1) * m.chunk_payload >=
            m.model_bytes) {
      return Fail(ControlError::kBadValue, "model_bytes",
                  std::to_string(m.model_bytes) +
                      " bytes end before the partition's last chunk");
    }
    return true;
  }
  bool Whole(const WelcomeMsg& m) {
    if (!Place(m.shard_index, m.shard_count)) return false;
    if (m.model_bytes != 0 && m.model_bytes < m.total_bytes) {
      return Fail(ControlError::kBadValue, "model_bytes",
                  std::to_string(m.model_bytes) + " < total_bytes " +
                      std::to_string(m.total_bytes));
    }
    if (m.shards.empty()) return true;
    if (m.shards.size() != m.shard_count) {
      return Fail(ControlError::kBadValue, "shards",
                  std::to_string(m.shards.size()) +
                      " entries but shard_count " +
                      std::to_string(m.shard_count));
    }
    const ShardEntry& own = m.shards[m.shard_index];
    if (own.first_chunk != m.first_chunk || own.num_chunks != m.num_chunks) {
      return Fail(ControlError::kBadValue, "shards",
                  "entry " + std::to_string(m.shard_index) +
                      " is not this WELCOME's partition");
    }
    return true;
  }

  bool Words(uint32_t num_bits, const std::vector<uint64_t>& words) {
    const uint64_t want = WordsFor(num_bits);
    if (words.size() != want) {
      return Fail(ControlError::kBadBitmap, "words",
                  std::to_string(words.size()) + " words but num_bits " +
                      std::to_string(num_bits) + " needs " +
                      std::to_string(want));
    }
    const uint32_t tail = num_bits % 64;
    if (tail != 0 && (words.back() >> tail) != 0) {
      return Fail(ControlError::kBadBitmap, "words",
                  "bits set beyond num_bits " + std::to_string(num_bits));
    }
    return true;
  }

 private:
  bool Place(uint16_t index, uint16_t count) {
    if (count == 0 || count > kMaxServerShards) {
      return Fail(ControlError::kBadValue, "shard_count",
                  std::to_string(count) + " not in 1.." +
                      std::to_string(kMaxServerShards));
    }
    if (index >= count) {
      return Fail(
          ControlError::kBadValue, "shard_index",
          std::to_string(index) + " >= shard_count " + std::to_string(count));
    }
    return true;
  }
};

// ---------------------------------------------------------------------------
// Encoding. Runs only on validated messages, so every length fits its prefix.

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}

  bool U8(uint8_t v) {
    out_.push_back(v);
    return true;
  }
  bool U16(uint16_t v, std::string_view = {}) {
    U8(static_cast<uint8_t>(v >> 8));
    return U8(static_cast<uint8_t>(v));
  }
  bool U32(uint32_t v, std::string_view = {}) {
    U16(static_cast<uint16_t>(v >> 16));
    return U16(static_cast<uint16_t>(v));
  }
  bool U64(uint64_t v, std::string_view = {}) {
    U32(static_cast<uint32_t>(v >> 32));
    return U32(static_cast<uint32_t>(v));
  }
  bool Flag(bool v, std::string_view) { return U8(v ? 1 : 0); }
  bool F64(double v, std::string_view) {
    return U64(std::bit_cast<uint64_t>(v));
  }
  bool Doubles(const std::vector<double>& v, std::string_view) {
    U32(static_cast<uint32_t>(v.size()));
    for (double x : v) F64(x, {});
    return true;
  }
  bool Dir(Direction d) { return U8(static_cast<uint8_t>(d)); }
  bool Reason(StopReason r) { return U8(static_cast<uint8_t>(r)); }
  bool Enum(uint8_t v, uint8_t, std::string_view) { return U8(v); }
  bool Fraction(double v, std::string_view, bool) {
    return U64(std::bit_cast<uint64_t>(v));
  }
  bool Str(const std::string& s, size_t, std::string_view = {}) {
    U16(static_cast<uint16_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
    return true;
  }
  template <size_t N>
  bool Bytes(const std::array<uint8_t, N>& a, std::string_view) {
    out_.insert(out_.end(), a.begin(), a.end());
    return true;
  }
  bool Layers(const std::vector<LayerInfo>& layers) {
    U32(static_cast<uint32_t>(layers.size()));
    for (const LayerInfo& l : layers) {
      Str(l.name, kMaxLayerName);
      U32(static_cast<uint32_t>(l.shape.size()));
      for (int64_t d : l.shape) U64(static_cast<uint64_t>(d));
    }
    return true;
  }
  bool Words(uint32_t num_bits, const std::vector<uint64_t>& words) {
    U32(num_bits);
    U32(static_cast<uint32_t>(words.size()));
    for (uint64_t w : words) U64(w);
    return true;
  }
  bool Shards(const std::vector<ShardEntry>& shards) {
    U32(static_cast<uint32_t>(shards.size()));
    for (const ShardEntry& e : shards) {
      U32(e.control_ipv4);
      U16(e.control_port);
      U32(e.data_ipv4);
      Bytes(e.data_mac, {});
      U16(e.udp_base_port);
      U16(e.queues);
      U32(e.first_chunk);
      U32(e.num_chunks);
    }
    return true;
  }
  template <class M>
  bool Whole(const M&) {
    return true;
  }

 private:
  std::vector<uint8_t>& out_;
};

// ---------------------------------------------------------------------------
// Decoding of one complete frame body. Structural checks (lengths, counts)
// happen here, before any allocation; value rules are left to Checker.

class Reader : public FieldErrors {
 public:
  Reader(const uint8_t* p, size_t n, const char* msg)
      : FieldErrors(msg), p_(p), n_(n) {}

  size_t remaining() const { return n_ - pos_; }

  // Fails unless `n` more bytes are in the body.
  bool Need(uint64_t n, std::string_view field) {
    if (n > remaining()) {
      return Fail(ControlError::kTruncatedBody, field,
                  "needs " + std::to_string(n) + " bytes, " +
                      std::to_string(remaining()) + " left in frame");
    }
    return true;
  }

  bool U8(uint8_t& v, std::string_view f) {
    if (!Need(1, f)) return false;
    v = p_[pos_++];
    return true;
  }
  bool Flag(bool& v, std::string_view f) {
    uint8_t b;
    if (!U8(b, f)) return false;
    if (b > 1) {
      return Fail(ControlError::kBadValue, f,
                  "a flag must be 0 or 1, got " + std::to_string(b));
    }
    v = b == 1;
    return true;
  }
  bool U16(uint16_t& v, std::string_view f) { return Uint(2, v, f); }
  bool U32(uint32_t& v, std::string_view f) { return Uint(4, v, f); }
  bool U64(uint64_t& v, std::string_view f) { return Uint(8, v, f); }
  bool Fraction(double& v, std::string_view f, bool) { return F64(v, f); }
  bool F64(double& v, std::string_view f) {
    uint64_t x;
    if (!Uint(8, x, f)) return false;
    v = std::bit_cast<double>(x);
    return true;
  }
  bool Doubles(std::vector<double>& v, std::string_view f) {
    uint32_t n;
    if (!Count(n, kMaxPhaseBlocks, 8, std::string(f))) return false;
    v.resize(n);
    for (double& x : v) F64(x, f);  // Count() checked the bytes
    return true;
  }
  // Enums are taken raw; Checker rejects values outside the enum.
  bool Enum(uint8_t& v, uint8_t, std::string_view f) { return U8(v, f); }
  bool Dir(Direction& d) {
    uint8_t x;
    if (!U8(x, "direction")) return false;
    d = static_cast<Direction>(x);
    return true;
  }
  bool Reason(StopReason& r) {
    uint8_t x;
    if (!U8(x, "reason")) return false;
    r = static_cast<StopReason>(x);
    return true;
  }
  bool Str(std::string& s, size_t limit, std::string_view f) {
    uint16_t len;
    if (!U16(len, std::string(f) + ".length")) return false;
    if (len > limit) {
      return Fail(
          ControlError::kStringTooLong, f,
          std::to_string(len) + " bytes > limit " + std::to_string(limit));
    }
    if (!Need(len, f)) return false;
    s.assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }
  template <size_t N>
  bool Bytes(std::array<uint8_t, N>& a, std::string_view f) {
    if (!Need(N, f)) return false;
    for (size_t i = 0; i < N; ++i) a[i] = p_[pos_++];
    return true;
  }
  // A u32 count, bounded by `limit` and by what `min_item_bytes` per item
  // leaves room for, so a lying count cannot trigger a huge reserve.
  bool Count(uint32_t& n, uint64_t limit, uint64_t min_item_bytes,
             const std::string& f) {
    if (!U32(n, f + ".count")) return false;
    if (n > limit) {
      return Fail(
          ControlError::kTooManyItems, f,
          std::to_string(n) + " items > limit " + std::to_string(limit));
    }
    return Need(uint64_t{n} * min_item_bytes, f);
  }
  bool Layers(std::vector<LayerInfo>& layers) {
    uint32_t n;
    if (!Count(n, kMaxLayers, kMinLayerBytes, "layers")) return false;
    layers.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      const std::string field = "layers[" + std::to_string(i) + "]";
      LayerInfo& l = layers[i];
      if (!Str(l.name, kMaxLayerName, field + ".name")) return false;
      uint32_t dims;
      if (!Count(dims, kMaxShapeDims, kDimBytes, field + ".shape")) {
        return false;
      }
      l.shape.resize(dims);
      for (uint32_t d = 0; d < dims; ++d) {
        uint64_t x;
        if (!Uint(8, x, field + ".shape")) return false;
        l.shape[d] = static_cast<int64_t>(x);
      }
    }
    return true;
  }
  bool Words(uint32_t& num_bits, std::vector<uint64_t>& words) {
    uint32_t n;
    if (!(U32(num_bits, "num_bits") &&
          Count(n, std::numeric_limits<uint32_t>::max(), kWordBytes,
                "words"))) {
      return false;
    }
    // Checked before the resize so the count cannot exceed what num_bits
    // implies; the tail bits are Checker's job.
    if (n != WordsFor(num_bits)) {
      return Fail(ControlError::kBadBitmap, "words",
                  std::to_string(n) + " words but num_bits " +
                      std::to_string(num_bits) + " needs " +
                      std::to_string(WordsFor(num_bits)));
    }
    words.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (!U64(words[i], "words")) return false;
    }
    return true;
  }
  bool Shards(std::vector<ShardEntry>& shards) {
    uint32_t n;
    if (!Count(n, kMaxServerShards, kShardEntryBytes, "shards")) return false;
    shards.resize(n);
    for (ShardEntry& e : shards) {
      // Count() checked that every entry's bytes are in the frame.
      U32(e.control_ipv4, "shards");
      U16(e.control_port, "shards");
      U32(e.data_ipv4, "shards");
      Bytes(e.data_mac, "shards");
      U16(e.udp_base_port, "shards");
      U16(e.queues, "shards");
      U32(e.first_chunk, "shards");
      U32(e.num_chunks, "shards");
    }
    return true;
  }
  // Cross-field rules are Checker's.
  template <class M>
  bool Whole(M&) {
    return true;
  }

 private:
  template <class T>
  bool Uint(size_t bytes, T& v, std::string_view f) {
    if (!Need(bytes, f)) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < bytes; ++i) x = (x << 8) | p_[pos_++];
    v = static_cast<T>(x);
    return true;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

bool IsKnownType(uint8_t t) {
  return t >= static_cast<uint8_t>(ControlType::kJoin) &&
         t <= static_cast<uint8_t>(ControlType::kPhaseDecision);
}

// Parses a body of alternative T; on failure fills err/text.
template <typename T>
bool ParseAs(const uint8_t* body, size_t len, const char* name,
             ControlMessage& out, ControlError& err, std::string& text) {
  T m;
  Reader r(body, len, name);
  if (!Fields(r, m)) {
    err = r.err();
    text = std::move(r.text());
    return false;
  }
  if (r.remaining() != 0) {
    err = ControlError::kTrailingBytes;
    text = std::string(name) + ": " + std::to_string(r.remaining()) +
           " bytes after the last field";
    return false;
  }
  Checker c(name);
  if (!Fields(c, m)) {
    err = c.err();
    text = std::move(c.text());
    return false;
  }
  out = std::move(m);
  return true;
}

}  // namespace

const char* ControlErrorName(ControlError e) {
  switch (e) {
    case ControlError::kNone:
      return "none";
    case ControlError::kFrameTooLarge:
      return "frame_too_large";
    case ControlError::kEmptyFrame:
      return "empty_frame";
    case ControlError::kUnknownType:
      return "unknown_type";
    case ControlError::kTruncatedBody:
      return "truncated_body";
    case ControlError::kTrailingBytes:
      return "trailing_bytes";
    case ControlError::kStringTooLong:
      return "string_too_long";
    case ControlError::kTooManyItems:
      return "too_many_items";
    case ControlError::kBadBitmap:
      return "bad_bitmap";
    case ControlError::kBadValue:
      return "bad_value";
  }
  return "unknown";
}

const char* ControlTypeName(ControlType t) {
  switch (t) {
    case ControlType::kJoin:
      return "JOIN";
    case ControlType::kWelcome:
      return "WELCOME";
    case ControlType::kRoundBegin:
      return "ROUND_BEGIN";
    case ControlType::kProbe:
      return "PROBE";
    case ControlType::kBitmap:
      return "BITMAP";
    case ControlType::kStop:
      return "STOP";
    case ControlType::kBye:
      return "BYE";
    case ControlType::kError:
      return "ERROR";
    case ControlType::kAccepted:
      return "ACCEPTED";
    case ControlType::kChallenge:
      return "CHALLENGE";
    case ControlType::kProof:
      return "PROOF";
    case ControlType::kTag:
      return "TAG";
    case ControlType::kShardHello:
      return "SHARD_HELLO";
    case ControlType::kShardAssign:
      return "SHARD_ASSIGN";
    case ControlType::kPhasePartial:
      return "PHASE_PARTIAL";
    case ControlType::kPhaseDecision:
      return "PHASE_DECISION";
  }
  return "UNKNOWN";
}

ControlType TypeOf(const ControlMessage& m) {
  return static_cast<ControlType>(m.index() + 1);
}

bool IsServerMessage(const ControlMessage& m) {
  return std::holds_alternative<WelcomeMsg>(m) ||
         std::holds_alternative<ChallengeMsg>(m) ||
         std::holds_alternative<RoundBeginMsg>(m) ||
         std::holds_alternative<AcceptedMsg>(m) ||
         std::holds_alternative<ShardAssignMsg>(m) ||
         std::holds_alternative<PhaseDecisionMsg>(m);
}

bool IsShardMessage(const ControlMessage& m) {
  return std::holds_alternative<ShardHelloMsg>(m) ||
         std::holds_alternative<PhasePartialMsg>(m);
}

bool IsWorkerOnlyMessage(const ControlMessage& m) {
  return std::holds_alternative<JoinMsg>(m) ||
         std::holds_alternative<ProofMsg>(m);
}

const char* ControlTypeName(const ControlMessage& m) {
  return ControlTypeName(TypeOf(m));
}

ControlError ValidateControl(const ControlMessage& m, std::string* text) {
  Checker c(ControlTypeName(m));
  if (std::visit([&c](const auto& msg) { return Fields(c, msg); }, m)) {
    return ControlError::kNone;
  }
  if (text != nullptr) *text = std::move(c.text());
  return c.err();
}

void EncodeControl(const ControlMessage& m, std::vector<uint8_t>& out) {
  std::string why;
  const ControlError e = ValidateControl(m, &why);
  if (e != ControlError::kNone) {
    throw std::invalid_argument(std::string("EncodeControl: ") +
                                ControlErrorName(e) + ": " + why);
  }
  const size_t start = out.size();
  out.resize(start + kControlFrameHeader);
  out.push_back(static_cast<uint8_t>(TypeOf(m)));
  Writer w(out);
  std::visit([&w](const auto& msg) { Fields(w, msg); }, m);
  const size_t len = out.size() - start - kControlFrameHeader;
  if (len > std::numeric_limits<uint32_t>::max()) {
    out.resize(start);
    throw std::invalid_argument("EncodeControl: frame exceeds 4 GiB");
  }
  for (size_t i = 0; i < kControlFrameHeader; ++i) {
    out[start + i] = static_cast<uint8_t>(len >> (8 * (3 - i)));
  }
}

std::vector<uint8_t> EncodeControl(const ControlMessage& m) {
  std::vector<uint8_t> out;
  EncodeControl(m, out);
  return out;
}

ControlDecoder::ControlDecoder(uint32_t max_frame) : max_frame_(max_frame) {}

void ControlDecoder::Feed(const uint8_t* data, size_t len) {
  if (error_ != ControlError::kNone || len == 0) return;
  // Compact only once the consumed prefix is at least as large as what is
  // still live: each byte is then moved O(1) times on average.
  if (read_ > 0 && read_ >= buf_.size() - read_) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(read_));
    read_ = 0;
  }
  buf_.insert(buf_.end(), data, data + len);
}

ControlDecoder::Status ControlDecoder::Fail(ControlError e, std::string text) {
  error_ = e;
  error_text_ = std::move(text);
  return Status::kError;
}

ControlDecoder::Status ControlDecoder::Next(ControlMessage& out) {
  if (error_ != ControlError::kNone) return Status::kError;
  const size_t avail = buffered();
  if (avail < kControlFrameHeader) return Status::kNeedMore;
  const uint8_t* frame = buf_.data() + read_;
  const uint32_t len = LoadBe32(frame);
  // Header checks run before the body arrives, so a bogus length is caught
  // without buffering (or waiting for) up to 4 GiB.
  if (len > max_frame_) {
    return Fail(ControlError::kFrameTooLarge,
                "frame length " + std::to_string(len) + " > max_frame " +
                    std::to_string(max_frame_));
  }
  if (len == 0) {
    return Fail(ControlError::kEmptyFrame, "frame length 0 (no type byte)");
  }
  if (avail > kControlFrameHeader) {
    const uint8_t type = frame[kControlFrameHeader];
    if (!IsKnownType(type)) {
      return Fail(ControlError::kUnknownType,
                  "unknown message type " + std::to_string(type));
    }
  }
  if (avail - kControlFrameHeader < len) return Status::kNeedMore;

  const uint8_t* body = frame + kControlFrameHeader + 1;
  const size_t body_len = len - 1;
  const auto type = static_cast<ControlType>(frame[kControlFrameHeader]);
  const char* name = ControlTypeName(type);
  ControlError err = ControlError::kNone;
  std::string text;
  bool ok = false;
  switch (type) {
    case ControlType::kJoin:
      ok = ParseAs<JoinMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kWelcome:
      ok = ParseAs<WelcomeMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kRoundBegin:
      ok = ParseAs<RoundBeginMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kProbe:
      ok = ParseAs<ProbeMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kBitmap:
      ok = ParseAs<BitmapMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kStop:
      ok = ParseAs<StopMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kBye:
      ok = ParseAs<ByeMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kError:
      ok = ParseAs<ErrorMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kAccepted:
      ok = ParseAs<AcceptedMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kChallenge:
      ok = ParseAs<ChallengeMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kProof:
      ok = ParseAs<ProofMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kTag:
      ok = ParseAs<TagMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kShardHello:
      ok = ParseAs<ShardHelloMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kShardAssign:
      ok = ParseAs<ShardAssignMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kPhasePartial:
      ok = ParseAs<PhasePartialMsg>(body, body_len, name, out, err, text);
      break;
    case ControlType::kPhaseDecision:
      ok = ParseAs<PhaseDecisionMsg>(body, body_len, name, out, err, text);
      break;
  }
  if (!ok) return Fail(err, std::move(text));

  read_ += kControlFrameHeader + len;
  if (read_ == buf_.size()) {  // drained: reset for free, no copy
    buf_.clear();
    read_ = 0;
  }
  return Status::kMessage;
}

}  // namespace dblp
