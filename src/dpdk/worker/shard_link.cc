#include "worker/shard_link.h"

#include <algorithm>

namespace dblp {

std::string ShardLink::Label() const {
  if (count <= 1) return "server " + address;
  return "server shard " + std::to_string(index) + " at " + address;
}

std::string WorkerShardLinks::Seal(uint32_t total_chunks) {
  uint32_t next = 0;
  sides_.clear();
  firsts_.clear();
  for (const auto& l : links_) {
    if (l->first_chunk != next || l->first_chunk % 64 != 0) {
      return l->Label() + " holds chunks from " +
             std::to_string(l->first_chunk) +
             ", but the partitions before it "
             "end at " +
             std::to_string(next) +
             " (partitions are contiguous, in shard order, and start at "
             "multiples of 64 chunks)";
    }
    next += l->layout.num_chunks();
    firsts_.push_back(l->first_chunk);
    for (const SendSide* s : l->push_ptrs) sides_.push_back(s);
  }
  if (next != total_chunks) {
    return "the server shards' partitions hold " + std::to_string(next) +
           " chunks, the gradient " + std::to_string(total_chunks);
  }
  total_chunks_ = total_chunks;
  return "";
}

void WorkerShardLinks::Split(std::span<const uint32_t> order) {
  for (const auto& l : links_) l->order.clear();
  if (links_.size() == 1) {  // unsharded: local seqs are global
    links_[0]->order.assign(order.begin(), order.end());
    return;
  }
  for (const uint32_t g : order) {
    const auto it = std::upper_bound(firsts_.begin(), firsts_.end(), g);
    ShardLink& l = *links_[static_cast<size_t>(it - firsts_.begin()) - 1];
    l.order.push_back(g - l.first_chunk);
  }
}

void WorkerShardLinks::SnapshotArrived(Bitmap* arrived) const {
  if (links_.size() == 1) {
    links_[0]->bcast->receiver().SnapshotBitmap(*arrived);
    return;
  }
  if (arrived->size() != total_chunks_) arrived->Resize(total_chunks_);
  Bitmap part;
  for (const auto& l : links_) {
    l->bcast->receiver().SnapshotBitmap(part);
    arrived->PlaceAt(l->first_chunk, part);
  }
}

double WorkerShardLinks::delivered_fraction() const {
  if (links_.size() == 1) {
    return links_[0]->bcast->receiver().delivered_fraction();
  }
  uint64_t received = 0;
  for (const auto& l : links_) received += l->bcast->receiver().received();
  return total_chunks_ == 0 ? 0.0
                            : static_cast<double>(received) / total_chunks_;
}

bool WorkerShardLinks::TakeAccepted(uint32_t round, Bitmap* out) {
  if (links_.size() == 1) return links_[0]->control.TakeAccepted(round, out);
  bool all = true;
  for (const auto& l : links_) {
    if (l->have_accepted && l->accepted_round == round) continue;
    l->have_accepted = l->control.TakeAccepted(round, &l->accepted);
    l->accepted_round = round;
    all = all && l->have_accepted;
  }
  if (!all) return false;
  Bitmap whole(total_chunks_);
  for (const auto& l : links_) {
    // A partition's ACCEPTED of another size would not fit: refused.
    if (l->accepted.size() != l->layout.num_chunks() ||
        !whole.PlaceAt(l->first_chunk, l->accepted)) {
      *out = Bitmap(0);
      return true;
    }
    l->have_accepted = false;
  }
  *out = std::move(whole);
  return true;
}

bool WorkerShardLinks::server_gone() const {
  for (const auto& l : links_) {
    if (l->control.server_gone()) return true;
  }
  return false;
}

std::string WorkerShardLinks::failure() const {
  for (const auto& l : links_) {
    if (!l->control.server_gone()) continue;
    if (links_.size() == 1) return l->control.failure();
    return l->Label() + " is gone: " + l->control.failure();
  }
  return "";
}

}  // namespace dblp
