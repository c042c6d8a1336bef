// Numbers as text for the writers (rows, CDFs, JSON): shortest round-trip
// doubles (std::to_chars, locale-free) and the CSV spellings of non-finite
// values. Internal to obs/.
#pragma once

#include <array>
#include <cassert>
#include <charconv>
#include <cmath>
#include <ostream>
#include <string_view>
#include <system_error>

namespace dblp::text {

// Large enough for any shortest double ("-1.2345678901234567e-308" is 24)
// and any 64-bit integer.
using NumberBuffer = std::array<char, 32>;

template <typename T>
inline void WriteInteger(std::ostream& os, T v) {
  NumberBuffer buf;
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  assert(res.ec == std::errc());
  os.write(buf.data(), res.ptr - buf.data());
}

// Shortest text that parses back to exactly `v`; requires a finite v.
inline std::string_view FormatFinite(double v, NumberBuffer& buf) {
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  assert(res.ec == std::errc());
  return std::string_view(buf.data(),
                          static_cast<size_t>(res.ptr - buf.data()));
}

// CSV flavour: the spellings strtod and pandas read back for non-finite
// values (to_chars would write "-nan" for a negative NaN).
inline void WriteCsvDouble(std::ostream& os, double v) {
  if (std::isnan(v)) {
    os << "nan";
  } else if (std::isinf(v)) {
    os << (v > 0 ? "inf" : "-inf");
  } else {
    NumberBuffer buf;
    os << FormatFinite(v, buf);
  }
}

}  // namespace dblp::text
