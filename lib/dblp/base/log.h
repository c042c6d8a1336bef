// Logging of every DBLP program: one call, DBLP_LOG(level, fmt, ...), with
// levels. The sink is the program's: the DPDK apps install one on DPDK's
// registered log type "dblp" (src/dpdk/runtime/eal_app.h), so
// --log-level=dblp:debug filters it like any DPDK component; the other programs
// keep the default, stderr with DBLP_LOG_LEVEL
// (error|warning|notice|info|debug) as filter. Under systemd (JOURNAL_STREAM
// set) each line starts with its syslog priority, "<3>" for an error, which
// journald turns into the severity.
//
// Logs are for operators (what happened, what failed and the fix). A
// program's results (its summary, stats lines, --help) are its output and
// go to stdout as before.
#pragma once

#include <cstdarg>
#include <string>

namespace dblp {

// syslog's numbers, as journald and DPDK (RTE_LOG_ERR = 4 = 3 + 1) use them.
enum class LogLevel : int {
  kError = 3,
  kWarning = 4,
  kNotice = 5,
  kInfo = 6,
  kDebug = 7,
};

// Receives each message that passed the filter, without a trailing newline.
using LogSink = void (*)(LogLevel level, const char* message);
// Whether the sink would write a message at `level`: asked before any
// formatting, so a filtered DBLP_LOG costs one call.
using LogFilter = bool (*)(LogLevel level);
// Installs `sink` and its `filter` (nullptr: the default sink and level).
// Call before any thread logs.
void SetLogSink(LogSink sink, LogFilter filter);
// The default sink's threshold (messages above it are dropped).
void SetLogLevel(LogLevel max_level);
// "error", "warning", "notice", "info", "debug" (or 3..7); false on junk.
bool ParseLogLevel(const std::string& text, LogLevel* out);
// Whether a message at `level` would be written (skip expensive formatting).
bool LogEnabled(LogLevel level);

// printf-style. Never per packet: a datapath lcore logs at setup and at
// round boundaries only.
void Logf(LogLevel level, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// The line as the default sink writes it (for a sink that writes itself).
std::string FormatLogLine(LogLevel level, const char* message);

}  // namespace dblp

#define DBLP_LOG(level, ...) \
  ::dblp::Logf(::dblp::LogLevel::k##level, __VA_ARGS__)
