// Counter names every app writes the same way, whatever its transport: a
// receive direction's verdicts as <prefix><verdict> (push_accepted,
// bcast_stale_round, ...) and its decode errors as decode_<status>.
// summary.json, telemetry and the tools read these names.
#pragma once

#include <span>
#include <string_view>

#include "dblp/obs/run_report.h"  // NamedCounters
#include "dblp/round/receiver_round.h"

namespace dblp {

// Appends every verdict (and, with `decode`, every decode error) summed
// over `receivers`, by index: one added to the enums is written without a
// change here.
void AddReceiverCounters(std::string_view prefix,
                         std::span<const ReceiverRound* const> receivers,
                         bool decode, NamedCounters* out);

}  // namespace dblp
