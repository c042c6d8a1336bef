// Analytic model of one round, printed as "expected" next to measured round
// times, plus a Monte-Carlo simulation of the same round to validate it.
//
// Model. The receiver STOPs once it holds StopThreshold(n, p) chunks, i.e. it
// tolerates a = n - StopThreshold(n, p) missing chunks (a = floor(p n); the
// integer is used, not p n, so the model matches what the receiver does).
// Every data packet is lost independently with probability L (the loss
// rate). Pass k sends the M_k = L^(k-1) n chunks still missing before it.
//   * a >= 1 (bounded loss): the round needs the smallest k with
//     L^k n <= a (DESIGN.md's L^k <= p). The last pass is cut short by STOP:
//     it sends (M_k - a) / (1 - L) packets, so the round sends
//     (n - a) / (1 - L) packets in total.
//   * a == 0 (p == 0, or p n < 1: every chunk is needed): L^k n <= 0 never
//     holds, so the round needs the smallest k with L^k n < 0.5 (fewer than
//     half a chunk expected missing after pass k). Packets: n / (1 - L).
// Both packet counts are exact expectations, not approximations: each send
// arrives with probability 1 - L whichever chunk it carries, and the round
// ends at the (n - a)-th arrival (for a == 0 the final pass is the one in
// which every remaining chunk arrives, so its last send is that arrival).
// The pass count is the typical value; the mean pass count of a simulation
// is close to it, not equal.
//
// DESIGN.md figures, n = 1000, L = 0.7:
//   p = 0.008: 14 passes, 3.307 n packets.  p = 0.408: 3 passes, 1.973 n.
#pragma once

#include <cstdint>

namespace dblp {

struct PassEstimate {
  uint32_t passes = 0;        // passes started (the first one included)
  double packets = 0;         // data packets sent in the round
  double packets_over_n = 0;  // packets / n (0 when n == 0)
};

// Expected passes and packets for one round of `n` chunks at loss rate
// `loss` with tolerance `p`. n == 0: all zeros. loss == 0: one pass of
// StopThreshold(n, p) packets. Throws std::invalid_argument unless loss and p
// are finite in [0, 1), or if the round would need more than 2^32 - 1
// passes (loss extremely close to 1).
PassEstimate ExpectedPasses(uint32_t n, double loss, double p);

// Expected round time (ns) for a sender that transmits one data packet every
// `per_packet_ns` and a control channel with round-trip `control_rtt_ns`:
//   packets * per_packet_ns                   transmit time
//   + (passes - 1) * control_rtt_ns           one PROBE -> BITMAP exchange
//                                             between consecutive passes
//   + control_rtt_ns / 2                      the STOP travelling back
// Packets still in flight when STOP arrives and receiver processing are not
// modelled. 0 when passes == 0 (an empty round). Throws
// std::invalid_argument unless both times are finite and >= 0.
double ExpectedRoundTimeNs(const PassEstimate& estimate, double per_packet_ns,
                           double control_rtt_ns);

// One simulated round: each send is lost with probability `loss` (dblp::Rng
// seeded with `seed`, so a seed reproduces the round); pass k re-sends every
// chunk still missing at its start; the receiver STOPs the moment it holds
// StopThreshold(n, p) chunks, even mid-pass, and the STOPping packet is the
// last one counted. Same argument checks as ExpectedPasses.
PassEstimate SimulatePasses(uint32_t n, double loss, double p, uint64_t seed);

}  // namespace dblp
