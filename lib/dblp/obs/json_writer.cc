#include "dblp/obs/json_writer.h"

#include <cassert>

#include "dblp/obs/number_text.h"

namespace dblp {

using text::FormatFinite;
using text::NumberBuffer;
using text::WriteInteger;

// --- JsonWriter -------------------------------------------------------------

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;  // the key already wrote its separator
    return;
  }
  if (stack_.empty()) return;
  assert(!stack_.back().is_object && "a value inside an object needs Key()");
  if (!stack_.back().empty) os_.put(',');
  stack_.back().empty = false;
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  os_.put('{');
  stack_.push_back({/*is_object=*/true, /*empty=*/true});
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  assert(!stack_.empty() && stack_.back().is_object && !after_key_);
  stack_.pop_back();
  os_.put('}');
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  os_.put('[');
  stack_.push_back({/*is_object=*/false, /*empty=*/true});
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  assert(!stack_.empty() && !stack_.back().is_object);
  stack_.pop_back();
  os_.put(']');
  return *this;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  assert(!stack_.empty() && stack_.back().is_object && !after_key_);
  if (!stack_.back().empty) os_.put(',');
  stack_.back().empty = false;
  WriteEscaped(key);
  os_.put(':');
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view s) {
  BeforeValue();
  WriteEscaped(s);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t v) {
  BeforeValue();
  WriteInteger(os_, v);
  return *this;
}

JsonWriter& JsonWriter::Uint(uint64_t v) {
  BeforeValue();
  WriteInteger(os_, v);
  return *this;
}

JsonWriter& JsonWriter::Double(double v) {
  BeforeValue();
  // JSON has no NaN/Infinity; null is what Python's and most readers'
  // strict modes accept, and it marks the value as missing.
  if (!std::isfinite(v)) {
    os_ << "null";
    return *this;
  }
  NumberBuffer buf;
  const std::string_view text = FormatFinite(v, buf);
  os_ << text;
  // "3" would read back as an integer in Python/JS; keep floats floats.
  if (text.find_first_of(".e") == std::string_view::npos) os_ << ".0";
  return *this;
}

JsonWriter& JsonWriter::Bool(bool v) {
  BeforeValue();
  os_ << (v ? "true" : "false");
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  os_ << "null";
  return *this;
}

void JsonWriter::WriteEscaped(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  os_.put('"');
  size_t run_start = 0;  // unescaped bytes are written in runs, not one by one
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const char* short_form = nullptr;
    switch (c) {
      case '"':
        short_form = "\\\"";
        break;
      case '\\':
        short_form = "\\\\";
        break;
      case '\b':
        short_form = "\\b";
        break;
      case '\f':
        short_form = "\\f";
        break;
      case '\n':
        short_form = "\\n";
        break;
      case '\r':
        short_form = "\\r";
        break;
      case '\t':
        short_form = "\\t";
        break;
      default:
        if (c >= 0x20) continue;
    }
    os_.write(s.data() + run_start,
              static_cast<std::streamsize>(i - run_start));
    run_start = i + 1;
    if (short_form != nullptr) {
      os_ << short_form;
    } else {
      const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
      os_.write(esc, sizeof(esc));
    }
  }
  os_.write(s.data() + run_start,
            static_cast<std::streamsize>(s.size() - run_start));
  os_.put('"');
}

}  // namespace dblp
