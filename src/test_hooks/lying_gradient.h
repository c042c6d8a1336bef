// Test hook of every worker (--lying_gradient), outside the production
// job: the member who lies of issue #21. From a given iteration on, the
// worker of one rank pushes a gradient that is all NaN, all +Inf, all 3e38
// or its own times a factor, so the tests can check that the server names
// it (--on_bad_gradient=abort) or keeps the others' mean finite and exact
// (drop, --clip_norm).
#pragma once

#include <memory>
#include <string>

#include "dblp/handoff/gradient_source.h"

namespace dblp {

// `spec` is KIND:RANK[:FROM], KIND one of nan, inf, huge (3e38) or
// scale=F; FROM the first iteration that lies (default 0). Returns
// `inner` itself when `spec` is empty. Throws std::invalid_argument
// naming the form on anything else.
std::unique_ptr<GradientSource> LyingGradient(
    const std::string& spec, std::unique_ptr<GradientSource> inner);

}  // namespace dblp
