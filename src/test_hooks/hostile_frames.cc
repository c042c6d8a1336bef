#include "test_hooks/hostile_frames.h"

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "dblp/control/job_auth.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/wire/wire.h"

namespace dblp {
namespace {

// What an attacker on the data path would send at the server before our
// push, none of which may be accepted:
// frames of the previous round, of another job and of a future round (all
// tagged with a key that is not the job's); this round's chunks with other
// floats under that wrong key (bad tag: accepted, they would change the
// mean); exact copies of this round's chunks from an address the server did
// not pin (another IPv4; with other floats under header tags, which do
// not cover them); valid L2-L4 around bad DBLP bytes; and what an observer
// on the bridge does with a genuine frame (issue #21): this round's chunks,
// their genuine header and tag (this member's key over the genuine floats)
// from this worker's own pinned address, with other floats. A header-only
// tag (--frame_auth=header) takes them; the default full tag refuses them.
struct Hostile {
  const WelcomeMsg& wel;
  rte_mempool* pool;
  DatapathCounters* ctr;
  FrameTemplate forged;    // toward the server, tags under a wrong key
  FrameTemplate stranger;  // the job's key, from an unpinned IPv4
  FrameAuth member;        // this member's key: the genuine tags
  const uint8_t* grad;
  const ChunkLayout& layout;
  ChunkRanges lanes;  // this round's chunks go on their lane's queue
  bool full_tags;
  std::vector<uint8_t> poison =
      std::vector<uint8_t>(layout.total_bytes(), 0x41);

  void Send(uint32_t push_round, std::span<const uint32_t> replay,
            std::span<const uint32_t> next, uint32_t count) {
    ChunkTransmitter tx{0, 0, pool, ctr, nullptr, 64};
    const auto n = [count](std::span<const uint32_t> s) {
      return static_cast<uint32_t>(std::min<size_t>(s.size(), count));
    };
    DataHeader stale{FrameType::kPush,
                     wel.session,
                     static_cast<uint16_t>(wel.rank),
                     0,
                     push_round - 2,
                     0};
    tx.Send(forged, stale, replay.data(), n(replay), grad, layout);
    DataHeader wrong_session = stale;
    wrong_session.round = push_round;
    wrong_session.session = wel.session ^ 0x5A5A5A5Au;
    const uint32_t zero = 0;
    tx.Send(forged, wrong_session, &zero, 1, grad, layout);
    DataHeader future = stale;
    future.round = push_round + 4;
    tx.Send(forged, future, &zero, 1, grad, layout);
    DataHeader current = stale;
    current.round = push_round;
    for (uint32_t i = 0; i < n(next); ++i) {
      // On the queue of the chunk's lane, like the real frame: a server
      // lcore sees it and must refuse it for its tag or its source.
      ChunkTransmitter q{0,       static_cast<uint16_t>(lanes.RangeOf(next[i])),
                         pool,    ctr,
                         nullptr, 64};
      if (lanes.count() > 1) {  // and to its lcore's port, steering.h
        q.udp_dst_port = static_cast<uint16_t>(wel.udp_base_port + q.queue);
      }
      q.Send(forged, current, &next[i], 1, poison.data(), layout);
      // From an unpinned address with the job's key: other floats where
      // the tag does not cover them (header mode), so only the pin keeps
      // them out of the mean; exact copies under full tags (GMAC must
      // never seal two contents under one nonce).
      q.Send(stranger, current, &next[i], 1, full_tags ? grad : poison.data(),
             layout);
      SendTagReplay(current, next[i], q.queue);
    }
    // A wrong chunk length, a truncated header and a bad magic.
    uint8_t raw[kDataHeaderBytes + 8] = {};
    DataHeader h = current;
    h.payload_len = 8;  // shorter than chunk 0: out of range
    EncodeDataHeader(h, raw);
    const uint16_t lens[3] = {sizeof(raw), 10, sizeof(raw)};
    for (int k = 0; k < 3; ++k) {
      if (k == 2) raw[0] ^= 0xFF;  // bad magic
      rte_mbuf* m = rte_pktmbuf_alloc(pool);
      if (m == nullptr) break;
      forged.BuildRaw(m, raw, lens[k]);
      if (rte_eth_tx_burst(0, 0, &m, 1) != 1) rte_pktmbuf_free(m);
    }
  }

  // Chunk `seq`'s genuine header and tag around poisoned floats, from the
  // pinned source (forged's endpoints are this worker's own).
  void SendTagReplay(DataHeader h, uint32_t seq, uint16_t queue) {
    if (!member.enabled()) return;
    h.seq = seq;
    h.payload_len = static_cast<uint16_t>(layout.Length(seq));
    const size_t body = kDataHeaderBytes + h.payload_len;
    std::vector<uint8_t> raw(body + member.tag_bytes());
    BuildDataFrame(h, grad + layout.Offset(seq), raw.data());
    member.Seal(raw.data(), body, raw.data() + body);
    std::memcpy(raw.data() + kDataHeaderBytes, poison.data(), h.payload_len);
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) return;
    if (!forged.BuildRaw(m, raw.data(), static_cast<uint16_t>(raw.size())) ||
        rte_eth_tx_burst(0, queue, &m, 1) != 1) {
      rte_pktmbuf_free(m);
    }
  }
};

class HostileHook : public PushHook {
 public:
  HostileHook(const PushHookContext& c, uint32_t per_round)
      : per_round_(per_round),
        hostile_{*c.welcome,
                 c.pool,
                 c.counters,
                 *c.to_server,
                 FrameTemplate(Elsewhere(c.local), c.to_server->dst(), *c.caps),
                 FrameAuth(c.frame_key),
                 c.gradient,
                 *c.layout,
                 ChunkRanges(c.layout->num_chunks(), c.queues),
                 c.frame_key.mode == FrameAuthMode::kFull} {
    // An independent key (never one related to the job's).
    FrameKey wrong = c.frame_key;
    const AuthBytes random = RandomAuthBytes();
    std::memcpy(wrong.key.data(), random.data(), wrong.key.size());
    if (wrong.mode == FrameAuthMode::kNone) wrong.mode = FrameAuthMode::kHeader;
    hostile_.forged.set_auth(wrong);
    hostile_.stranger.set_auth(c.frame_key);
  }

  void BeforePush(uint64_t it, uint32_t round,
                  std::span<const uint32_t> order) override {
    if (it > 0) hostile_.Send(round, replay_, order, per_round_);
    // This round's first chunks, replayed as stale in the next.
    replay_.assign(order.begin(),
                   order.begin() + std::min<size_t>(order.size(), per_round_));
  }

 private:
  static Endpoint Elsewhere(Endpoint local) {
    local.ipv4 ^= 0x00000100u;  // another host on the same /16
    return local;
  }

  uint32_t per_round_;
  Hostile hostile_;
  std::vector<uint32_t> replay_;
};

}  // namespace

PushHookFactory HostileFrames(uint32_t per_round) {
  return [per_round](const PushHookContext& c) -> std::unique_ptr<PushHook> {
    return std::make_unique<HostileHook>(c, per_round);
  };
}

}  // namespace dblp
