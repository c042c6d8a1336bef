#include "datapath.h"

#include <rte_errno.h>
#include <rte_ethdev.h>

#include "eal_app.h"

namespace dblp {

EventRing::EventRing(const std::string& name, unsigned size) {
  ring_ = rte_ring_create_elem(name.c_str(), sizeof(CtlEvent), size,
                               static_cast<int>(rte_socket_id()),
                               RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (ring_ == nullptr) {
    Die("cannot create control ring " + name + ": " +
            rte_strerror(rte_errno),
        "give the EAL more memory (-m) or check --file-prefix clashes");
  }
}

EventRing::~EventRing() { rte_ring_free(ring_); }

uint32_t ChunkTransmitter::Send(FrameTemplate& tmpl, DataHeader proto,
                                const uint32_t* seqs, uint32_t n,
                                const uint8_t* buffer,
                                const ChunkLayout& layout) {
  constexpr uint32_t kMaxBurst = 64;
  rte_mbuf* mbufs[kMaxBurst];
  uint32_t sent_total = 0;
  while (n > 0) {
    const uint32_t chunk = n < kMaxBurst ? n : kMaxBurst;
    // Decide losses first: a dropped frame costs nothing to build.
    uint32_t keep[kMaxBurst];
    uint32_t k = 0;
    for (uint32_t i = 0; i < chunk; ++i) {
      if (loss != nullptr && loss->ShouldDrop()) {
        DatapathCounters::Add(counters->injected_drops);
        continue;
      }
      keep[k++] = seqs[i];
    }
    seqs += chunk;
    n -= chunk;
    if (k == 0) continue;
    if (rte_pktmbuf_alloc_bulk(pool, mbufs, k) != 0) {
      DatapathCounters::Add(counters->mbuf_alloc_failures, k);
      continue;  // as if lost on the wire: the next pass re-sends them
    }
    for (uint32_t i = 0; i < k; ++i) {
      const uint32_t seq = keep[i];
      proto.seq = seq;
      proto.payload_len = static_cast<uint16_t>(layout.Length(seq));
      tmpl.Build(mbufs[i], proto, buffer + layout.Offset(seq));
    }
    uint32_t done = 0;
    for (uint32_t tries = 0; done < k && tries <= tx_retries; ++tries) {
      done += rte_eth_tx_burst(port, queue, mbufs + done,
                               static_cast<uint16_t>(k - done));
    }
    if (done < k) {
      DatapathCounters::Add(counters->tx_full_drops, k - done);
      rte_pktmbuf_free_bulk(mbufs + done, k - done);
    }
    DatapathCounters::Add(counters->tx_frames, done);
    sent_total += done;
  }
  return sent_total;
}

}  // namespace dblp
