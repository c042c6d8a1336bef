#include "dblp/base/quit_signal.h"

#include <csignal>

namespace dblp {
namespace {
std::atomic<bool> g_quit{false};
static_assert(std::atomic<bool>::is_always_lock_free);  // signal-safe store
void OnQuitSignal(int) { g_quit.store(true); }
}  // namespace

const std::atomic<bool>& InstallQuitHandlers() {
  std::signal(SIGINT, OnQuitSignal);
  std::signal(SIGTERM, OnQuitSignal);
  std::signal(SIGHUP, OnQuitSignal);  // a closed terminal: exit cleanly too
  return g_quit;
}

}  // namespace dblp
