// The server's broadcast frames over a DPDK TX queue (send_side.h's
// ChunkFrames). Every worker gets the same chunks of the mean, each frame
// under that worker's own headers and tag (its member key). Two ways to
// build them:
//
//   copy:   the chunk is copied into each worker's frame (MbufFrames,
//           ChunkTransmitter::Send), one segment per frame;
//   shared: the chunk is not copied at all: each frame is a chain of a
//           header mbuf (L2-L4 + DBLP header, FrameTemplate::BuildHead),
//           an mbuf attached (rte_pktmbuf_attach_extbuf) over the chunk in
//           the mean, and in an authenticated job a 16-byte tag mbuf. One
//           payload serves every worker's frame; only headers and tags are
//           per worker.
//
// Shared is what a NIC that DMAs the frame wants. net_memif copies every
// segment into its ring anyway, so there the chunk moves once either way
// (copy: mean -> mbuf -> ring; shared: mean -> ring) and the question is
// whether two extra mbufs per frame cost less than the copy
// (docs/BENCHMARKS.md "Broadcast frames"; dblp-server --bcast_frames).
#pragma once

#include <rte_mbuf.h>

#include <cstdint>
#include <string>

#include "dblp/wire/chunking.h"
#include "port/datapath.h"
#include "port/frame_builder.h"

namespace dblp {

enum class BcastFrameMode : uint8_t { kCopy = 0, kShared = 1 };

const char* BcastFrameModeName(BcastFrameMode m);  // "copy", "shared"
// "auto", "copy" or "shared"; false for anything else.
bool ParseBcastFrameMode(const std::string& s, bool* is_auto,
                         BcastFrameMode* out);
// What "auto" means on driver `driver`: copy on the software ports, which
// copy every frame themselves (net_memif measured faster with the copy:
// docs/BENCHMARKS.md), and wherever the device cannot read the mean
// (`mean_dma_mapped` false: MapMeanForDma failed or was not tried); shared
// otherwise.
BcastFrameMode AutoBcastFrameMode(const std::string& driver,
                                  bool mean_dma_mapped);

// Registers the `len` bytes at `p` (the mean: heap memory, not DPDK's) as
// external memory and DMA-maps them for each of `ports`' devices at IOVA =
// VA. False where that is not possible (IOVA as PA, a bus without DMA
// mapping such as the virtual devices): then shared frames must not go to
// a device that DMAs.
bool MapMeanForDma(const void* p, size_t len, const uint16_t* ports,
                   uint16_t nb_ports);

// The IOVA of `p` in the mean for shared frames: the VA in IOVA-as-VA mode
// (what MapMeanForDma maps), RTE_BAD_IOVA otherwise (a PMD that copies does
// not read it).
rte_iova_t MeanIova(const void* p);

// Builds and transmits `n` chunks `seqs` of `buffer` as shared-payload
// frames of `proto` through `tx` (its pool, queue, pacer and counters, as
// ChunkTransmitter::Send; the same return value: how many of `seqs` were
// consumed). `buffer_iova`: the IOVA of buffer[0] (MeanIova).
uint32_t SendSharedChunks(ChunkTransmitter& tx, FrameTemplate& tmpl,
                          DataHeader proto, const uint32_t* seqs, uint32_t n,
                          const uint8_t* buffer, rte_iova_t buffer_iova,
                          const ChunkLayout& layout);

// One shared-payload frame into `segs` (2 mbufs, or 3 with a tag, fresh
// from a pool): the chain's head is segs[0]. False (nothing chained) if the
// template refuses the header (BuildHead). For SendSharedChunks and tests.
bool BuildSharedFrame(FrameTemplate& tmpl, const DataHeader& h,
                      const uint8_t* payload, rte_iova_t payload_iova,
                      rte_mbuf** segs);

// The broadcast's ChunkFrames: copy or shared, chosen per job.
struct BcastFrames {
  ChunkTransmitter* tx;
  FrameTemplate* tmpl;
  const uint8_t* buffer;
  const ChunkLayout* layout;
  BcastFrameMode mode = BcastFrameMode::kCopy;
  rte_iova_t buffer_iova = RTE_BAD_IOVA;
  uint32_t Send(const DataHeader& proto, const uint32_t* seqs, uint32_t n) {
    if (mode == BcastFrameMode::kShared) {
      return SendSharedChunks(*tx, *tmpl, proto, seqs, n, buffer, buffer_iova,
                              *layout);
    }
    return tx->Send(*tmpl, proto, seqs, n, buffer, *layout);
  }
};

}  // namespace dblp
