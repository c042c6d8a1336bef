// Why a job ended, said the same way by every server (dblp-server over
// DPDK, dblp-udp-server over kernel UDP): each text names the worker and
// the fix, with flags that exist.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dblp {

// "worker 1 (rank1)".
std::string WorkerLabel(uint32_t rank, std::string_view name);

// What a worker that said BYE while the others still push did.
std::string FinishedEarlyHow(uint64_t iterations);

// A worker lost under --on_worker_loss=abort: `how` it went ("disconnected",
// "failed (why)", FinishedEarlyHow's) in iteration `it`, and the two fixes.
std::string WorkerLostText(uint32_t rank, std::string_view name,
                           std::string_view how, uint64_t it);

// Worker `rank` sent chunks the server refused in iteration `it`: with a
// NaN or an infinity (`nonfinite`), or that would overflow the sum
// (`overflow`); the first one's seq, and the fixes.
std::string BadGradientText(uint32_t rank, std::string_view name, uint64_t it,
                            uint32_t nonfinite, uint32_t overflow,
                            uint32_t first_seq);

// A round without progress for timeout_ms: its name, and for a push what
// each worker delivered, plus the hint about a trainer's pause.
std::string NoProgressText(std::string_view round_name, uint32_t timeout_ms);
std::string PushStalledHint();
// A round that moved and then stopped: the link or the loss.
std::string StalledLinkHint();

}  // namespace dblp
