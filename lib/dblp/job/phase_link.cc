#include "dblp/job/phase_link.h"

#include <algorithm>
#include <stdexcept>

#include "dblp/wire/float_ops.h"

namespace dblp {

std::string ServerShardLabel(uint32_t k) {
  return "server shard " + std::to_string(k);
}

uint32_t PartitionNormBlocks(uint32_t chunks) {
  return static_cast<uint32_t>(NormBlocks(chunks, kNormBlockChunks));
}

PhaseLeader::PhaseLeader(std::unique_ptr<TolerancePolicy> policy,
                         uint32_t resync_every, std::vector<uint32_t> blocks)
    : policy_(std::move(policy)),
      resync_(resync_every),
      blocks_(std::move(blocks)),
      have_(blocks_.size(), false) {
  if (blocks_.empty() || policy_ == nullptr) {
    throw std::invalid_argument("a phase needs a policy and a shard");
  }
  size_t total = 0;
  for (uint32_t b : blocks_) {
    offset_.push_back(total);
    total += b;
  }
  squares_.assign(total, 0.0);
}

std::string PhaseLeader::Add(uint32_t k, uint64_t it, bool resync,
                             std::span<const double> squares,
                             uint64_t push_ns) {
  if (k >= blocks_.size()) {
    return "a partial from " + ServerShardLabel(k) + " of a job of " +
           std::to_string(blocks_.size()) + " server shards";
  }
  const std::string who = ServerShardLabel(k);
  if (it != it_) {
    return who + " sent its partial of iteration " + std::to_string(it) +
           " while the phase gathers iteration " + std::to_string(it_);
  }
  if (have_[k]) {
    return who + " sent a second partial of iteration " + std::to_string(it);
  }
  if (squares.size() != blocks_[k]) {
    return who + " sent " + std::to_string(squares.size()) +
           " norm blocks, its partition has " + std::to_string(blocks_[k]);
  }
  if (reported_ > 0 && resync != resync_flag_) {
    return who + (resync ? " resyncs" : " does not resync") + " in iteration " +
           std::to_string(it) + ", unlike the shards before it";
  }
  std::copy(squares.begin(), squares.end(), squares_.begin() + offset_[k]);
  have_[k] = true;
  ++reported_;
  resync_flag_ = resync;
  push_ns_ = std::max(push_ns_, push_ns);
  return "";
}

PhaseDecision PhaseLeader::Decide() {
  PhaseDecision d;
  if (!complete()) {
    d.failure = Missing(0);
    return d;
  }
  // The blocks in shard order are the whole gradient's in chunk order.
  d.norm = NormOfBlockSquares(squares_);
  if (!resync_flag_) {
    policy_->OnIterationEnd(resync_.TrainStep(it_), d.norm, push_ns_);
  }
  d.next = policy_->Current();
  std::fill(have_.begin(), have_.end(), false);
  reported_ = 0;
  push_ns_ = 0;
  ++it_;
  return d;
}

std::string PhaseLeader::Missing(uint32_t timeout_ms) const {
  std::string who;
  uint32_t n = 0;
  for (uint32_t k = 0; k < have_.size(); ++k) {
    if (have_[k]) continue;
    who += (n++ ? ", " : "") + std::to_string(k);
  }
  if (n == 0) return "";
  return std::string(n == 1 ? "server shard " : "server shards ") + who +
         " sent no partial of iteration " + std::to_string(it_) +
         (timeout_ms ? " within " + std::to_string(timeout_ms) + " ms" : "") +
         ": is it running? (check its log; --round_timeout_ms bounds the "
         "wait)";
}

class InProcessPhase::Link : public PhaseLink {
 public:
  Link(InProcessPhase* phase, uint32_t k) : phase_(phase), k_(k) {}
  PhaseDecision Decide(uint64_t it, bool resync,
                       std::span<const double> squares,
                       uint64_t push_ns) override {
    return phase_->Decide(k_, it, resync, squares, push_ns);
  }

 private:
  InProcessPhase* phase_;
  uint32_t k_;
};

InProcessPhase::InProcessPhase(std::unique_ptr<TolerancePolicy> policy,
                               uint32_t resync_every,
                               std::vector<uint32_t> blocks,
                               std::chrono::milliseconds timeout)
    : leader_(std::move(policy), resync_every, std::move(blocks)),
      timeout_(timeout) {
  for (uint32_t k = 0; k < leader_.shards(); ++k) {
    links_.push_back(std::make_unique<Link>(this, k));
  }
}

InProcessPhase::~InProcessPhase() = default;

PhaseLink& InProcessPhase::link(uint32_t k) { return *links_.at(k); }

PhaseDecision InProcessPhase::Decide(uint32_t k, uint64_t it, bool resync,
                                     std::span<const double> squares,
                                     uint64_t push_ns) {
  std::unique_lock lock(mu_);
  if (failure_.empty()) {
    failure_ = leader_.Add(k, it, resync, squares, push_ns);
  }
  if (failure_.empty() && leader_.complete()) {
    decision_ = leader_.Decide();
    decided_ = it;
    cv_.notify_all();
  }
  const bool done = cv_.wait_for(
      lock, timeout_, [&] { return !failure_.empty() || decided_ == it; });
  if (!done && failure_.empty()) {
    failure_ = leader_.Missing(static_cast<uint32_t>(timeout_.count()));
    cv_.notify_all();
  }
  if (failure_.empty()) return decision_;
  PhaseDecision failed;
  failed.failure = failure_;
  return failed;
}

}  // namespace dblp
