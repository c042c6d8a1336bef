// StopAndClosePorts on memif (src/dpdk/port/port.h): a port whose peer just
// hung up is torn down by memif on EAL's interrupt thread; closing it at that
// moment from the main thread freed its regions twice (DPDK 22.11: "EAL: Error:
// Invalid memory", then a SEGV; CI's sanitizer run, a server aborting after
// a worker was killed). Here a memif server and client live in one process:
// the client closes, so the server's interrupt thread reads a hang-up and
// tears the server's port down, and the server is closed at once, many
// times over. With a close from the main thread this crashes or logs a
// double free within a few rounds (14 of 15 runs); closed on the interrupt
// thread every round ends with both ports gone and nothing freed twice.
//
// Custom main: the EAL runs with --no-huge on its own --file-prefix.
#include <gtest/gtest.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_interrupts.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "eal_test_env.h"
#include "port/port.h"
#include "runtime/eal_app.h"

namespace dblp {
namespace {

rte_mempool* g_pool = nullptr;
// The EAL's log, kept to look for rte_malloc's complaints.
char* g_eal_log_buf = nullptr;
size_t g_eal_log_len = 0;
FILE* g_eal_log = nullptr;

// A started memif port with one queue pair; the port id, or -1.
int StartMemif(const std::string& name, const std::string& args) {
  if (rte_dev_probe((name + "," + args).c_str()) != 0) return -1;
  uint16_t port = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0) return -1;
  rte_eth_conf conf{};
  if (rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
      rte_eth_rx_queue_setup(port, 0, 256, SOCKET_ID_ANY, nullptr, g_pool) !=
          0 ||
      rte_eth_tx_queue_setup(port, 0, 256, SOCKET_ID_ANY, nullptr) != 0 ||
      rte_eth_dev_start(port) != 0) {
    return -1;
  }
  return port;
}

TEST(MemifClose, ServerClosedWhileItsPeerHangsUp) {
  // memif's sockets are abstract by default: the name is never a file.
  const std::string prefix =
      "/tmp/dblp-test-memif-close-" + std::to_string(getpid()) + "-r";
  constexpr int kRounds = 48;
  for (int i = 0; i < kRounds; ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    const std::string sock = prefix + std::to_string(i) + ".sock";
    const std::string srv_name = "net_memif_s" + std::to_string(i);
    const std::string cli_name = "net_memif_c" + std::to_string(i);
    const int srv = StartMemif(srv_name, "role=server,id=0,socket=" + sock);
    ASSERT_GE(srv, 0);
    const int cli = StartMemif(cli_name, "role=client,id=0,socket=" + sock);
    ASSERT_GE(cli, 0);
    ASSERT_TRUE(WaitForLink(static_cast<uint16_t>(srv), 5000));
    ASSERT_TRUE(WaitForLink(static_cast<uint16_t>(cli), 5000));

    // The client goes (the server's handler reads the hang-up), and the
    // server is closed right behind it.
    EXPECT_EQ(StopAndClosePorts({static_cast<uint16_t>(cli)}), "");
    EXPECT_EQ(StopAndClosePorts({static_cast<uint16_t>(srv)}), "");
    EXPECT_FALSE(rte_eth_dev_is_valid_port(static_cast<uint16_t>(srv)));
    EXPECT_FALSE(rte_eth_dev_is_valid_port(static_cast<uint16_t>(cli)));
    EXPECT_EQ(rte_eal_hotplug_remove("vdev", cli_name.c_str()), 0);
    EXPECT_EQ(rte_eal_hotplug_remove("vdev", srv_name.c_str()), 0);
  }
  // rte_free of an element already freed logs "Invalid memory" (the first
  // sign of the race, before any crash).
  std::fflush(g_eal_log);
  EXPECT_EQ(std::string(g_eal_log_buf, g_eal_log_len).find("Invalid memory"),
            std::string::npos)
      << std::string(g_eal_log_buf, g_eal_log_len);
}

// RunOnInterruptThread runs its function there, and from there at once
// (the interrupt thread cannot wait for an alarm of its own).
TEST(InterruptThread, RunsThereAndNestedCallsRunAtOnce) {
  struct Seen {
    bool outer_on_intr = false;
    bool inner_on_intr = false;
    std::string inner_err = "not run";
  } seen;
  ASSERT_EQ(RunOnInterruptThread(
                [](void* arg) {
                  auto* s = static_cast<Seen*>(arg);
                  s->outer_on_intr = rte_thread_is_intr();
                  s->inner_err = RunOnInterruptThread(
                      [](void* a) {
                        static_cast<Seen*>(a)->inner_on_intr =
                            rte_thread_is_intr();
                      },
                      s);
                },
                &seen),
            "");
  EXPECT_TRUE(seen.outer_on_intr);
  EXPECT_TRUE(seen.inner_on_intr);
  EXPECT_EQ(seen.inner_err, "");
  EXPECT_FALSE(rte_thread_is_intr());
}

}  // namespace
}  // namespace dblp

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  dblp::g_eal_log = open_memstream(&dblp::g_eal_log_buf, &dblp::g_eal_log_len);
  rte_openlog_stream(dblp::g_eal_log);
  dblp::testing_env::InitTestEal(argv[0], "memif-close");
  dblp::g_pool =
      rte_pktmbuf_pool_create("memif_close_pool", 4096, 256, 0,
                              RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  if (dblp::g_pool == nullptr) return 2;
  const int rc = RUN_ALL_TESTS();
  // No rte_eal_cleanup(), as in the apps (eal_cleanup.h): memif's stale
  // listener source would crash the interrupt thread after the unmap. The
  // log stream stays open: that thread may still log.
  return rc;
}
