// Push feedback's ACCEPTED between a datapath and its control thread, the
// same for every transport: the server's coordinator stages each worker's
// message and the sidecar sends it when the request that names it comes
// through the queue (so it goes out in order with the ROUND_BEGINs); a
// worker's sidecar puts the message it received and the worker's model
// takes it for its push round. Once per iteration, never per packet: a
// mutex is fine.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/wire/bitmap.h"

namespace dblp {

// Server: one slot per worker. Writer: the coordinator (Stage); reader:
// the sidecar (Take).
class AcceptedSlots {
 public:
  void Stage(uint32_t w, AcceptedMsg m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_.size() <= w) slots_.resize(w + 1);
    slots_[w] = std::move(m);
  }
  // Worker w's staged message for `round`, moved out; false if there is
  // none for that round.
  bool Take(uint32_t w, uint32_t round, AcceptedMsg* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (w >= slots_.size() || !slots_[w] || slots_[w]->round != round) {
      return false;
    }
    *out = std::move(*slots_[w]);
    slots_[w].reset();
    return true;
  }

 private:
  std::mutex mu_;
  std::vector<std::optional<AcceptedMsg>> slots_;
};

// Worker: the latest ACCEPTED. Writer: the sidecar (Put); reader: the
// datapath's model (Take).
class AcceptedInbox {
 public:
  void Put(const AcceptedMsg& m) {
    std::lock_guard<std::mutex> lock(mu_);
    msg_ = m;
    have_ = true;
  }
  // The set the server summed of push `round`, once; false until it came.
  bool Take(uint32_t round, Bitmap* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!have_ || msg_.round != round) return false;
    Bitmap b(msg_.num_bits);
    b.AssignWords(msg_.words);
    *out = std::move(b);
    have_ = false;
    return true;
  }

 private:
  std::mutex mu_;
  AcceptedMsg msg_;
  bool have_ = false;
};

}  // namespace dblp
