#include "dblp/base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dblp {
namespace {

LogLevel LevelFromEnv() {
  LogLevel l = LogLevel::kInfo;
  if (const char* env = std::getenv("DBLP_LOG_LEVEL")) ParseLogLevel(env, &l);
  return l;
}

std::atomic<LogSink> g_sink{nullptr};
std::atomic<LogFilter> g_filter{nullptr};
std::atomic<int> g_level{static_cast<int>(LevelFromEnv())};

void DefaultSink(LogLevel level, const char* message) {
  const std::string line = FormatLogLine(level, message) + "\n";
  // One write per line: lines of several threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

void SetLogSink(LogSink sink, LogFilter filter) {
  g_filter.store(filter);
  g_sink.store(sink);
}

void SetLogLevel(LogLevel max_level) {
  g_level.store(static_cast<int>(max_level));
}

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  static const char* const kNames[] = {"error", "warning", "notice", "info",
                                       "debug"};
  for (int i = 0; i < 5; ++i) {
    if (text == kNames[i] || text == std::to_string(3 + i)) {
      *out = static_cast<LogLevel>(3 + i);
      return true;
    }
  }
  return false;
}

bool LogEnabled(LogLevel level) {
  if (const LogFilter f = g_filter.load()) return f(level);
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

std::string FormatLogLine(LogLevel level, const char* message) {
  std::string line;
  // journald reads "<N>" at the start of a line as its priority.
  static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  if (journal) line = "<" + std::to_string(static_cast<int>(level)) + ">";
  return line + message;
}

void Logf(LogLevel level, const char* fmt, ...) {
  if (!LogEnabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  va_list copy;
  va_copy(copy, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::vector<char> buf(n > 0 ? static_cast<size_t>(n) + 1 : 1, '\0');
  if (n > 0) std::vsnprintf(buf.data(), buf.size(), fmt, ap);
  va_end(ap);
  const LogSink sink = g_sink.load();
  (sink != nullptr ? sink : DefaultSink)(level, buf.data());
}

}  // namespace dblp
