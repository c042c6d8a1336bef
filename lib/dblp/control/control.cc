#include "dblp/control/control.h"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
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
static_assert(std::variant_size_v<ControlMessage> == 12);

// Smallest encodings, used to bound a declared count by the bytes left
// before anything is reserved.
constexpr size_t kMinLayerBytes = 2 + 4;  // empty name + zero dims
constexpr size_t kDimBytes = 8;
constexpr size_t kWordBytes = 8;

uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Words needed for num_bits, computed in 64 bits: (bits + 63) / 64 in 32-bit
// arithmetic wraps for num_bits near 2^32.
uint64_t WordsFor(uint32_t num_bits) { return (uint64_t{num_bits} + 63) / 64; }

// ---------------------------------------------------------------------------
// Validation (shared by encoder and decoder).

class Checker {
 public:
  explicit Checker(const char* msg) : msg_(msg) {}

  bool Fail(ControlError e, const std::string& field, const std::string& why) {
    err_ = e;
    text_ = std::string(msg_) + "." + field + ": " + why;
    return false;
  }

  bool String(const std::string& s, size_t limit, const std::string& field) {
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
      if (!String(l.name, kMaxLayerName, field + ".name")) return false;
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

  // p must stay below 1 (a round needs a chunk); a deadline's floor may
  // ask for every chunk (LTP's --ltp_min_fraction is in (0, 1]).
  bool Fraction(double x, const char* field, bool one_allowed = false) {
    // Written so that NaN fails too.
    if (!(std::isfinite(x) && x >= 0.0 &&
          (x < 1.0 || (one_allowed && x == 1.0)))) {
      return Fail(ControlError::kBadValue, field,
                  std::to_string(x) +
                      (one_allowed ? " not in [0, 1]" : " not in [0, 1)"));
    }
    return true;
  }

  bool Check(const JoinMsg& m) {
    return String(m.worker_name, kMaxControlString, "worker_name") &&
           Layers(m.layers);
  }
  bool Check(const WelcomeMsg& m) {
    if (m.frame_auth > kMaxFrameAuthMode) {
      return Fail(ControlError::kBadValue, "frame_auth",
                  "unknown mode " + std::to_string(m.frame_auth));
    }
    return String(m.policy, kMaxControlString, "policy") && Layers(m.layers);
  }
  bool Check(const ChallengeMsg&) { return true; }
  bool Check(const ProofMsg&) { return true; }
  bool Check(const TagMsg&) { return true; }
  bool Check(const RoundBeginMsg& m) {
    return Dir(m.direction) && Fraction(m.p, "p") &&
           Fraction(m.min_fraction, "min_fraction", /*one_allowed=*/true);
  }
  bool Check(const ProbeMsg& m) { return Dir(m.direction); }
  bool Check(const BitmapMsg& m) {
    return Dir(m.direction) && Words(m.num_bits, m.words);
  }
  bool Check(const AcceptedMsg& m) { return Words(m.num_bits, m.words); }
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
  bool Check(const StopMsg& m) {
    if (!Dir(m.direction)) return false;
    const auto r = static_cast<uint8_t>(m.reason);
    if (r > static_cast<uint8_t>(StopReason::kComplete)) {
      return Fail(ControlError::kBadValue, "reason",
                  "unknown value " + std::to_string(r));
    }
    return true;
  }
  bool Check(const ByeMsg& m) {
    return String(m.reason, kMaxControlString, "reason");
  }
  bool Check(const ErrorMsg& m) {
    return String(m.text, kMaxControlString, "text");
  }

  ControlError err() const { return err_; }
  std::string& text() { return text_; }

 private:
  const char* msg_;
  ControlError err_ = ControlError::kNone;
  std::string text_;
};

// ---------------------------------------------------------------------------
// Encoding. Runs only on validated messages, so every length fits its prefix.

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}

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
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void F64(double v) { U64(std::bit_cast<uint64_t>(v)); }
  void Dir(Direction d) { U8(static_cast<uint8_t>(d)); }
  void Str(const std::string& s) {
    U16(static_cast<uint16_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void Layers(const std::vector<LayerInfo>& layers) {
    U32(static_cast<uint32_t>(layers.size()));
    for (const LayerInfo& l : layers) {
      Str(l.name);
      U32(static_cast<uint32_t>(l.shape.size()));
      for (int64_t d : l.shape) I64(d);
    }
  }

  void Body(const JoinMsg& m) {
    U16(m.protocol_version);
    U32(m.session);
    Str(m.worker_name);
    U64(m.total_bytes);
    U32(m.mtu);
    Layers(m.layers);
    Raw(m.nonce);
    Raw(m.data_mac);
    U32(m.data_ipv4);
    U16(m.data_udp_port);
  }
  template <size_t N>
  void Raw(const std::array<uint8_t, N>& a) {
    out_.insert(out_.end(), a.begin(), a.end());
  }
  void Body(const ChallengeMsg& m) {
    Raw(m.nonce);
    Raw(m.proof);
  }
  void Body(const ProofMsg& m) { Raw(m.proof); }
  void Body(const TagMsg& m) {
    U64(m.seq);
    Raw(m.mac);
  }
  void Body(const WelcomeMsg& m) {
    U32(m.session);
    U16(m.rank);
    U16(m.num_workers);
    U32(m.mtu);
    U32(m.chunk_payload);
    U32(m.num_chunks);
    U64(m.total_bytes);
    U16(m.udp_base_port);
    U16(m.num_shards);
    U32(m.resync_every);
    U8(m.push_feedback ? 1 : 0);
    U8(m.consistent_broadcast ? 1 : 0);
    U32(m.server_ipv4);
    out_.insert(out_.end(), m.server_mac.begin(), m.server_mac.end());
    Str(m.policy);
    Layers(m.layers);
    U32(m.worker_ipv4);
    U8(m.frame_auth);
    Raw(m.job_nonce);
    Raw(m.mac);
  }
  void Body(const RoundBeginMsg& m) {
    U32(m.round);
    U32(m.iteration);
    Dir(m.direction);
    F64(m.p);
    U64(m.deadline_ns);
    F64(m.min_fraction);
    U8(m.critical ? 1 : 0);
  }
  void Body(const ProbeMsg& m) {
    U32(m.round);
    Dir(m.direction);
    U32(m.pass);
    U16(m.shard);
  }
  void Body(const BitmapMsg& m) {
    U32(m.round);
    Dir(m.direction);
    Words(m.num_bits, m.words);
    U16(m.shard);
  }
  void Body(const AcceptedMsg& m) {
    U32(m.round);
    Words(m.num_bits, m.words);
  }
  void Words(uint32_t num_bits, const std::vector<uint64_t>& words) {
    U32(num_bits);
    U32(static_cast<uint32_t>(words.size()));
    for (uint64_t w : words) U64(w);
  }
  void Body(const StopMsg& m) {
    U32(m.round);
    Dir(m.direction);
    U32(m.received);
    U8(static_cast<uint8_t>(m.reason));
  }
  void Body(const ByeMsg& m) { Str(m.reason); }
  void Body(const ErrorMsg& m) {
    U16(m.code);
    Str(m.text);
  }

 private:
  std::vector<uint8_t>& out_;
};

// ---------------------------------------------------------------------------
// Decoding of one complete frame body. Structural checks (lengths, counts)
// happen here, before any allocation; value rules are left to Checker.

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const char* msg)
      : p_(p), n_(n), msg_(msg) {}

  size_t remaining() const { return n_ - pos_; }
  ControlError err() const { return err_; }
  std::string& text() { return text_; }

  bool Fail(ControlError e, const std::string& field, const std::string& why) {
    err_ = e;
    text_ = std::string(msg_) + "." + field + ": " + why;
    return false;
  }

  // Fails unless `n` more bytes are in the body.
  bool Need(uint64_t n, const std::string& field) {
    if (n > remaining()) {
      return Fail(ControlError::kTruncatedBody, field,
                  "needs " + std::to_string(n) + " bytes, " +
                      std::to_string(remaining()) + " left in frame");
    }
    return true;
  }

  bool U8(uint8_t& v, const std::string& f) {
    if (!Need(1, f)) return false;
    v = p_[pos_++];
    return true;
  }
  bool Flag(bool& v, const std::string& f) {
    uint8_t b;
    if (!U8(b, f)) return false;
    if (b > 1) {
      return Fail(ControlError::kBadValue, f,
                  "a flag must be 0 or 1, got " + std::to_string(b));
    }
    v = b == 1;
    return true;
  }
  bool U16(uint16_t& v, const std::string& f) {
    uint64_t x;
    if (!Uint(2, x, f)) return false;
    v = static_cast<uint16_t>(x);
    return true;
  }
  bool U32(uint32_t& v, const std::string& f) {
    uint64_t x;
    if (!Uint(4, x, f)) return false;
    v = static_cast<uint32_t>(x);
    return true;
  }
  bool U64(uint64_t& v, const std::string& f) { return Uint(8, v, f); }
  bool I64(int64_t& v, const std::string& f) {
    uint64_t x;
    if (!Uint(8, x, f)) return false;
    v = static_cast<int64_t>(x);
    return true;
  }
  bool F64(double& v, const std::string& f) {
    uint64_t x;
    if (!Uint(8, x, f)) return false;
    v = std::bit_cast<double>(x);
    return true;
  }
  // Enums are taken raw; Checker rejects values outside the enum.
  bool Dir(Direction& d, const std::string& f) {
    uint8_t x;
    if (!U8(x, f)) return false;
    d = static_cast<Direction>(x);
    return true;
  }
  bool Reason(StopReason& r, const std::string& f) {
    uint8_t x;
    if (!U8(x, f)) return false;
    r = static_cast<StopReason>(x);
    return true;
  }
  bool Str(std::string& s, size_t limit, const std::string& f) {
    uint16_t len;
    if (!U16(len, f + ".length")) return false;
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
  bool Bytes(std::array<uint8_t, N>& a, const std::string& f) {
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
        if (!I64(l.shape[d], field + ".shape")) return false;
      }
    }
    return true;
  }

  bool Body(JoinMsg& m) {
    return U16(m.protocol_version, "protocol_version") &&
           U32(m.session, "session") &&
           Str(m.worker_name, kMaxControlString, "worker_name") &&
           U64(m.total_bytes, "total_bytes") && U32(m.mtu, "mtu") &&
           Layers(m.layers) && Bytes(m.nonce, "nonce") &&
           Bytes(m.data_mac, "data_mac") && U32(m.data_ipv4, "data_ipv4") &&
           U16(m.data_udp_port, "data_udp_port");
  }
  bool Body(ChallengeMsg& m) {
    return Bytes(m.nonce, "nonce") && Bytes(m.proof, "proof");
  }
  bool Body(ProofMsg& m) { return Bytes(m.proof, "proof"); }
  bool Body(TagMsg& m) { return U64(m.seq, "seq") && Bytes(m.mac, "mac"); }
  bool Body(WelcomeMsg& m) {
    return U32(m.session, "session") && U16(m.rank, "rank") &&
           U16(m.num_workers, "num_workers") && U32(m.mtu, "mtu") &&
           U32(m.chunk_payload, "chunk_payload") &&
           U32(m.num_chunks, "num_chunks") &&
           U64(m.total_bytes, "total_bytes") &&
           U16(m.udp_base_port, "udp_base_port") &&
           U16(m.num_shards, "num_shards") &&
           U32(m.resync_every, "resync_every") &&
           Flag(m.push_feedback, "push_feedback") &&
           Flag(m.consistent_broadcast, "consistent_broadcast") &&
           U32(m.server_ipv4, "server_ipv4") &&
           Bytes(m.server_mac, "server_mac") &&
           Str(m.policy, kMaxControlString, "policy") && Layers(m.layers) &&
           U32(m.worker_ipv4, "worker_ipv4") &&
           U8(m.frame_auth, "frame_auth") && Bytes(m.job_nonce, "job_nonce") &&
           Bytes(m.mac, "mac");
  }
  bool Body(RoundBeginMsg& m) {
    return U32(m.round, "round") && U32(m.iteration, "iteration") &&
           Dir(m.direction, "direction") && F64(m.p, "p") &&
           U64(m.deadline_ns, "deadline_ns") &&
           F64(m.min_fraction, "min_fraction") && Flag(m.critical, "critical");
  }
  bool Body(ProbeMsg& m) {
    return U32(m.round, "round") && Dir(m.direction, "direction") &&
           U32(m.pass, "pass") && U16(m.shard, "shard");
  }
  bool Body(BitmapMsg& m) {
    return U32(m.round, "round") && Dir(m.direction, "direction") &&
           Words(m.num_bits, m.words) && U16(m.shard, "shard");
  }
  bool Body(AcceptedMsg& m) {
    return U32(m.round, "round") && Words(m.num_bits, m.words);
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
  bool Body(StopMsg& m) {
    return U32(m.round, "round") && Dir(m.direction, "direction") &&
           U32(m.received, "received") && Reason(m.reason, "reason");
  }
  bool Body(ByeMsg& m) { return Str(m.reason, kMaxControlString, "reason"); }
  bool Body(ErrorMsg& m) {
    return U16(m.code, "code") && Str(m.text, kMaxControlString, "text");
  }

 private:
  bool Uint(size_t bytes, uint64_t& v, const std::string& f) {
    if (!Need(bytes, f)) return false;
    v = 0;
    for (size_t i = 0; i < bytes; ++i) v = (v << 8) | p_[pos_++];
    return true;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const char* msg_;
  ControlError err_ = ControlError::kNone;
  std::string text_;
};

bool IsKnownType(uint8_t t) {
  return t >= static_cast<uint8_t>(ControlType::kJoin) &&
         t <= static_cast<uint8_t>(ControlType::kTag);
}

// Parses a body of alternative T; on failure fills err/text.
template <typename T>
bool ParseAs(const uint8_t* body, size_t len, const char* name,
             ControlMessage& out, ControlError& err, std::string& text) {
  T m;
  Reader r(body, len, name);
  if (!r.Body(m)) {
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
  if (!c.Check(m)) {
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
         std::holds_alternative<AcceptedMsg>(m);
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
  if (std::visit([&c](const auto& msg) { return c.Check(msg); }, m)) {
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
  std::visit([&w](const auto& msg) { w.Body(msg); }, m);
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
