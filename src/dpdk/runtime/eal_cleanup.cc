#include "runtime/eal_cleanup.h"

#include <dirent.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dblp {

namespace {

// "<prefix>map_<digits>": the names EAL gives hugepage files (with or
// without --single-file-segments).
bool IsHugeFileOf(const char* name, const std::string& prefix) {
  if (std::strncmp(name, prefix.c_str(), prefix.size()) != 0) return false;
  const char* rest = name + prefix.size();
  if (std::strncmp(rest, "map_", 4) != 0) return false;
  rest += 4;
  if (*rest == '\0') return false;
  for (; *rest != '\0'; ++rest) {
    if (*rest < '0' || *rest > '9') return false;
  }
  return true;
}

std::vector<std::string> HugetlbfsMounts() {
  std::vector<std::string> mounts;
  FILE* f = std::fopen("/proc/mounts", "r");
  if (f == nullptr) return mounts;
  char dev[256];
  char dir[4096];
  char type[64];
  while (std::fscanf(f, "%255s %4095s %63s %*[^\n]", dev, dir, type) == 3) {
    if (std::strcmp(type, "hugetlbfs") == 0) mounts.emplace_back(dir);
  }
  std::fclose(f);
  return mounts;
}

// A prefix that names a directory under <base>/dpdk and nothing else (DPDK
// accepts "../.."): anything else is never cleaned up.
bool SafePrefix(const std::string& p) {
  return !p.empty() && p.find('/') == std::string::npos && p != "." &&
         p != "..";
}

// The EAL options this clean-up depends on, read before rte_eal_init
// permutes argv.
struct EalFileArgs {
  bool keep_hugefiles = false;  // --huge-unlink=never: kept on purpose
  std::string huge_dir;         // --huge-dir (may be below a mount)
  std::string prefix = "rte";   // --file-prefix, EAL's default
  // --no-shconf / --in-memory: no config lock, so another primary may
  // share the prefix; nothing under it is provably ours.
  bool unlocked = false;
};

EalFileArgs ReadEalFileArgs(int argc, char** argv) {
  EalFileArgs a;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "";
    if (std::strcmp(arg, "--") == 0) break;
    if (std::strcmp(arg, "--huge-unlink=never") == 0) {
      a.keep_hugefiles = true;
    } else if (std::strncmp(arg, "--huge-dir=", 11) == 0) {
      a.huge_dir = arg + 11;
    } else if (std::strcmp(arg, "--huge-dir") == 0) {
      a.huge_dir = next;
    } else if (std::strncmp(arg, "--file-prefix=", 14) == 0) {
      a.prefix = arg + 14;
    } else if (std::strcmp(arg, "--file-prefix") == 0) {
      a.prefix = next;
    } else if (std::strcmp(arg, "--no-shconf") == 0 ||
               std::strcmp(arg, "--in-memory") == 0) {
      a.unlocked = true;
    }
  }
  return a;
}

// What the atexit handler removes, fixed once the EAL is up.
struct CleanupState {
  std::string prefix;
  std::string runtime_dir;
  EalFileArgs args;
};
CleanupState* g_state = nullptr;  // never freed: used by the atexit handler

void RemoveAtExit() {
  if (g_state == nullptr) return;
  RemoveEalFiles(g_state->prefix.c_str(), g_state->runtime_dir.c_str(),
                 g_state->args.huge_dir.c_str(), g_state->args.keep_hugefiles);
}

}  // namespace

int RemoveEalFiles(const char* prefix, const char* runtime_dir,
                   const char* huge_dir, bool keep_hugefiles) {
  int removed = 0;
  const std::string pre = prefix;
  if (!keep_hugefiles && !pre.empty()) {
    std::vector<std::string> dirs = HugetlbfsMounts();
    if (huge_dir != nullptr && huge_dir[0] != '\0') dirs.emplace_back(huge_dir);
    for (const std::string& mount : dirs) {
      DIR* d = opendir(mount.c_str());
      if (d == nullptr) continue;
      while (const dirent* e = readdir(d)) {
        if (!IsHugeFileOf(e->d_name, pre)) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) ++removed;
      }
      closedir(d);
    }
  }
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    if (DIR* d = opendir(runtime_dir)) {
      while (const dirent* e = readdir(d)) {
        if (e->d_type == DT_DIR) continue;  // ".", "..", nothing of EAL's
        unlinkat(dirfd(d), e->d_name, 0);
      }
      closedir(d);
      rmdir(runtime_dir);
    }
  }
  return removed;
}

int EalInitWithFileCleanup(int argc, char** argv) {
  // rte_eal_init permutes argv: read it first.
  const EalFileArgs args = ReadEalFileArgs(argc, argv);
  // Where EAL puts the runtime directory (eal_create_runtime_dir): when it
  // is not there before a failed start, nobody else owns the prefix and
  // what the failed start left can go; when it is (a --file-prefix clash),
  // nothing is touched.
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string planned =
      (geteuid() == 0 ? std::string("/var/run")
                      : std::string(xdg != nullptr ? xdg : "/tmp")) +
      "/dpdk/" + args.prefix;
  struct stat st;
  const bool existed = stat(planned.c_str(), &st) == 0;
  const int ret = rte_eal_init(argc, argv);
  if (ret < 0) {
    if (!existed && !args.unlocked && SafePrefix(args.prefix)) {
      const int err = rte_errno;
      RemoveEalFiles(args.prefix.c_str(), planned.c_str(),
                     args.huge_dir.c_str(), args.keep_hugefiles);
      rte_errno = err;
    }
    return ret;
  }
  if (rte_eal_process_type() != RTE_PROC_PRIMARY || args.unlocked ||
      !SafePrefix(args.prefix)) {
    return ret;
  }
  // The runtime directory is <base>/dpdk/<file prefix>; the prefix is ours
  // now (a second primary with it would have failed rte_eal_init).
  const std::string dir = rte_eal_get_runtime_dir();
  const size_t slash = dir.find_last_of('/');
  if (g_state == nullptr && slash != std::string::npos && slash >= 5 &&
      dir.compare(slash - 5, 5, "/dpdk") == 0 &&
      dir.substr(slash + 1) == args.prefix) {
    g_state = new CleanupState{dir.substr(slash + 1), dir, args};
    std::atexit(RemoveAtExit);
  }
  return ret;
}

}  // namespace dblp
