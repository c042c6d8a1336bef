#include "dblp/job/diagnosis.h"

namespace dblp {

std::string WorkerLabel(uint32_t rank, std::string_view name) {
  return "worker " + std::to_string(rank) + " (" + std::string(name) + ")";
}

// (Workers that all finish say BYE within a few messages of each other and
// push nothing more: only one that leaves while another pushes ran fewer.)
std::string FinishedEarlyHow(uint64_t iterations) {
  return "finished after " + std::to_string(iterations) +
         " iterations while the others go on (run every worker with the "
         "same --iterations; PyTorch: every trainer the same number of "
         "steps before close())";
}

std::string SilentHow(std::string_view round_name, uint32_t timeout_ms) {
  return "went silent: " + std::string(round_name) +
         " waited for it without progress for " + std::to_string(timeout_ms) +
         " ms while the others were done";
}

std::string DroppedText() {
  return "the job went on without this worker (--on_worker_loss=continue): "
         "a round waited for it without progress for --round_timeout_ms while "
         "the others were done (a stopped or overloaded process, or its "
         "link); it is out of this job";
}

std::string WorkerLostText(uint32_t rank, std::string_view name,
                           std::string_view how, uint64_t it) {
  return WorkerLabel(rank, name) + " " + std::string(how) + " in iteration " +
         std::to_string(it) +
         "; restart the job, or run the server with "
         "--on_worker_loss=continue to carry on without it";
}

std::string BadGradientText(uint32_t rank, std::string_view name, uint64_t it,
                            uint32_t nonfinite, uint32_t overflow,
                            uint32_t first_seq) {
  std::string s = WorkerLabel(rank, name) +
                  " sent a bad gradient in iteration " + std::to_string(it) +
                  ": ";
  if (nonfinite > 0) {
    s += std::to_string(nonfinite) + " chunk(s) with NaN or infinite floats";
  }
  if (overflow > 0) {
    s += std::string(nonfinite > 0 ? ", " : "") + std::to_string(overflow) +
         " chunk(s) whose sum would overflow float32";
  }
  return s + " (first chunk " + std::to_string(first_seq) +
         "), refused; check its trainer (a diverged loss, a bad learning "
         "rate), or run the server with --on_bad_gradient=drop to leave "
         "such chunks out of the mean and go on, and --clip_norm=X to bound "
         "what each worker adds";
}

std::string NoProgressText(std::string_view round_name, uint32_t timeout_ms) {
  return std::string(round_name) + " made no progress for " +
         std::to_string(timeout_ms) + " ms";
}

std::string StalledLinkHint() {
  return " (frames stopped arriving or stopped adding anything new: check "
         "the link and --loss on both ends, or raise --round_timeout_ms)";
}

std::string PushStalledHint(uint64_t injected) {
  if (injected > 0) {
    return " (this server's loss injector dropped " + std::to_string(injected) +
           " frames while the round waited: --loss and --burst_iters / "
           "--burst_random make it drop; lower them, or raise "
           "--round_timeout_ms)";
  }
  return " (nothing from a worker arrived: its trainer may be pausing between "
         "steps, e.g. an evaluation, which needs a larger --round_timeout_ms; "
         "or the worker could not send, and its own log says why: its mbuf "
         "pool (--mbufs), its --loss, its link)";
}

std::string MeasuredCauses(uint64_t alloc_failures, uint64_t injected,
                           uint64_t considered) {
  std::string s;
  if (alloc_failures > 0) {
    s += "; this process's mbuf pool ran dry " +
         std::to_string(alloc_failures) +
         " times, which stalls rounds: give it more mbufs (--mbufs, or "
         "--mbufs=0 to size it from its ports and queues)";
  }
  if (injected > 0) {
    s += "; this process's loss injector dropped " + std::to_string(injected) +
         " of the " + std::to_string(considered) +
         " frames it received (--loss, --burst_iters / --burst_random)";
  }
  return s;
}

}  // namespace dblp
