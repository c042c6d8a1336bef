// Hugepage and runtime-directory hygiene for the DPDK apps.
//
// A primary EAL process leaves its hugepage map files (<hugedir>/<prefix>
// map_<n>) and its runtime directory (/var/run/dpdk/<prefix>) on disk when
// it exits, so that secondary processes could attach; with a fresh
// --file-prefix per run they pile up until the host runs out of hugepages.
// The apps keep the files while they run (dpdk-dumpcap / pdump and
// dpdk-proc-info attach as secondary processes and need them; telemetry
// needs the runtime directory) and remove them on every exit that runs
// atexit handlers: the end of main, Die/rte_exit, exit() after SIGINT,
// SIGTERM or SIGHUP. Only SIGKILL or a crash leaves them; the next start
// with the same --file-prefix removes those (EAL's own clean-up), and
// `--huge-unlink` makes even that case leave nothing (no secondary
// processes then).
//
// Why not rte_eal_cleanup: in DPDK 22.11 it unmaps the EAL's memory while
// EAL's interrupt thread keeps running, and that thread walks every
// registered interrupt source whenever it wakes, reading each source's copy
// of its handle, which for memif's sources lives in EAL memory. memif never
// unregisters its listener socket's source, so a wake-up after the unmap
// reads unmapped memory (SIGSEGV in rte_intr_fd_get on "eal-intr-thread":
// 5 of 15 ASan runs of tests/app_behaviour_test.py once the ports closed
// cleanly). The apps and Die() therefore end without it: exit reclaims the
// memory with the thread, and the handler below removes what the EAL left
// on disk.
#pragma once

namespace dblp {

// rte_eal_init(argc, argv), and once it succeeded as the primary process,
// an atexit handler that unlinks this process's hugepage map files in every
// hugetlbfs mount and empties and removes its runtime directory (the map
// files stay with --huge-unlink=never: kept on purpose for a fast restart).
// When rte_eal_init fails, what it left goes only if the runtime directory
// did not exist before (else the prefix may belong to another live process:
// a --file-prefix clash touches nothing). Nothing is armed for a secondary
// process. Returns what rte_eal_init returned, rte_errno as it set it.
int EalInitWithFileCleanup(int argc, char** argv);

// The clean-up itself (also what the atexit handler runs): unlinks
// `<dir>/<prefix>map_<digits>` in each hugetlbfs mount of /proc/mounts and
// in huge_dir (--huge-dir, may be empty) unless keep_hugefiles, then removes
// the non-directory entries of runtime_dir and the directory. Returns how many
// hugepage files it removed.
int RemoveEalFiles(const char* prefix, const char* runtime_dir,
                   const char* huge_dir, bool keep_hugefiles);

}  // namespace dblp
