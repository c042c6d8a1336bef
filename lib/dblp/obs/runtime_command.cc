#include "dblp/obs/runtime_command.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace dblp {
namespace {

std::string_view Trim(std::string_view s) {
  const auto blank = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
  };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

bool ParseDouble(std::string_view text, double* out) {
  text = Trim(text);
  if (text.empty()) return false;
  const auto res =
      std::from_chars(text.data(), text.data() + text.size(), *out);
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

bool ParseUint(std::string_view text, uint64_t* out) {
  text = Trim(text);
  if (text.empty()) return false;
  const auto res =
      std::from_chars(text.data(), text.data() + text.size(), *out);
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    const size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace

bool ParseFraction(std::string_view text, const char* what, bool allow_one,
                   double* out, std::string* error) {
  double v = 0;
  if (!ParseDouble(text, &v) || !std::isfinite(v) || v < 0 ||
      (allow_one ? v > 1 : v >= 1)) {
    *error = std::string(what) + " must be a number in " +
             (allow_one ? "[0, 1]" : "[0, 1)") + ", got '" + std::string(text) +
             "' (e.g. " + (allow_one ? "0.7" : "0.05") + ")";
    return false;
  }
  *out = v;
  return true;
}

bool ParseSetP(std::string_view value, RuntimeCommand* out,
               std::string* error) {
  double p = 0;
  if (!ParseFraction(value, "set p: the tolerance", false, &p, error)) {
    return false;
  }
  *out = RuntimeCommand{};
  out->kind = RuntimeCommand::Kind::kSetPolicy;
  out->set_p = true;
  out->policy.kind = PolicyKind::kFixed;
  out->policy.p_fixed = p;
  return true;
}

bool ParseSetPolicy(std::string_view kind, std::string_view params,
                    const PolicyConfig& current, RuntimeCommand* out,
                    std::string* error) {
  PolicyConfig c = current;
  const std::string k(Trim(kind));
  if (k == "fixed") {
    c.kind = PolicyKind::kFixed;
  } else if (k == "dblp") {
    c.kind = PolicyKind::kDblp;
  } else if (k == "reliable") {
    c.kind = PolicyKind::kReliable;
  } else {
    *error = "set policy " + k +
             ": unknown policy; use fixed [p_fixed=P], dblp [p_low=P] "
             "[p_high=P] [clr_freq=N] [clr_eta=X] or reliable";
    return false;
  }
  for (std::string_view w : Words(params)) {
    const size_t eq = w.find('=');
    const std::string key(eq == std::string_view::npos ? std::string_view()
                                                       : w.substr(0, eq));
    const std::string_view val =
        eq == std::string_view::npos ? w : w.substr(eq + 1);
    const std::string where = "set policy " + k + " " + std::string(w);
    if (key.empty() && c.kind == PolicyKind::kFixed) {
      if (!ParseFraction(val, (where + ": p_fixed").c_str(), false, &c.p_fixed,
                         error)) {
        return false;
      }
      continue;
    }
    bool ok = true;
    if (c.kind == PolicyKind::kFixed && key == "p_fixed") {
      ok = ParseFraction(val, (where + ": p_fixed").c_str(), false, &c.p_fixed,
                         error);
    } else if (c.kind == PolicyKind::kDblp && key == "p_low") {
      ok = ParseFraction(val, (where + ": p_low").c_str(), false, &c.p_low,
                         error);
    } else if (c.kind == PolicyKind::kDblp && key == "p_high") {
      ok = ParseFraction(val, (where + ": p_high").c_str(), false, &c.p_high,
                         error);
    } else if (c.kind == PolicyKind::kDblp && key == "clr_freq") {
      uint64_t f = 0;
      ok = ParseUint(val, &f) && f >= 1 && f <= 1000000;
      if (!ok) {
        *error =
            where + ": clr_freq must be an integer in 1..1000000 (e.g. 10)";
      }
      c.clr.freq = static_cast<uint32_t>(f);
    } else if (c.kind == PolicyKind::kDblp && key == "clr_eta") {
      ok = ParseDouble(val, &c.clr.eta) && std::isfinite(c.clr.eta) &&
           c.clr.eta > 0;
      if (!ok) *error = where + ": clr_eta must be a number > 0 (e.g. 0.5)";
    } else {
      *error = where + ": unknown parameter for " + k + "; use " +
               (c.kind == PolicyKind::kFixed  ? "p_fixed=P (or a bare P)"
                : c.kind == PolicyKind::kDblp ? "p_low=P p_high=P "
                                                "clr_freq=N clr_eta=X"
                                              : "no parameters") +
               " (key=value)";
      return false;
    }
    if (!ok) return false;
  }
  try {
    ValidatePolicyConfig(c);
  } catch (const std::invalid_argument& e) {
    *error = "set policy " + k + ": " + e.what();
    return false;
  }
  *out = RuntimeCommand{};
  out->kind = RuntimeCommand::Kind::kSetPolicy;
  out->policy = c;
  return true;
}

bool ParseInjectBurst(std::string_view loss, uint64_t iterations,
                      RuntimeCommand* out, std::string* error) {
  double l = 0;
  if (!ParseFraction(loss, "inject burst: the loss", true, &l, error)) {
    return false;
  }
  if (!(l > 0)) {
    *error =
        "inject burst: a loss of 0 drops nothing; use a loss in (0, 1], "
        "e.g. inject burst 0.7 1";
    return false;
  }
  if (iterations < 1 || iterations > 1000000) {
    *error = "inject burst " + std::string(loss) + " " +
             std::to_string(iterations) +
             ": iterations must be in 1..1000000 (e.g. 1)";
    return false;
  }
  *out = RuntimeCommand{};
  out->kind = RuntimeCommand::Kind::kInjectBurst;
  out->loss = l;
  out->iterations = iterations;
  return true;
}

std::vector<CommandLine> SplitCommandFile(std::string_view text) {
  std::vector<CommandLine> out;
  uint32_t number = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text =
        nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++number;
    line = Trim(line);
    if (line.empty() || line.front() == '#') continue;
    out.push_back(CommandLine{number, std::string(line)});
  }
  return out;
}

}  // namespace dblp
