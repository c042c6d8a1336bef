// A minimal streaming JSON writer (summary.json, rows, telemetry).
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <vector>

namespace dblp {

// Minimal streaming JSON writer, compact output (no whitespace). Commas are
// inserted automatically; inside an object every value must be preceded by
// Key(). Writes one top-level value. Misuse (unbalanced End*, Key outside an
// object) is a programming error and asserts in debug builds.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& os) : os_(os) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  // Escapes '"', '\\' and all control characters (short forms \b \f \n \r \t,
  // others as \u00XX); other bytes, including UTF-8, pass through.
  JsonWriter& String(std::string_view s);
  JsonWriter& Int(int64_t v);
  JsonWriter& Uint(uint64_t v);
  // Shortest round-trip form, with ".0" appended to integral values so that
  // readers keep the field a float; NaN and +-Inf are written as null.
  JsonWriter& Double(double v);
  JsonWriter& Bool(bool v);
  JsonWriter& Null();

  // True once every opened container has been closed.
  bool Balanced() const { return stack_.empty() && !after_key_; }

 private:
  struct Frame {
    bool is_object;
    bool empty;
  };
  // Emits the separator a new value (or key) needs at this position.
  void BeforeValue();
  void WriteEscaped(std::string_view s);

  std::ostream& os_;
  std::vector<Frame> stack_;
  bool after_key_ = false;  // a Key() was written; its value comes next
};

}  // namespace dblp
