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

// What a connected worker that stopped answering did: `round_name`
// ("push round 14") made no progress from it for timeout_ms.
std::string SilentHow(std::string_view round_name, uint32_t timeout_ms);

// The ERROR a silent worker gets when the job goes on without it.
std::string DroppedText();

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
// A worker's push that brought nothing: what the server measured says which
// cause. `injected`: frames this server's own loss injector dropped while
// the round waited (> 0 names the injector); else a trainer's pause, or a
// worker that could not send (its own log names why: its mbufs, its
// injector, its link).
std::string PushStalledHint(uint64_t injected);
// The cause a process measured itself, for the text of a failed round
// (empty when it measured none): its mbuf pool ran dry `alloc_failures`
// times (--mbufs), its loss injector dropped `injected` of `considered`
// frames (--loss, --burst_*).
std::string MeasuredCauses(uint64_t alloc_failures, uint64_t injected,
                           uint64_t considered);
// A round that moved and then stopped: the link or the loss.
std::string StalledLinkHint();

}  // namespace dblp
