#include "dblp/obs/records.h"

#include "dblp/obs/json_writer.h"
#include "dblp/obs/number_text.h"

namespace dblp {

using text::WriteCsvDouble;
using text::WriteInteger;

// --- Row writers ------------------------------------------------------------

void WriteCsv(std::ostream& os, std::span<const IterationRecord> rows) {
  os << kIterationCsvHeader << '\n';
  for (const IterationRecord& r : rows) {
    WriteInteger(os, r.iteration);
    os << ',';
    WriteInteger(os, r.rank);
    os << ',';
    WriteCsvDouble(os, r.send_latency_us);
    os << ',';
    WriteCsvDouble(os, r.bcast_latency_us);
    os << ',';
    WriteInteger(os, r.passes);
    os << ',';
    WriteInteger(os, r.bcast_passes);
    os << ',';
    WriteInteger(os, r.packets_sent);
    os << ',';
    WriteInteger(os, r.packets_resent);
    os << ',';
    WriteCsvDouble(os, r.delivered_fraction);
    os << ',';
    WriteCsvDouble(os, r.p);
    os << ',' << (r.critical ? '1' : '0') << ',';
    WriteCsvDouble(os, r.grad_norm);
    os << ',' << (r.burst ? '1' : '0') << ',';
    WriteCsvDouble(os, r.control_rtt_us);
    os << ',' << (r.resync ? '1' : '0') << ',';
    WriteCsvDouble(os, r.worker_norm);
    os << ',';
    WriteInteger(os, r.bad_chunks);
    os << ',';
    WriteInteger(os, r.clipped_chunks);
    os << ',';
    WriteInteger(os, r.clr_nonfinite);
    os << '\n';
  }
}

void WriteJsonl(std::ostream& os, std::span<const IterationRecord> rows) {
  for (const IterationRecord& r : rows) {
    // A fresh writer per line: each line is its own top-level value.
    JsonWriter w(os);
    // One key/value pair per line reads like the schema.
    // clang-format off
    w.BeginObject()
        .Key("iteration").Uint(r.iteration)
        .Key("rank").Uint(r.rank)
        .Key("send_latency_us").Double(r.send_latency_us)
        .Key("bcast_latency_us").Double(r.bcast_latency_us)
        .Key("passes").Uint(r.passes)
        .Key("bcast_passes").Uint(r.bcast_passes)
        .Key("packets_sent").Uint(r.packets_sent)
        .Key("packets_resent").Uint(r.packets_resent)
        .Key("delivered_fraction").Double(r.delivered_fraction)
        .Key("p").Double(r.p)
        .Key("critical").Bool(r.critical)
        .Key("grad_norm").Double(r.grad_norm)
        .Key("burst").Bool(r.burst)
        .Key("control_rtt_us").Double(r.control_rtt_us)
        .Key("resync").Bool(r.resync)
        .Key("worker_norm").Double(r.worker_norm)
        .Key("bad_chunks").Uint(r.bad_chunks)
        .Key("clipped_chunks").Uint(r.clipped_chunks)
        .Key("clr_nonfinite").Uint(r.clr_nonfinite)
        .EndObject();
    // clang-format on
    os << '\n';
  }
}

}  // namespace dblp
