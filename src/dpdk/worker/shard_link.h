// dblp-worker's links to the job's server shards (issue #22): one per
// dblp-server process that owns a partition of the gradient's chunks. A
// link holds everything this worker has per server shard: the
// authenticated control connection and its WELCOME, the partition's local
// layout and where it sits in the whole gradient, the DPDK port, the frame
// template and member key toward that server, the push sides (one per lcore
// shard of that server), the broadcast receiver over the partition and the
// transmitters. An unsharded job is one link to the one server.
//
// The WorkerJob and WorkerModel stay whole-gradient: WorkerShardLinks maps the
// global push order to each link's local seqs, the links' broadcast bitmaps
// and ACCEPTEDs into the whole gradient's (partitions are 64-chunk aligned,
// so whole words copy), and names the first server shard that is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "dblp/wire/bitmap.h"
#include "dblp/wire/chunking.h"
#include "port/datapath.h"
#include "port/frame_builder.h"
#include "port/port.h"
#include "worker/worker_control.h"

namespace dblp {

struct ShardLink {
  // Server shard `index` of `count`, whose control listener is `address`.
  ShardLink(uint16_t shard, uint16_t shards, std::string control_address,
            const JobSecret& secret, const DatapathCounters* ctr,
            double stats_period_s)
      : index(shard),
        count(shards),
        address(std::move(control_address)),
        control(secret, ctr, stats_period_s, shard) {}
  ShardLink(const ShardLink&) = delete;
  ShardLink& operator=(const ShardLink&) = delete;

  // "server 10.0.0.1:9100" in an unsharded job, else "server shard k at
  // 10.0.0.1:9101": how failures and stalls name this link's server.
  std::string Label() const;

  const uint16_t index;
  uint16_t count;  // the job's server shards (the directory's WELCOME)
  const std::string address;
  WorkerControl control;
  WelcomeMsg wel;            // its WELCOME: total_bytes is the partition's
  ChunkLayout layout;        // the partition's, in local seqs
  uint32_t first_chunk = 0;  // the global chunk of local chunk 0
  FrameKey key;              // this member's, on this link
  uint16_t port = 0;         // the DPDK port toward it
  PortCaps caps;
  Endpoint local;           // our data address toward it, as it pinned it
  FrameTemplate to_server;  // lcore 0's (and the push hook's)
  // Helper lcore j's copy ([j - 1]); writer: that lcore only (PushCrew).
  std::vector<FrameTemplate> helper_tmpl;
  std::vector<std::unique_ptr<SendSide>> push;  // one per lane of that server
  std::vector<SendSide*> push_ptrs;
  std::optional<ReceiveSide> bcast;  // over the partition
  std::vector<ChunkTransmitter> tx;  // one per TX queue
  // --tx_payload=extbuf: the partition's gradient as the frames' payload
  // memory (every tx points at it); null when frames copy.
  std::unique_ptr<ExtbufRegion> extbuf;
  const uint8_t* gradient = nullptr;  // the partition's bytes of the push
  uint8_t* mean = nullptr;            // and where its broadcast lands
  std::vector<uint32_t> order;        // this push's order, local seqs

  // Push feedback: this link's ACCEPTED for `accepted_round`, once taken.
  Bitmap accepted;
  bool have_accepted = false;
  uint32_t accepted_round = 0;
};

// Every link of the worker, in server shard order; the WorkerJob's view of
// them as one server (its AcceptedChannel).
class WorkerShardLinks {
 public:
  void Add(std::unique_ptr<ShardLink> link) {
    links_.push_back(std::move(link));
  }
  size_t size() const { return links_.size(); }
  ShardLink& operator[](size_t k) { return *links_[k]; }
  const ShardLink& operator[](size_t k) const { return *links_[k]; }
  auto begin() const { return links_.begin(); }
  auto end() const { return links_.end(); }

  // Once every link has its partition and push sides: checks that the
  // partitions, in order, tile the whole gradient's `total_chunks`, and
  // collects the sides. "" or why not.
  std::string Seal(uint32_t total_chunks);
  uint32_t total_chunks() const { return total_chunks_; }

  // Each link's `order`: the global push order's chunks in its partition,
  // as local seqs, in the same order.
  void Split(std::span<const uint32_t> order);
  // The broadcast's arrived chunks of every link, in global chunks.
  void SnapshotArrived(Bitmap* arrived) const;
  // Of the whole gradient's broadcast (every link's receiver).
  double delivered_fraction() const;
  // Every link's push sides, for the row.
  std::span<const SendSide* const> push_sides() const { return sides_; }

  // AcceptedChannel: the ACCEPTED of push `round` from every link, as one
  // bitmap of global chunks; false until every link's came.
  bool TakeAccepted(uint32_t round, Bitmap* out);
  bool server_gone() const;
  // The first link that is gone, named (unsharded: as its control says).
  std::string failure() const;

 private:
  std::vector<std::unique_ptr<ShardLink>> links_;
  std::vector<const SendSide*> sides_;
  std::vector<uint32_t> firsts_;  // each link's first global chunk
  uint32_t total_chunks_ = 0;
};

}  // namespace dblp
