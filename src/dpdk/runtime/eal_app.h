// EAL start-up and the error conventions of the DPDK apps.
//
// Apps are launched like dpdk-testpmd: `app [EAL options] -- [app options]`.
// Errors follow rte_exit style and always name the fix.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "dblp/base/deep_idle.h"
#include "dblp/base/idle_backoff.h"

namespace dblp {

// Logs the full argv, initialises the EAL with everything before "--" and
// returns the index of the first app argument (argv is rearranged like
// rte_eal_init does: argv[ret] is the program name for the app parser).
// On failure exits with a message that names the usual causes (hugepages,
// --no-huge -m, --file-prefix clashes, missing vdev drivers).
int InitEalOrDie(int argc, char** argv);

// The app's own arguments: argv[0] followed by everything after the first
// "--". Parsed before the EAL starts, so `app -- --help` and bad app flags
// answer at once, without hugepages or ports.
std::vector<char*> AppArguments(int argc, char** argv);

// rte_exit's "what failed: why. Try: fix" message and exit code, without
// its rte_eal_cleanup (eal_cleanup.h).
[[noreturn]] void Die(const std::string& what, const std::string& fix);

// Runs fn(arg) on EAL's interrupt thread, as an EAL alarm, and waits for it:
// what runs there is serialized with every interrupt handler (memif's
// control channel, its teardown of a port whose peer hung up). Called on
// that thread, runs fn at once. Returns "" once fn ran; else what failed,
// and fn did not run (no alarm, or none had started within 10 s). A call
// already running there is waited for, however long it takes.
std::string RunOnInterruptThread(void (*fn)(void*), void* arg);

// What a reusable part of the apps returns instead of exiting: what
// failed and the fix (empty `what`: it worked). Only setup code turns it
// into Die().
struct AppFailure {
  std::string what;
  std::string fix;
  bool failed() const { return !what.empty(); }
};
[[noreturn]] inline void Die(const AppFailure& f) { Die(f.what, f.fix); }

// Parses "a.b.c.d" into a host-order IPv4 address; false on junk.
bool ParseIpv4(const std::string& text, uint32_t* out);
std::string FormatIpv4(uint32_t host_order);
// Parses "aa:bb:cc:dd:ee:ff"; false on junk.
bool ParseMac(const std::string& text, uint8_t out[6]);
std::string FormatMac(const uint8_t mac[6]);

// Real-time priorities (SCHED_FIFO) for hosts where several DBLP processes
// share a core. The control sidecar blocks in epoll almost always; when a
// PROBE or STOP arrives it must run at once, not after a busy datapath
// thread's CFS time slice (milliseconds). With --realtime the datapath
// lcore is FIFO too, one level lower, so a datapath that sleeps while idle
// (the idle back-off) gets the core back as soon as it has work instead of
// a time slice later. Return false (and change nothing) without
// CAP_SYS_NICE.
inline constexpr int kSidecarRtPriority = 2;
inline constexpr int kDatapathRtPriority = 1;
bool SetRealtime(pthread_t thread, int priority);

}  // namespace dblp
