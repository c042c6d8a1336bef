// The `deadline` tolerance policy: bounded time, in the style of
// OptiReduce's adaptive timeout (Warraich et al., NSDI'25).
//
// p = 0, but every round has a deadline: deadline_factor times the
// deadline_percentile-th percentile (nearest rank) of the last
// deadline_window measured round times (deadline_initial_ns before any).
// At the deadline the receiver closes the round once deadline_min_fraction
// of its chunks arrived.
//
// How it differs from ltp: ltp sets a margin (1.5x) over the *median* and
// keeps a high floor (half the chunks), so it trims only the rounds a burst
// stretches well past the usual, and never loses much (bounded loss).
// deadline sits at the tail of the usual (the 95th percentile, no margin)
// with a small floor, so a slow round ends about when a usual slow round
// would, whatever it lost (bounded time).
//
// OptiReduce's released transport (its Gloo patch) agrees on the timeout
// from each rank's estimate of a full round (time taken / fraction
// received), under a fixed cap. The policy here sees only each round's
// time, and a round its deadline closed counts with about the deadline: a
// lasting slowdown of the network then keeps the deadline where it was
// (time stays bounded, loss grows up to the floor) unless the factor is
// above 1 or the floor holds rounds open longer.
#pragma once

#include <memory>

#include "dblp/policy/tolerance.h"

namespace dblp {

// Expects a config ValidatePolicyConfig accepted (TolerancePolicy::Create).
std::unique_ptr<TolerancePolicy> MakeDeadlinePolicy(const PolicyConfig& c);

}  // namespace dblp
