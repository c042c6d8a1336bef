// The `combined` tolerance policy: phase-aware and network-adaptive.
//
// Inside a critical learning regime (the CLR detector, exactly as dblp
// feeds it) every round is strict: p = p_low and no deadline, so the
// gradients that matter most are neither dropped beyond MLT's p nor cut
// short by a burst. Outside one, p = p_high plus ltp's early close: a
// deadline of ltp_deadline_factor times the median of the last ltp_window
// measured round times (ltp_initial_deadline_ns before any), closing a
// round once ltp_min_fraction of its chunks arrived. `critical` is set as
// dblp sets it.
//
// Every measured round feeds the deadline's window, the strict ones too:
// they ran to completion, so they tell what the network needs right now.
#pragma once

#include <memory>

#include "dblp/policy/tolerance.h"

namespace dblp {

// Expects a config ValidatePolicyConfig accepted (TolerancePolicy::Create).
std::unique_ptr<TolerancePolicy> MakeCombinedPolicy(const PolicyConfig& c);

}  // namespace dblp
