// The runtime prompt of both DPDK apps, on DPDK's cmdline library (help
// with `help` or `?`, tab completion): interactive with -i, or replayed
// from --cmdline-file. It runs on a control thread of its own (never on a
// datapath lcore) and only talks to the engine through GlobalAppState():
// it reads the published snapshots (show, wait) and hands changes to the
// coordinator through the ControlMailbox, which applies them at the next
// round boundary and logs the iteration they took effect at.
//
//   show stats|round|config|lcores|policy
//   set p <value>                           (server)
//   set policy fixed|dblp|reliable [k=v ...] (server)
//   inject burst <loss> <iterations>        (server: pushes; worker: its
//                                           broadcast)
//   clear stats
//   wait iteration|round <n>  /  wait ms <n>
//   quit                                    (ends the job, like SIGINT)
//   help
#pragma once

#include <pthread.h>

#include <atomic>
#include <string>

namespace dblp {

struct PromptOptions {
  bool interactive = false;  // -i / --interactive
  std::string file;          // --cmdline-file
  bool server = false;       // the server's commands (set ...)
  const char* app = "dblp";  // for the prompt and messages
};

// Before the EAL starts: every line of opts.file must be a command this
// app accepts, with valid arguments; otherwise exits 2 naming the file,
// the line and the fix. Reads the policy in force from GlobalAppState().
void ValidateCommandFileOrDie(const PromptOptions& opts);

class Prompt {
 public:
  explicit Prompt(const PromptOptions& opts) : opts_(opts) {}
  ~Prompt() { Stop(); }
  Prompt(const Prompt&) = delete;
  Prompt& operator=(const Prompt&) = delete;

  // After rte_eal_init: the replay, then (with -i) the interactive prompt,
  // on a control thread. Nothing when neither was asked for.
  void Start();
  // The job ended: a wait in progress ends, the prompt closes (terminal
  // restored) and the thread is joined.
  void Stop();

 private:
  static void* Main(void* arg);
  void Run();

  PromptOptions opts_;
  pthread_t thread_{};
  bool started_ = false;
};

}  // namespace dblp
