// Every app's flags, checked right after parsing and before anything
// starts (the EAL, sockets, files): numbers within what their users hold
// (no wrap-around where a uint32 flag is narrowed, no overflow where one is
// multiplied), every double finite, and every file a flag names of the
// right kind (a FIFO, a device or a directory is refused before anything
// opens it). A bad value exits 2 naming the flag. One table for every app:
// a flag the app does not define is skipped. The flag-specific checks
// (job_flags.h, server_flags.h, ...) come after these.
#pragma once

#include <gflags/gflags.h>
#include <sched.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dblp/base/file_check.h"
#include "dblp/base/log.h"

namespace dblp {

[[noreturn]] inline void FlagError(const std::string& msg) {
  DBLP_LOG(Error, "error: %s", msg.c_str());
  std::exit(2);
}

struct FlagRange {
  const char* name;
  long double min, max;
  const char* example;
};

// The ranges of numeric flags, whichever app defines them.
inline constexpr FlagRange kFlagRanges[] = {
    // Narrowed to 16 bits.
    {"udp_port", 0, 65535, "47000"},
    {"rxd", 0, 65535, "1024"},
    {"txd", 0, 65535, "1024"},
    // Ranks and per-worker ports are 16 bits; 0 workers is no job.
    {"workers", 1, 65534, "3"},
    // floats * 4 bytes must not wrap; 1 TiB of gradient is beyond any
    // layout a job can hold.
    {"floats", 1, static_cast<long double>(uint64_t{1} << 38), "262144"},
    {"stats_period", 0, 86400, "1"},
    {"timeout_s", 0, 86400, "10"},
    {"ns_per_frame", 0, 1e9, "1230"},
    {"control_one_way_ns", 0, 1e12, "10000"},
    {"worker_gbps", 0, 1e6, "0"},
    {"server_gbps", 0, 1e6, "0"},
    {"lr", 0, 1e6, "0.05"},
    // CPU_SET beyond CPU_SETSIZE writes past the set.
    {"cpu", -1, CPU_SETSIZE - 1, "-1"},
    {"server_cpu", -1, CPU_SETSIZE - 1, "0"},
    {"worker_cpu", -1, CPU_SETSIZE - 1, "1"},
};

enum class FileFlagKind {
  kRead,         // a regular file, read whole (if absent, its reader says)
  kReadIfPt,     // kRead when the value ends in .pt (else a name)
  kWrite,        // a regular file or nothing yet
  kDir,          // a directory or nothing yet (made when written)
  kExistingDir,  // a directory that exists, when the flag is given
};

struct FileFlag {
  const char* name;
  FileFlagKind kind;
};

inline constexpr FileFlag kFileFlags[] = {
    {"secret_file", FileFlagKind::kRead},
    {"cmdline_file", FileFlagKind::kRead},
    {"costs", FileFlagKind::kRead},
    {"model", FileFlagKind::kReadIfPt},
    {"data", FileFlagKind::kReadIfPt},
    {"out", FileFlagKind::kWrite},
    {"out_dir", FileFlagKind::kDir},
    {"dump_dir", FileFlagKind::kDir},
    {"train_log_dir", FileFlagKind::kDir},
    {"data_dir", FileFlagKind::kExistingDir},
};

inline bool IsAppFlag(const gflags::CommandLineFlagInfo& f) {
  return f.filename.find("gflags") == std::string::npos;
}

inline void CheckFlagRangesOrDie() {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (IsAppFlag(f) && f.type == "double" &&
        !std::isfinite(std::strtod(f.current_value.c_str(), nullptr))) {
      FlagError("--" + f.name + "=" + f.current_value +
                ": give a finite number (default " + f.default_value + ")");
    }
  }
  for (const FlagRange& r : kFlagRanges) {
    gflags::CommandLineFlagInfo f;
    if (!gflags::GetCommandLineFlagInfo(r.name, &f)) continue;
    const long double v = std::strtold(f.current_value.c_str(), nullptr);
    if (!(v >= r.min && v <= r.max)) {
      char range[96];
      std::snprintf(range, sizeof(range), "%.15Lg..%.15Lg", r.min, r.max);
      FlagError("--" + f.name + "=" + f.current_value + " is outside " + range +
                " (e.g. --" + f.name + "=" + r.example + ")");
    }
  }
}

inline void CheckFileFlagsOrDie() {
  for (const FileFlag& ff : kFileFlags) {
    gflags::CommandLineFlagInfo f;
    if (!gflags::GetCommandLineFlagInfo(ff.name, &f) || f.type != "string" ||
        f.current_value.empty()) {
      continue;
    }
    const std::string& path = f.current_value;
    std::string why, fix;
    switch (ff.kind) {
      case FileFlagKind::kReadIfPt:
        if (path.size() < 3 || path.compare(path.size() - 3, 3, ".pt") != 0) {
          break;
        }
        [[fallthrough]];
      case FileFlagKind::kRead:
        why = CheckWritableFilePath(path);  // absent: its reader says
        fix = "give a regular file";
        break;
      case FileFlagKind::kWrite:
        why = CheckWritableFilePath(path);
        fix = "give the path of a regular file (or of none yet)";
        break;
      case FileFlagKind::kDir:
        why = CheckDirectoryPath(path);
        fix = "give a directory (or a path to make one at)";
        break;
      case FileFlagKind::kExistingDir:
        if (!f.is_default) why = CheckExistingDirectory(path);
        fix = "give an existing directory";
        break;
    }
    if (!why.empty()) {
      FlagError("--" + f.name + "=" + path + ": " + why + "; " + fix);
    }
  }
}

// Every app calls it once its flags are parsed.
inline void CheckFlagsOrDie() {
  CheckFlagRangesOrDie();
  CheckFileFlagsOrDie();
}

}  // namespace dblp
