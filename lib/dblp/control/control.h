// TCP control channel codec: length-prefixed, typed messages.
//
// Frame layout (all integers big-endian):
//   u32 L      bytes of type + body, 1 <= L <= decoder's max_frame
//   u8  type   ControlType
//   body       L - 1 bytes, fields in declaration order of the struct
// Doubles travel as their IEEE-754 bits in a u64, strings as u16 length +
// bytes, vectors as u32 count + items, std::array<uint8_t, N> as N raw bytes.
// The encoding is canonical: decoding a frame and re-encoding the message
// yields the same bytes.
//
// The decoder never trusts a length: the frame length is checked against
// max_frame as soon as its 4 bytes arrive, and every string length or vector
// count is checked against its limit and against the bytes left in the body
// before anything is allocated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dblp/security/auth_bytes.h"

namespace dblp {

// 2: PROBE and BITMAP name the sender's lane (rounds split over lcores).
// 3: WELCOME carries resync_every (replicas re-synchronised, resync.h) and
//    push_feedback and consistent_broadcast; ACCEPTED (the push's final
//    accepted set) is new.
// 4: authenticated jobs (job_auth.h): JOIN carries the worker's nonce and
//    its data source; CHALLENGE, PROOF and TAG are new; WELCOME carries the
//    worker's pinned IPv4, the frame authentication mode, the job nonce and
//    a MAC over itself.
// 5: ROUND_BEGIN carries `critical`, the policy's phase (workers report it
//    in their rows and to a PyTorch trainer).
// 6: server shards (one job over S dblp-server processes, each owning a
//    partition of the chunks): JOIN carries the worker's claim on a shard
//    (index, count, range, directory rank and nonce); WELCOME carries the
//    shard's place, the whole gradient's size and the shard map;
//    SHARD_HELLO, SHARD_ASSIGN (a shard's registration with the directory
//    and its partition), PHASE_PARTIAL and PHASE_DECISION (the job's one
//    phase, lib/dblp/job/phase_link.h) are new.
inline constexpr uint16_t kControlVersion = 6;
inline constexpr uint32_t kMaxControlFrame = 1u << 20;  // default decoder limit
inline constexpr size_t kControlFrameHeader = 4;        // the u32 length

// Field limits, enforced by both the encoder and the decoder.
inline constexpr size_t kMaxControlString = 4096;
inline constexpr size_t kMaxLayerName = 256;
inline constexpr size_t kMaxLayers = 65536;
inline constexpr size_t kMaxShapeDims = 8;
// Server shards of one job (dblp-server --shards): at most this many, so a
// WELCOME's shard map has at most this many entries.
inline constexpr size_t kMaxServerShards = 64;
// A PHASE_PARTIAL's norm blocks: one per 64 chunks of at most 2^32 chunks.
inline constexpr size_t kMaxPhaseBlocks = size_t{1} << 26;

enum class ControlType : uint8_t {
  kJoin = 1,
  kWelcome = 2,
  kRoundBegin = 3,
  kProbe = 4,
  kBitmap = 5,
  kStop = 6,
  kBye = 7,
  kError = 8,
  kAccepted = 9,
  kChallenge = 10,
  kProof = 11,
  kTag = 12,
  kShardHello = 13,
  kShardAssign = 14,
  kPhasePartial = 15,
  kPhaseDecision = 16,
};

struct LayerInfo {
  std::string name;
  std::vector<int64_t> shape;  // every dim >= 0, at most kMaxShapeDims dims
  bool operator==(const LayerInfo&) const = default;
};

enum class Direction : uint8_t { kPush = 0, kBroadcast = 1 };

// One server shard (a dblp-server process owning a partition of the
// gradient's chunks), as the directory (shard 0) lists it in its WELCOME.
// Since v6.
struct ShardEntry {
  uint32_t control_ipv4 = 0;  // its TCP control listener
  uint16_t control_port = 0;
  uint32_t data_ipv4 = 0;  // where its data frames go
  std::array<uint8_t, 6> data_mac{};
  uint16_t udp_base_port = 0;
  uint16_t queues = 1;  // its datapath lcores (lanes), >= 1
  // Its partition: global chunks [first_chunk, first_chunk + num_chunks).
  uint32_t first_chunk = 0;
  uint32_t num_chunks = 0;
  bool operator==(const ShardEntry&) const = default;
};

// Worker -> server, once: who I am and what buffer I will push.
struct JoinMsg {
  uint16_t protocol_version = kControlVersion;
  uint32_t session = 0;
  std::string worker_name;
  uint64_t total_bytes = 0;
  uint32_t mtu = 0;
  std::vector<LayerInfo> layers;
  // Since v4. The worker's fresh random nonce (job_auth.h).
  AuthBytes nonce{};
  // Where its data frames will come from, pinned by the server: the port's
  // MAC and an IPv4 (0 = let the server assign one).
  std::array<uint8_t, 6> data_mac{};
  uint32_t data_ipv4 = 0;
  uint16_t data_udp_port = 0;  // 0: the server's base port + 1 + rank
  // Since v6. Which server shard this JOIN is for and the claim the
  // directory's WELCOME gave the worker: shard k > 0 admits only a JOIN
  // whose claim matches its own registration. A JOIN to the directory (or
  // to an unsharded server) carries the defaults.
  uint16_t shard_index = 0;     // < shard_count
  uint16_t shard_count = 1;     // 1..kMaxServerShards
  uint32_t first_chunk = 0;     // the claimed partition (global chunks)
  uint32_t shard_chunks = 0;    // 0: unsharded or the directory
  uint16_t rank_plus_one = 0;   // the directory's rank + 1 (0: none yet)
  AuthBytes directory_nonce{};  // the directory's job nonce
  bool operator==(const JoinMsg&) const = default;
};

// Server -> worker, once: the session's agreed layout.
struct WelcomeMsg {
  uint32_t session = 0;
  uint16_t rank = 0;
  uint16_t num_workers = 0;
  uint32_t mtu = 0;
  uint32_t chunk_payload = 0;
  uint32_t num_chunks = 0;
  uint64_t total_bytes = 0;
  uint16_t udp_base_port = 0;
  uint16_t lanes = 1;
  // Every this many training steps a re-synchronisation iteration (0 =
  // none; lib/dblp/policy/resync.h). Since protocol v3.
  uint32_t resync_every = 0;
  // The server sends ACCEPTED after every push and the worker carries what
  // was not accepted into its next push (push_feedback.h). Since v3.
  bool push_feedback = false;
  // The broadcast sends one subset for every worker and the server carries
  // the rest (broadcast_carry.h): a worker must zero-fill, never fill from
  // its previous mean. Since v3.
  bool consistent_broadcast = false;
  uint32_t server_ipv4 = 0;  // host order value; sent big-endian like all ints
  std::array<uint8_t, 6> server_mac{};
  std::string policy;
  std::vector<LayerInfo> layers;
  // Since v4. The IPv4 the worker's data frames must come from (the server
  // pinned it with the JOIN's MAC and its UDP port).
  uint32_t worker_ipv4 = 0;
  // FrameAuthMode (frame_auth.h): 0 none, 1 header, 2 full.
  uint8_t frame_auth = 0;
  // The job's random nonce: the frame key and the session derive from it.
  AuthBytes job_nonce{};
  // HMAC over this WELCOME (with mac zeroed) and both handshake nonces:
  // only the server that proved the secret could have sent it.
  AuthBytes mac{};
  // Since v6. This server's place among the job's server shards. Then
  // total_bytes and num_chunks above describe this shard's PARTITION (the
  // worker's local layout for it), first_chunk is where it starts in the
  // whole gradient, and model_bytes is the whole gradient's size (0 from
  // a server before v6; an unsharded server sends total_bytes).
  uint16_t shard_index = 0;  // < shard_count
  uint16_t shard_count = 1;  // 1..kMaxServerShards
  uint32_t first_chunk = 0;
  uint64_t model_bytes = 0;  // >= total_bytes unless 0
  // The directory's shard map: every shard in index order, itself
  // included, contiguous from chunk 0; empty from a shard k > 0 and from
  // an unsharded server.
  std::vector<ShardEntry> shards;
  bool operator==(const WelcomeMsg&) const = default;
};

// Server -> worker, answering JOIN: the server's nonce and its proof that
// it holds the job secret (job_auth.h). Since v4.
struct ChallengeMsg {
  AuthBytes nonce{};
  AuthBytes proof{};
  bool operator==(const ChallengeMsg&) const = default;
};

// Worker -> server, answering CHALLENGE: the worker's proof. Since v4.
struct ProofMsg {
  AuthBytes proof{};
  bool operator==(const ProofMsg&) const = default;
};

// Either way, after every message once the channel is authenticated
// (ControlSidecar::Authenticate): its sequence number and MAC. Since v4.
struct TagMsg {
  uint64_t seq = 0;
  AuthBytes mac{};
  bool operator==(const TagMsg&) const = default;
};

// Server -> worker: a round starts, with the tolerance p it must honour.
struct RoundBeginMsg {
  uint32_t round = 0;
  uint32_t iteration = 0;
  Direction direction = Direction::kPush;
  double p = 0;  // finite, in [0, 1)
  uint64_t deadline_ns = 0;
  double min_fraction = 0;  // finite, in [0, 1]
  // The policy's phase (dblp: inside a critical learning regime), so a
  // worker can report it with its rows (v5).
  bool critical = false;
  bool operator==(const RoundBeginMsg&) const = default;
};

// Sender -> receiver after a full pass.
struct ProbeMsg {
  uint32_t round = 0;
  Direction direction = Direction::kPush;
  uint32_t pass = 0;
  // The sender's lane that asks (its chunk range, chunk_ranges.h); the
  // BITMAP answering it names the same lane.
  uint16_t lane = 0;
  bool operator==(const ProbeMsg&) const = default;
};

// Receiver -> sender: which seqs arrived. words.size() == ceil(num_bits / 64)
// and the bits beyond num_bits are zero.
struct BitmapMsg {
  uint32_t round = 0;
  Direction direction = Direction::kPush;
  uint32_t num_bits = 0;
  std::vector<uint64_t> words;
  uint16_t lane = 0;  // the PROBE's
  bool operator==(const BitmapMsg&) const = default;
};

enum class StopReason : uint8_t {
  kThreshold = 0,
  kDeadline = 1,
  kComplete = 2
};

// Receiver -> sender: enough arrived, stop sending (early stop).
struct StopMsg {
  uint32_t round = 0;
  Direction direction = Direction::kPush;
  uint32_t received = 0;
  StopReason reason = StopReason::kThreshold;
  bool operator==(const StopMsg&) const = default;
};

// Server -> worker, after a push round closed (with push feedback): the
// chunks the server summed, whatever arrived after STOP included. words as
// in BitmapMsg.
struct AcceptedMsg {
  uint32_t round = 0;
  uint32_t num_bits = 0;
  std::vector<uint64_t> words;
  bool operator==(const AcceptedMsg&) const = default;
};

// Server shard k > 0 -> the directory (shard 0), once, right after its
// PROOF (it JOINed with shard_index k and no claim): where it listens and
// sends, and the job flags every shard must share. Since v6.
struct ShardHelloMsg {
  uint16_t shard_index = 0;   // its --shard_index, < shard_count
  uint16_t shard_count = 1;   // its --shards
  uint32_t control_ipv4 = 0;  // its --listen (0: the address it came from)
  uint16_t control_port = 0;
  uint32_t data_ipv4 = 0;  // its --local_ip
  std::array<uint8_t, 6> data_mac{};
  uint16_t udp_base_port = 0;  // its --udp_port
  uint16_t queues = 1;         // its datapath lcores, >= 1
  uint32_t mtu = 0;            // its data port's
  // "--name=value" lines: the job's flags, which must match the
  // directory's (the first difference is named in the refusal).
  std::string job_flags;
  bool operator==(const ShardHelloMsg&) const = default;
};

// The directory -> server shard k, once every shard registered and every
// worker joined: its partition of the job's chunks. Since v6.
struct ShardAssignMsg {
  uint16_t shard_index = 0;
  uint16_t shard_count = 1;
  uint32_t first_chunk = 0;  // global chunks [first, first + num)
  uint32_t num_chunks = 0;
  uint32_t chunk_payload = 0;  // bytes a chunk (the last may be shorter)
  uint64_t model_bytes = 0;    // the whole gradient
  // The directory's job nonce: every worker's claim on this shard carries
  // it (JoinMsg::directory_nonce).
  AuthBytes directory_nonce{};
  bool operator==(const ShardAssignMsg&) const = default;
};

// Server shard k -> the directory, once per iteration: its partition's
// norm blocks (float_ops.h BlockSquares) and its push's duration. Since v6.
struct PhasePartialMsg {
  uint64_t iteration = 0;
  bool resync = false;
  uint64_t push_ns = 0;
  std::vector<double> squares;  // at most kMaxPhaseBlocks
  bool operator==(const PhasePartialMsg&) const = default;
};

// The directory -> every server shard k > 0, once per iteration: the
// whole mean's norm and the next push's tolerance. Since v6.
struct PhaseDecisionMsg {
  uint64_t iteration = 0;
  double norm = 0;  // any bits (a non-finite mean's norm is counted)
  double p = 0;     // in [0, 1)
  uint64_t deadline_ns = 0;
  double min_fraction = 1.0;  // in [0, 1]
  bool critical = false;
  bool operator==(const PhaseDecisionMsg&) const = default;
};

struct ByeMsg {
  std::string reason;
  bool operator==(const ByeMsg&) const = default;
};

struct ErrorMsg {
  uint16_t code = 0;
  std::string text;
  bool operator==(const ErrorMsg&) const = default;
};

// Alternative index + 1 == ControlType value (static_assert'ed in the .cc).
using ControlMessage =
    std::variant<JoinMsg, WelcomeMsg, RoundBeginMsg, ProbeMsg, BitmapMsg,
                 StopMsg, ByeMsg, ErrorMsg, AcceptedMsg, ChallengeMsg, ProofMsg,
                 TagMsg, ShardHelloMsg, ShardAssignMsg, PhasePartialMsg,
                 PhaseDecisionMsg>;

enum class ControlError : uint8_t {
  kNone,
  kFrameTooLarge,  // declared length > max_frame
  kEmptyFrame,     // declared length 0 (no type byte)
  kUnknownType,    // type byte not a ControlType
  kTruncatedBody,  // a field, string or vector runs past the frame's end
  kTrailingBytes,  // bytes left in the frame after the last field
  kStringTooLong,  // string above kMaxControlString / kMaxLayerName
  kTooManyItems,   // more than kMaxLayers layers, kMaxShapeDims dims, ...
  kBadBitmap,      // word count != ceil(num_bits / 64) or bits past the end
  kBadValue,       // enum out of range, p/min_fraction, negative dim
};

const char* ControlErrorName(ControlError e);
const char* ControlTypeName(ControlType t);  // "JOIN", ...; "UNKNOWN"
const char* ControlTypeName(const ControlMessage& m);
ControlType TypeOf(const ControlMessage& m);
// Messages only a server sends (WELCOME, CHALLENGE, ROUND_BEGIN, ACCEPTED,
// and the directory's SHARD_ASSIGN and PHASE_DECISION) and only a worker
// sends (JOIN, PROOF): either one arriving at the wrong end is out of
// order. SHARD_HELLO and PHASE_PARTIAL come only from a server shard on its
// connection to the directory (IsShardMessage).
bool IsServerMessage(const ControlMessage& m);
bool IsWorkerOnlyMessage(const ControlMessage& m);
bool IsShardMessage(const ControlMessage& m);

// Checks a message against the field limits and value rules above. Returns
// kNone if it may be sent; otherwise the error the decoder would report,
// with a description in *text when text is non-null.
ControlError ValidateControl(const ControlMessage& m,
                             std::string* text = nullptr);

// Appends one frame to `out`. Throws std::invalid_argument (leaving `out`
// unchanged) if ValidateControl rejects the message, so a bad message fails
// at the sender instead of poisoning the peer's connection. The frame size is
// not checked against kMaxControlFrame: the receiver's decoder decides that.
void EncodeControl(const ControlMessage& m, std::vector<uint8_t>& out);
std::vector<uint8_t> EncodeControl(const ControlMessage& m);

// The receive side of one control connection. Feed it whatever read()
// returned (any split), then call Next() until it stops returning kMessage.
//
// Errors are fatal: after the first kError the decoder is poisoned. Next()
// keeps returning kError with the same error()/error_text(), Feed() discards
// its input, and the caller must close the connection (the byte stream has
// lost framing, so nothing after the bad frame can be trusted).
//
// Memory: the decoder buffers at most what it was fed; it never reserves
// based on a declared length, so a peer can make it hold at most
// max_frame + 4 bytes of one incomplete frame (plus whatever the caller feeds
// without draining Next()).
class ControlDecoder {
 public:
  explicit ControlDecoder(uint32_t max_frame = kMaxControlFrame);

  // Appends bytes. Ignored once poisoned.
  void Feed(const uint8_t* data, size_t len);

  enum class Status { kMessage, kNeedMore, kError };
  // Pops one complete message into `out` (assigned only on kMessage).
  Status Next(ControlMessage& out);

  ControlError error() const { return error_; }
  // Human-readable description of the error naming the offending field;
  // empty while error() == kNone.
  const std::string& error_text() const { return error_text_; }
  // Bytes fed but not yet consumed as complete messages.
  size_t buffered() const { return buf_.size() - read_; }
  uint32_t max_frame() const { return max_frame_; }

 private:
  Status Fail(ControlError e, std::string text);

  uint32_t max_frame_;
  std::vector<uint8_t> buf_;
  size_t read_ = 0;  // consumed prefix of buf_, compacted lazily in Feed()
  ControlError error_ = ControlError::kNone;
  std::string error_text_;
};

}  // namespace dblp
