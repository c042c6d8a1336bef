#include "dblp/emul/loss_model.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <system_error>

namespace dblp {
namespace {

constexpr const char* kLossSyntax =
    "expected \"none\", \"bernoulli:<p>\" or "
    "\"ge:<p_good_to_bad>,<p_bad_to_good>,<loss_good>,<loss_bad>\" with "
    "probabilities in [0, 1] and p_bad_to_good > 0";

[[noreturn]] void BadSpec(std::string_view text, const std::string& why) {
  throw std::invalid_argument("invalid loss spec \"" + std::string(text) +
                              "\": " + why + "; " + kLossSyntax);
}

bool IsProbability(double v) { return std::isfinite(v) && v >= 0 && v <= 1; }

// Parses the whole of `field` as a probability, or throws naming `what`.
double ParseProbability(std::string_view text, std::string_view field,
                        const char* what) {
  double v = 0;
  const char* begin = field.data();
  const char* end = begin + field.size();
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  if (field.empty() || ec != std::errc() || ptr != end) {
    BadSpec(text, std::string(what) + " \"" + std::string(field) +
                      "\" is not a number");
  }
  if (!IsProbability(v)) {
    BadSpec(text, std::string(what) + " \"" + std::string(field) +
                      "\" is not in [0, 1]");
  }
  return v;
}

void ValidateSpec(const LossSpec& spec) {
  switch (spec.kind) {
    case LossKind::kNone:
      return;
    case LossKind::kBernoulli:
      if (!IsProbability(spec.p)) {
        throw std::invalid_argument("bernoulli loss p must be in [0, 1]");
      }
      return;
    case LossKind::kGilbertElliott:
      if (!IsProbability(spec.ge_good_to_bad) ||
          !IsProbability(spec.ge_bad_to_good) ||
          !IsProbability(spec.ge_loss_good) ||
          !IsProbability(spec.ge_loss_bad) || spec.ge_bad_to_good <= 0) {
        throw std::invalid_argument(
            "Gilbert-Elliott probabilities must be in [0, 1] and "
            "p_bad_to_good > 0");
      }
      return;
  }
  throw std::invalid_argument("unknown loss kind");
}

void ValidateBurstLoss(double burst_loss) {
  if (!IsProbability(burst_loss)) {
    throw std::invalid_argument("burst loss " + std::to_string(burst_loss) +
                                " must be a probability in [0, 1]");
  }
}

void AppendNumber(std::string& out, double v) {
  char buf[32];
  // Shortest representation that parses back to the same double.
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, ptr);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// Uniform in [0, max] (inclusive), unbiased: rejection on the smallest
// all-ones mask covering max. Rng::NextBelow is only 32-bit, and iteration
// numbers need not be.
uint64_t UniformInclusive(Rng& rng, uint64_t max) {
  if (max == std::numeric_limits<uint64_t>::max()) return rng.Next();
  const uint64_t mask =
      max == 0 ? 0 : (~0ull >> std::countl_zero(max));  // >= max, < 2*max+1
  for (;;) {
    const uint64_t v = rng.Next() & mask;
    if (v <= max) return v;
  }
}

}  // namespace

LossSpec ParseLossSpec(std::string_view text) {
  LossSpec spec;
  if (text == "none") return spec;
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) BadSpec(text, "unknown model");
  const std::string_view kind = text.substr(0, colon);
  const std::string_view args = text.substr(colon + 1);
  if (kind == "bernoulli") {
    spec.kind = LossKind::kBernoulli;
    spec.p = ParseProbability(text, args, "p");
    return spec;
  }
  if (kind == "ge") {
    std::string_view fields[4];
    std::string_view rest = args;
    for (int i = 0; i < 4; ++i) {
      const size_t comma = rest.find(',');
      if ((i < 3) != (comma != std::string_view::npos)) {
        BadSpec(text, "ge needs exactly 4 comma-separated values");
      }
      fields[i] = rest.substr(0, comma);
      if (i < 3) rest = rest.substr(comma + 1);
    }
    spec.kind = LossKind::kGilbertElliott;
    spec.ge_good_to_bad = ParseProbability(text, fields[0], "p_good_to_bad");
    spec.ge_bad_to_good = ParseProbability(text, fields[1], "p_bad_to_good");
    spec.ge_loss_good = ParseProbability(text, fields[2], "loss_good");
    spec.ge_loss_bad = ParseProbability(text, fields[3], "loss_bad");
    if (spec.ge_bad_to_good <= 0) {
      BadSpec(text, "p_bad_to_good must be > 0 or the bad state never ends");
    }
    return spec;
  }
  BadSpec(text, "unknown model \"" + std::string(kind) + "\"");
}

std::string FormatLossSpec(const LossSpec& spec) {
  std::string out;
  switch (spec.kind) {
    case LossKind::kNone:
      return "none";
    case LossKind::kBernoulli:
      out = "bernoulli:";
      AppendNumber(out, spec.p);
      return out;
    case LossKind::kGilbertElliott:
      out = "ge:";
      AppendNumber(out, spec.ge_good_to_bad);
      out += ',';
      AppendNumber(out, spec.ge_bad_to_good);
      out += ',';
      AppendNumber(out, spec.ge_loss_good);
      out += ',';
      AppendNumber(out, spec.ge_loss_bad);
      return out;
  }
  return "invalid";
}

double MeanLossRate(const LossSpec& spec) {
  switch (spec.kind) {
    case LossKind::kNone:
      return 0;
    case LossKind::kBernoulli:
      return spec.p;
    case LossKind::kGilbertElliott: {
      const double flow = spec.ge_good_to_bad + spec.ge_bad_to_good;
      // flow > 0 for any valid spec (p_bad_to_good > 0); guard anyway so a
      // hand-built spec cannot produce NaN.
      const double pi_bad = flow > 0 ? spec.ge_good_to_bad / flow : 0;
      return pi_bad * spec.ge_loss_bad + (1 - pi_bad) * spec.ge_loss_good;
    }
  }
  return 0;
}

bool BurstSchedule::Contains(uint64_t iteration) const {
  return std::binary_search(iterations.begin(), iterations.end(), iteration);
}

BurstSchedule ParseBurstIterations(std::string_view csv, double burst_loss) {
  ValidateBurstLoss(burst_loss);
  BurstSchedule out;
  out.burst_loss = burst_loss;
  if (Trim(csv).empty()) return out;
  std::string_view rest = csv;
  for (;;) {
    const size_t comma = rest.find(',');
    const std::string_view field = Trim(rest.substr(0, comma));
    uint64_t v = 0;
    const char* end = field.data() + field.size();
    const auto [ptr, ec] = std::from_chars(field.data(), end, v);
    if (field.empty() || ec != std::errc() || ptr != end) {
      throw std::invalid_argument(
          "invalid burst iteration \"" + std::string(field) + "\" in \"" +
          std::string(csv) +
          "\": expected comma-separated iteration numbers, e.g. \"279,651\"");
    }
    out.iterations.push_back(v);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  std::sort(out.iterations.begin(), out.iterations.end());
  out.iterations.erase(
      std::unique(out.iterations.begin(), out.iterations.end()),
      out.iterations.end());
  return out;
}

BurstSchedule RandomBurstIterations(uint32_t count, uint64_t first,
                                    uint64_t last, uint64_t seed,
                                    double burst_loss) {
  ValidateBurstLoss(burst_loss);
  if (first > last) {
    throw std::invalid_argument("burst range [" + std::to_string(first) + ", " +
                                std::to_string(last) + "] is empty");
  }
  const uint64_t span = last - first;  // range size - 1, cannot overflow
  if (count > 0 && count - 1 > span) {
    throw std::invalid_argument("cannot pick " + std::to_string(count) +
                                " distinct burst iterations from [" +
                                std::to_string(first) + ", " +
                                std::to_string(last) + "]");
  }
  BurstSchedule out;
  out.burst_loss = burst_loss;
  // Floyd's algorithm: exactly `count` draws, uniform over all subsets, and
  // no O(range) memory (the range may be a whole training run).
  Rng rng(HashMix(seed, 0x6275727374ull));  // "burst": independent stream
  std::set<uint64_t> picked;
  if (count > 0) {
    for (uint64_t j = span - (count - 1);; ++j) {
      const uint64_t t = UniformInclusive(rng, j);
      if (!picked.insert(t).second) picked.insert(j);
      if (j == span) break;  // j may be UINT64_MAX: no `j <= span` loop test
    }
  }
  out.iterations.reserve(picked.size());
  for (const uint64_t v : picked) out.iterations.push_back(first + v);
  return out;
}

LossInjector::LossInjector(const LossSpec& base, const BurstSchedule& bursts,
                           uint64_t seed)
    : base_(base), bursts_(bursts), rng_(seed), kind_(base.kind) {
  ValidateSpec(base);
  ValidateBurstLoss(bursts.burst_loss);
  if (!std::is_sorted(bursts_.iterations.begin(), bursts_.iterations.end())) {
    // Contains() is a binary search; accept a hand-built unsorted schedule.
    std::sort(bursts_.iterations.begin(), bursts_.iterations.end());
  }
  p_threshold_ = Threshold(base.p);
  good_to_bad_threshold_ = Threshold(base.ge_good_to_bad);
  bad_to_good_threshold_ = Threshold(base.ge_bad_to_good);
  loss_good_threshold_ = Threshold(base.ge_loss_good);
  loss_bad_threshold_ = Threshold(base.ge_loss_bad);
  burst_threshold_ = Threshold(bursts.burst_loss);
  if (kind_ == LossKind::kGilbertElliott) {
    // Start in the stationary distribution so that the loss rate is the
    // long-run rate from the first packet on, not biased towards "good".
    const double flow = base.ge_good_to_bad + base.ge_bad_to_good;
    ge_bad_ = Hit(Threshold(base.ge_good_to_bad / flow));
  }
  SetIteration(0);
  SetTimeNs(0);
}

uint64_t LossInjector::Threshold(double p) {
  if (!(p > 0)) return 0;
  if (p >= 1) return 1ull << 53;
  // p * 2^53 is exact (power-of-two scaling); a 53-bit draw x satisfies
  // x * 2^-53 < p  <=>  x < ceil(p * 2^53).
  return static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));
}

void LossInjector::SetIteration(uint64_t it) {
  in_burst_iteration_ = bursts_.Contains(it);
}

void LossInjector::SetInjectedBurst(double loss) {
  injected_burst_ = loss > 0;
  injected_threshold_ = Threshold(loss);
}

void LossInjector::SetTimeNs(uint64_t ns_since_start) {
  in_burst_window_ = bursts_.HasWindow() &&
                     ns_since_start >= bursts_.window_start_ns &&
                     ns_since_start < bursts_.window_end_ns;
}

}  // namespace dblp
