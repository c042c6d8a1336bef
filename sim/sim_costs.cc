#include "sim/sim_costs.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dblp {

namespace {

// The number after `"key":` in a flat JSON object; false if absent.
bool FindNumber(const std::string& text, const std::string& key, double* out,
                std::string* err) {
  const std::string quoted = "\"" + key + "\"";
  size_t at = text.find(quoted);
  if (at == std::string::npos) return false;
  at = text.find(':', at + quoted.size());
  if (at == std::string::npos) {
    *err = "no value after " + quoted;
    return true;
  }
  const char* begin = text.c_str() + at + 1;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (end == begin || errno != 0 || !std::isfinite(v) || v < 0) {
    *err = quoted + " is not a finite number >= 0";
    return true;
  }
  *out = v;
  return true;
}

}  // namespace

std::string LoadSimCosts(const std::string& path, SimCosts* costs) {
  std::ifstream in(path);
  if (!in)
    return path +
           ": cannot read (write one with tools/dblp-bench --calibrate " +
           path + ")";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::string err;
  struct Field {
    const char* key;
    double* value;
    bool required;
  };
  double cores = costs->host_cores;
  const Field fields[] = {
      {"tx_ns", &costs->tx_ns, true},
      {"rx_ns", &costs->rx_ns, true},
      {"reduce_ns", &costs->reduce_ns, true},
      {"control_one_way_ns", &costs->control_one_way_ns, true},
      {"worker_gbps", &costs->worker_gbps, false},
      {"server_gbps", &costs->server_gbps, false},
      {"host_cores", &cores, false},
  };
  for (const Field& f : fields) {
    if (!FindNumber(text, f.key, f.value, &err) && f.required) {
      return path + ": no \"" + f.key +
             "\" (write it with tools/dblp-bench --calibrate " + path + ")";
    }
    if (!err.empty()) return path + ": " + err;
  }
  costs->host_cores = static_cast<uint32_t>(cores);
  return "";
}

}  // namespace dblp
