// Numbers in the policies' Describe() lines. Internal to policy/.
#pragma once

#include <charconv>
#include <string>

namespace dblp {

// Shortest text that reads back as the same double ("0.008", not
// "0.008000"), so Describe() lines can be pasted back as flags.
inline std::string PolicyNum(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

}  // namespace dblp
