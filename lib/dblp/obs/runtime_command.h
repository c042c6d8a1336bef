// The arguments of the runtime prompt's commands (src/dpdk/runtime/prompt.h),
// parsed and validated without DPDK: what `set p`, `set policy` and `inject
// burst` accept, and how a --cmdline-file splits into numbered lines. Every
// error names the command and an accepted value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dblp/obs/app_state.h"
#include "dblp/policy/tolerance.h"

namespace dblp {

// A number in [0, 1) (`allow_one`: [0, 1]). False with *error naming
// `what` otherwise.
bool ParseFraction(std::string_view text, const char* what, bool allow_one,
                   double* out, std::string* error);

// `set p <value>`: from the next round on, the fixed policy at <value>.
bool ParseSetP(std::string_view value, RuntimeCommand* out, std::string* error);

// `set policy <kind> [key=value ...]`: kind fixed | dblp | reliable; keys
// p_fixed (fixed; a bare number is p_fixed too), p_low, p_high, clr_freq,
// clr_eta (dblp). Keys not given keep their value in `current` (the
// policy in force, or the flags'). The whole config is validated
// (ValidatePolicyConfig).
bool ParseSetPolicy(std::string_view kind, std::string_view params,
                    const PolicyConfig& current, RuntimeCommand* out,
                    std::string* error);

// `inject burst <loss> <iterations>`: loss in (0, 1], 1..1000000
// iterations.
bool ParseInjectBurst(std::string_view loss, uint64_t iterations,
                      RuntimeCommand* out, std::string* error);

// A command file's lines that hold a command: 1-based line number and the
// text without surrounding blanks; empty lines and lines starting with
// '#' are left out.
struct CommandLine {
  uint32_t number = 0;
  std::string text;
};
std::vector<CommandLine> SplitCommandFile(std::string_view text);

}  // namespace dblp
