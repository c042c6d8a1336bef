// SIGINT, SIGTERM and SIGHUP end a job cleanly: the handler only sets a
// flag; every app's poll loops (RoundPacer's `quit`) end at their next idle
// moment and the app still writes its summary and rows and says BYE or
// ERROR, whatever the transport.
#pragma once

#include <atomic>

namespace dblp {

// Installs the handlers (again is harmless) and returns the flag.
const std::atomic<bool>& InstallQuitHandlers();

}  // namespace dblp
