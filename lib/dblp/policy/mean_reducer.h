// The server's mean of a push round: per-chunk sums and contribution
// counts, and the fill of what no worker delivered (loss_fill.h's modes).
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dblp/policy/loss_fill.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/float_ops.h"

namespace dblp {

// The server's reduction of one push round from W workers.
//
// Threading contract (the DPDK server shards chunks across RX lcores, each
// lcore owning a disjoint set of seqs):
//  - Accumulate(seq, ...) for a given seq must always come from the same
//    thread during a round (the owner of seq). It writes only that chunk's sum
//    slice and that chunk's count slot. Slices and slots are padded to
//    64-byte cache lines, so owners of neighbouring chunks neither race nor
//    false-share.
//  - contributions(seq) and CoveredChunks() may be called from any thread
//    while the round runs (acquire loads of the count slots; a count seen by
//    a reader implies the matching sum slice update happened before it).
//  - BeginRound() and Finalize() touch every chunk: the caller must make sure
//    no Accumulate is in flight and establish happens-before with the owners
//    (e.g. the round-completion hand-off the control thread already does).
//  - Accumulate must be called at most once per (worker, seq) per round; the
//    caller dedups with the worker's arrival bitmap (Bitmap::Set's return
//    value). A duplicate would be summed twice.
//  - Each (worker, lane) pair has its own tally (a worker's chunks are
//    spread over the lanes): Accumulate(w, seq, ..., lane) must come from
//    the one thread that owns `lane`. tally() reads them between rounds.
//
// Members who lie: every chunk is checked as it arrives (one scan of the
// payload, no second pass over the round). A chunk with a NaN or an
// infinity, or one whose addition would overflow the chunk's sum (3e38 +
// 3e38), is refused: not summed, counted in the worker's tally and in the
// chunk's `refused` count, which the chunk's mean then leaves out of its
// divisor, so the mean of that chunk is over the workers whose copy was
// summed. The unit refused is the chunk, not the worker's whole round:
// chunks summed before a bad one stay in the sum (taking them out again
// would need a per-worker copy of the gradient). With a clip norm X each
// chunk of n_c floats is scaled so its L2 norm is at most
// X * sqrt(n_c / total floats): the whole contribution's norm is then at
// most X, though a gradient concentrated in a few chunks is clipped more
// than a whole-round clip would clip it.
class MeanReducer {
 public:
  // Throws std::invalid_argument if total_bytes is not a multiple of 4 or
  // num_workers is 0. Starts with a clean round (BeginRound not required).
  // `lanes`: the threads that Accumulate (one tally per worker each).
  // `model_floats`: the whole gradient's floats, which the clip norm's
  // per-chunk share divides by (a server shard's layout is one partition
  // of it); 0: the layout's.
  MeanReducer(const ChunkLayout& layout, uint32_t num_workers,
              uint32_t lanes = 1, uint64_t model_floats = 0);

  // What one (worker, lane) contributed this round, reset by BeginRound.
  struct alignas(64) Tally {
    double sum_squares = 0;  // of the floats received, before clipping
    uint32_t nonfinite = 0;  // chunks refused: a NaN or an infinity
    uint32_t overflow = 0;   // chunks refused: the sum would overflow
    uint32_t clipped = 0;    // chunks scaled down by the clip norm
    uint32_t first_bad_seq = UINT32_MAX;  // the first refused chunk
  };

  // Starts a round: zeroes the contribution counts (a chunk's first
  // contribution then overwrites its sum slice). Keeps the previous
  // Finalize output.
  void BeginRound();

  // Worker w's chunk seq (Length(seq) / 4 floats at `payload`, not
  // necessarily aligned), received by lane `lane`: checked, clipped and
  // added into the sum (one contribution), or refused (false: counted in
  // w's tally, not summed). Preconditions: seq < layout().num_chunks(),
  // w < the constructor's num_workers, lane < lanes.
  // Inline: the server runs it once per chunk; what it calls does the work.
  bool Accumulate(uint32_t w, uint32_t seq, const uint8_t* payload,
                  uint32_t lane = 0);
  // Accumulate for each of a burst's `n` chunks in order (a Chunk has
  // members payload, seq, w and bytes, the chunk's length as the receiver
  // checked it: layout().Length(seq); Accumulate's preconditions), received by
  // `lane`, with the per-call lookups done once per burst. With
  // `prefetch_ahead` > 0, each chunk's sum slice is hinted that many
  // chunks before it is summed. Refusals are counted as Accumulate counts
  // them (the server accepts the frame either way).
  template <class Chunk>
  void AccumulateBurst(const Chunk* chunks, uint32_t n, uint32_t lane,
                       uint32_t prefetch_ahead);
  // Per-worker L2 norm bound of a contribution (0 = off). Between rounds.
  // Throws std::invalid_argument on a negative or non-finite value.
  void set_clip_norm(double x);
  double clip_norm() const { return clip_norm_; }
  // Unclipped chunks take the one-pass path (the first contribution's
  // store fused with the sum of squares; no largest-magnitude scan) unless
  // this is false: every chunk then takes the two-pass path, which the
  // tests compare it with bit for bit.
  void set_one_pass(bool on) {
    one_pass_ = on;
    one_pass_now_ = one_pass_ && clip_norm_ == 0;
  }
  // Worker w's tally summed over the lanes (between rounds).
  Tally tally(uint32_t w) const;

  // Writes the round's mean into mean_out (layout().total_bytes() / 4
  // floats, else std::invalid_argument). For chunk c with k contributions
  // and r refused ones, W being num_workers() - r:
  //  kZero:     sum / W              (missing counted as zero: MLT, DBLP)
  //  kRescale:  sum / k, 0 if k == 0 (unbiased rescaling: LTP)
  //  kPrevious: (sum + (W - k) * prev_mean) / W, prev_mean being the previous
  //             Finalize's output, zeros before the first (LTP's bubble
  //             filling applied to the mean).
  // A chunk every worker's copy of which was refused (W == 0) gets 0
  // (kZero, kRescale) or prev_mean (kPrevious).
  // The output is remembered as prev_mean for the next Finalize whatever the
  // mode, so a job can switch modes between rounds (unless keep_previous is
  // off: then kPrevious throws std::logic_error).
  // With `squares` (over mean_out), it is advanced chunk by chunk and
  // finished: the norm's blocks squared while the mean is in the cache.
  void Finalize(FillMode mode, std::span<float> mean_out,
                IncrementalBlockSquares* squares = nullptr);
  // Between rounds. Off: Finalize stops remembering its output (a copy of
  // the whole mean per round) and frees it, for a job that never fills
  // with kPrevious; on again: prev_mean restarts at zeros.
  void set_keep_previous(bool on);

  uint32_t contributions(uint32_t seq) const {
    return counts_[seq].n.load(std::memory_order_acquire);
  }
  uint32_t num_workers() const { return num_workers_; }
  // Between rounds: the number of workers the mean divides by (a job that
  // continues after losing a worker). Throws std::invalid_argument on 0.
  void set_num_workers(uint32_t w);
  const ChunkLayout& layout() const { return layout_; }
  // Chunks with at least one contribution this round.
  uint32_t CoveredChunks() const;
  // The sum slices' memory (for NUMA placement next to the receiving port).
  std::span<const float> sum_storage() const {
    return {sums_.get(), stride_floats_ * layout_.num_chunks()};
  }

 private:
  struct alignas(64) CountSlot {
    std::atomic<uint32_t> n{0};  // writer: owner lcore of the seq; readers: any
    // Owner only (Finalize reads them after the round's hand-off).
    uint32_t refused = 0;  // copies refused (non-finite, overflow)
    // A bound on the sum's largest magnitude; after a one-pass first
    // copy, minus that copy's sum of squares (sign bit set, even for
    // -0.0), whose root is taken only if a second copy comes (SumBound).
    double max_abs = 0;
  };
  // The bound a copy whose squares sum to `squares` adds to any float of
  // the sum: its L2 norm, with slack for the squares' rounding and
  // underflow.
  static double NormBound(double squares) {
    return std::sqrt(squares) * (1 + 1e-5) + 1e-18;
  }
  // slot.max_abs as a bound (before a second copy is added).
  static double SumBound(const CountSlot& slot) {
    return std::signbit(slot.max_abs) ? NormBound(-slot.max_abs) : slot.max_abs;
  }
  struct AlignedFree {
    void operator()(float* p) const;
  };

  float* SumOf(uint32_t seq) {
    return sums_.get() + static_cast<size_t>(seq) * stride_floats_;
  }
  const float* SumOf(uint32_t seq) const {
    return sums_.get() + static_cast<size_t>(seq) * stride_floats_;
  }

  // Hints the caches to fetch a chunk's sum slice (`stride_floats` from
  // `sum`) and count slot, for the chunks a burst sums next while it adds
  // one. Every other line: the L2's adjacent-line prefetcher completes
  // each 128-byte pair, at half the instructions of a prefetch per line.
  // In turns of 12 pairs, one turn for a slice at MTU 1500 (23 lines):
  // the last turn may hint up to eleven pairs past the slice (hints never
  // fault; the addresses are integers until each hint).
  static void PrefetchSliceAt(const float* sum, size_t stride_floats,
                              const CountSlot* slot) {
    uintptr_t p = reinterpret_cast<uintptr_t>(sum);
    const uintptr_t end = p + stride_floats * sizeof(float);
    const auto hint = [](uintptr_t at) {
      __builtin_prefetch(reinterpret_cast<const void*>(at), 1, 3);
    };
    // A slice is at least a line: the first turn needs no test.
    do {
      hint(p);
      hint(p + 128);
      hint(p + 256);
      hint(p + 384);
      hint(p + 512);
      hint(p + 640);
      hint(p + 768);
      hint(p + 896);
      hint(p + 1024);
      hint(p + 1152);
      hint(p + 1280);
      hint(p + 1408);
      // GCC (-ffinite-loops) deletes a loop that only prefetches: this
      // function compiled to nothing until the empty asm, an effect it
      // keeps, was added.
      asm volatile("");
      p += 12 * 128;
    } while (p < end);
    __builtin_prefetch(slot, 1, 3);
  }
  // `sum(chunk, its count slot, its sum slice)` for each of a burst's
  // chunks in order, each slice hinted `ahead` chunks before it.
  template <class Chunk, class Sum>
  void EachPrefetched(const Chunk* chunks, uint32_t n, uint32_t ahead, Sum sum);
  // Accumulate's unclipped path (one_pass_now_): the chunk's first
  // contribution stored in the pass that sums its squares, a later one
  // added after that pass; anything the squares cannot vouch for goes to
  // AccumulateScanned. `t`: worker w's tally for the calling lane;
  // `slot`, `sum`: chunk seq's.
  [[gnu::always_inline]] bool AccumulateOnePass(Tally& t, CountSlot& slot,
                                                float* sum, uint32_t seq,
                                                const uint8_t* payload,
                                                size_t floats);
  bool Refuse(CountSlot& slot, Tally& t, uint32_t seq, bool overflow);
  // Accumulate's two passes: ScanFloats (largest magnitude and sum of
  // squares), then the store or add, clipped if need be. The path of a
  // clipped job and of any chunk the one-pass path cannot vouch for.
  bool AccumulateScanned(CountSlot& slot, Tally& t, uint32_t seq,
                         const uint8_t* payload, size_t floats);

  ChunkLayout layout_;
  uint32_t num_workers_;
  uint32_t lanes_;
  double clip_norm_ = 0;
  bool one_pass_ = true;
  bool one_pass_now_ = true;    // one_pass_ and no clip: one flag per chunk
  uint64_t clip_floats_;        // the clip share's denominator (model_floats)
  uint32_t tally_workers_;      // the constructor's num_workers
  std::vector<Tally> tallies_;  // [lane * tally_workers_ + worker]
  // Floats between the starts of consecutive chunks' sum slices: the chunk's
  // float count rounded up to a cache line, so slices never share a line.
  size_t stride_floats_;
  std::unique_ptr<float[], AlignedFree> sums_;  // writer: owner of each slice
  std::vector<CountSlot> counts_;               // one padded slot per chunk
  std::vector<float> prev_mean_;  // control thread only; empty if not kept
  bool keep_previous_ = true;
};

inline bool MeanReducer::Accumulate(uint32_t w, uint32_t seq,
                                    const uint8_t* payload, uint32_t lane) {
  assert(seq < layout_.num_chunks());
  assert(w < tally_workers_ && lane < lanes_);
  Tally& t = tallies_.data()[static_cast<size_t>(lane) * tally_workers_ + w];
  // A clip scales by the chunk's norm, which must be known first.
  if (!one_pass_now_) [[unlikely]] {
    return AccumulateScanned(counts_.data()[seq], t, seq, payload,
                             layout_.Length(seq) / sizeof(float));
  }
  return AccumulateOnePass(t, counts_.data()[seq], SumOf(seq), seq, payload,
                           layout_.Length(seq) / sizeof(float));
}

template <class Chunk>
void MeanReducer::AccumulateBurst(const Chunk* chunks, uint32_t n,
                                  uint32_t lane, uint32_t prefetch_ahead) {
  assert(lane < lanes_);
  if (!one_pass_now_) [[unlikely]] {  // a clipped job
    EachPrefetched(chunks, n, prefetch_ahead,
                   [&](const Chunk& c, CountSlot&, float*) {
                     Accumulate(c.w, c.seq, c.payload, lane);
                   });
    return;
  }
  Tally* const tallies =
      tallies_.data() + static_cast<size_t>(lane) * tally_workers_;
  EachPrefetched(chunks, n, prefetch_ahead,
                 [&](const Chunk& c, CountSlot& slot, float* sum) {
                   AccumulateOnePass(tallies[c.w], slot, sum, c.seq, c.payload,
                                     c.bytes / sizeof(float));
                 });
}

template <class Chunk, class Sum>
[[gnu::always_inline]] inline void MeanReducer::EachPrefetched(
    const Chunk* chunks, uint32_t n, uint32_t ahead, Sum sum) {
  // In locals: the float pass is a call, after which members reload.
  CountSlot* const counts = counts_.data();
  float* const sums = sums_.get();
  const size_t stride = stride_floats_;
  const uint32_t warm = std::min(n, ahead);
  for (uint32_t k = 0; k < warm; ++k) {
    const uint32_t seq = chunks[k].seq;
    PrefetchSliceAt(sums + seq * stride, stride, counts + seq);
  }
  // Chunks before this one hint the slice `warm` chunks on.
  const Chunk* const end = chunks + n;
  const Chunk* const ahead_end = warm != 0 ? end - warm : chunks;
  for (const Chunk* c = chunks; c != end; ++c) {
    if (c < ahead_end) {
      const uint32_t next = c[warm].seq;
      PrefetchSliceAt(sums + next * stride, stride, counts + next);
    }
    sum(*c, counts[c->seq], sums + c->seq * stride);
  }
}

[[gnu::always_inline]] inline bool MeanReducer::AccumulateOnePass(
    Tally& t, CountSlot& slot, float* sum, uint32_t seq, const uint8_t* payload,
    size_t floats) {
  std::atomic<uint32_t>& n = slot.n;
  const uint32_t k = n.load(std::memory_order_relaxed);
  // The first contribution is stored in the pass that sums its squares
  // (a refused one leaves the count at 0, so the slice is never read).
  const double squares = k == 0 ? StoreFloatsSumSquares(sum, payload, floats)
                                : SumSquaresFloats(payload, floats);
  // Non-finite: a NaN or an infinity, or squares whose float sum passed
  // float's range (above 3.4e38: floats near 1e19, or many near 1e18):
  // the two-pass path refuses the chunk, or sums it with ScanFloats'
  // squares redone in double.
  if (!std::isfinite(squares)) [[unlikely]] {
    return AccumulateScanned(slot, t, seq, payload, floats);
  }
  // The same bits as ScanFloats' sum of squares, its root a bound on every
  // float.
  t.sum_squares += squares;
  if (k == 0) {
    slot.max_abs = -squares;  // rooted if a second copy comes
  } else {
    const double have = SumBound(slot);
    const double add_max = NormBound(squares);
    if (have + add_max >= FLT_MAX &&
        !SumStaysFinite(sum, payload, floats, 1.0f)) [[unlikely]] {
      return Refuse(slot, t, seq, true);
    }
    AddFloats(sum, payload, floats);
    slot.max_abs = std::min(have + add_max, double{FLT_MAX});
  }
  assert(k < num_workers_ && "more contributions than workers: duplicate?");
  n.store(k + 1, std::memory_order_release);
  return true;
}

}  // namespace dblp
