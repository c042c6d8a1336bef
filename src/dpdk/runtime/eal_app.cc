#include "runtime/eal_app.h"

#include <pthread.h>
#include <rte_alarm.h>
#include <rte_cycles.h>
#include <rte_debug.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_interrupts.h>
#include <rte_log.h>
#include <rte_pause.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "dblp/base/log.h"
#include "dblp/base/version.h"
#include "runtime/eal_cleanup.h"

namespace dblp {

namespace {

// What to try when rte_eal_init fails with `err` (rte_errno).
std::string EalFix(int err) {
  switch (err) {
    case EACCES:
      // EAL's "Cannot get hugepage information" is EACCES too.
      if (geteuid() == 0) {
        return "no usable hugepages: reserve them and mount hugetlbfs "
               "(deploy/hugepages.sh --pages 512, or `echo 512 > "
               "/proc/sys/vm/nr_hugepages` and `mount -t hugetlbfs nodev "
               "/dev/hugepages`), or run without them: --no-huge -m 512";
      }
      return "run as root (or with CAP_SYS_ADMIN/CAP_IPC_LOCK), or check the "
             "permissions of /dev/hugepages and /var/run/dpdk";
    case ENOMEM:
      return "reserve hugepages (deploy/ or `echo 512 > /proc/sys/vm/"
             "nr_hugepages`) or run without them: --no-huge -m 512 --no-pci; "
             "lower -m/--socket-mem if the machine is short of memory";
    case EALREADY:
      return "the EAL is already initialised in this process";
    case EINVAL:
      return "check the EAL options before `--` (run with `-h` for the list); "
             "app options go after `--`";
    case ENODEV:
    case ENOTSUP:
      return "a --vdev/-a device has no driver: check the PMD name "
             "(net_ring0, net_memif0, net_af_packet0, net_tap0) and that the "
             "PMDs are installed (-d <pmd .so or dir> to load one by hand)";
    case EEXIST:
    case EBUSY:
    case EPROTO:
      return "another DPDK process uses the same runtime directory: give each "
             "process its own --file-prefix=<name> (or --in-memory)";
    case 0:
      return "if the EAL says \"Cannot create lock on .../config. Is another "
             "primary process running?\", another running DPDK process uses "
             "this --file-prefix: give each process its own "
             "--file-prefix=<name>; else --log-level=*:debug shows which EAL "
             "step failed";
    default:
      return "try --no-huge -m 512 --no-pci --file-prefix=<unique name>, and "
             "--log-level=*:debug to see which EAL step failed";
  }
}

}  // namespace

[[noreturn]] void Die(const std::string& what, const std::string& fix) {
  // rte_exit's lines without its rte_eal_cleanup (eal_cleanup.h, "Why not
  // rte_eal_cleanup"): a Die after the ports came up must not unmap the
  // EAL's memory under its interrupt thread. exit() runs the atexit handler
  // that removes the EAL's files.
  RTE_LOG(CRIT, EAL, "Error - exiting with code: %d\n  Cause: ", EXIT_FAILURE);
  rte_log(RTE_LOG_CRIT, RTE_LOGTYPE_EAL, "%s. Try: %s\n", what.c_str(),
          fix.c_str());
  std::exit(EXIT_FAILURE);
}

namespace {

struct InterruptThreadCall {
  void (*fn)(void*);
  void* arg;
  // Writer: the alarm on the interrupt thread; reader: RunOnInterruptThread.
  std::atomic<bool> done{false};
};

void RunCall(void* arg) {
  auto* call = static_cast<InterruptThreadCall*>(arg);
  call->fn(call->arg);
  call->done.store(true, std::memory_order_release);
}

}  // namespace

std::string RunOnInterruptThread(void (*fn)(void*), void* arg) {
  if (rte_thread_is_intr()) {
    fn(arg);
    return "";
  }
  InterruptThreadCall call{fn, arg};
  if (rte_eal_alarm_set(1, RunCall, &call) != 0) {
    return std::string("no EAL alarm (rte_eal_alarm_set: ") +
           rte_strerror(rte_errno) + ")";
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!call.done.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      // Removes the alarm if it never started; waits for it if it runs.
      rte_eal_alarm_cancel(RunCall, &call);
      if (call.done.load(std::memory_order_acquire)) return "";
      return "EAL's interrupt thread ran no alarm within 10 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return "";
}

std::vector<char*> AppArguments(int argc, char** argv) {
  std::vector<char*> app;
  if (argc > 0) app.push_back(argv[0]);
  int i = 1;
  while (i < argc && std::strcmp(argv[i], "--") != 0) ++i;
  for (++i; i < argc; ++i) app.push_back(argv[i]);
  return app;
}

bool SetRealtime(pthread_t thread, int priority) {
  sched_param param{};
  param.sched_priority = sched_get_priority_min(SCHED_FIFO) + priority - 1;
  return pthread_setschedparam(thread, SCHED_FIFO, &param) == 0;
}

namespace {

int g_logtype = -1;  // DPDK's "dblp" log type, once the EAL runs

// DBLP_LOG under the EAL: filtered by DPDK's level for "dblp"
// (--log-level=dblp:debug), written to stderr like the apps' other
// diagnostics; under systemd with the priority journald reads.
bool EalLogFilter(LogLevel level) {
  // RTE_LOG_ERR is 4: syslog's number plus one.
  return g_logtype < 0 || rte_log_can_log(static_cast<uint32_t>(g_logtype),
                                          static_cast<uint32_t>(level) + 1);
}

void EalLogSink(LogLevel level, const char* message) {
  const std::string line = FormatLogLine(level, message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

int InitEalOrDie(int argc, char** argv) {
  std::string line = std::string("dblp ") + Version() + ": command line:";
  for (int i = 0; i < argc; ++i) {
    line += ' ';
    line += argv[i];
  }
  DBLP_LOG(Notice, "%s", line.c_str());

  // Registered before the EAL parses its options, so every --log-level
  // applies in command-line order (`*:warning` then `dblp:debug` leaves
  // dblp at debug, as for DPDK's own types).
  g_logtype = rte_log_register_type_and_pick_level("dblp", RTE_LOG_INFO);
  if (g_logtype >= 0) SetLogSink(EalLogSink, EalLogFilter);
  const int ret = EalInitWithFileCleanup(argc, argv);  // eal_cleanup.h
  if (ret < 0) {
    const int err = rte_errno;
    // Some EAL failures set no rte_errno ("Success" would mislead).
    Die(std::string("EAL initialisation failed") +
            (err != 0 ? std::string(": ") + rte_strerror(err)
                      : std::string(" (the EAL lines above say where)")),
        EalFix(err));
  }
  return ret;
}

bool ParseIpv4(const std::string& text, uint32_t* out) {
  uint32_t addr = 0;
  int octets = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (octets < 4) {
    if (i >= n || text[i] < '0' || text[i] > '9') return false;
    uint32_t v = 0;
    size_t digits = 0;
    while (i < n && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + static_cast<uint32_t>(text[i] - '0');
      ++digits;
      ++i;
      if (digits > 3 || v > 255) return false;
    }
    addr = (addr << 8) | v;
    ++octets;
    if (octets < 4) {
      if (i >= n || text[i] != '.') return false;
      ++i;
    }
  }
  if (i != n) return false;
  *out = addr;
  return true;
}

std::string FormatIpv4(uint32_t host_order) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u", (host_order >> 24) & 0xFFu,
                (host_order >> 16) & 0xFFu, (host_order >> 8) & 0xFFu,
                host_order & 0xFFu);
  return buf;
}

namespace {
int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool ParseMac(const std::string& text, uint8_t out[6]) {
  // Exactly "xx:xx:xx:xx:xx:xx" (also '-' as separator), two hex digits each.
  if (text.size() != 17) return false;
  const char sep = text[2];
  if (sep != ':' && sep != '-') return false;
  uint8_t mac[6];
  for (int b = 0; b < 6; ++b) {
    const size_t pos = static_cast<size_t>(b) * 3;
    const int hi = HexDigit(text[pos]);
    const int lo = HexDigit(text[pos + 1]);
    if (hi < 0 || lo < 0) return false;
    if (b < 5 && text[pos + 2] != sep) return false;
    mac[b] = static_cast<uint8_t>(hi * 16 + lo);
  }
  std::copy(mac, mac + 6, out);
  return true;
}

std::string FormatMac(const uint8_t mac[6]) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0],
                mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

}  // namespace dblp
