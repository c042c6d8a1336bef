#include "runtime/prompt.h"

#include <cmdline.h>
#include <cmdline_parse.h>
#include <cmdline_parse_num.h>
#include <cmdline_parse_string.h>
#include <cmdline_socket.h>
#include <poll.h>
#include <rte_lcore.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "dblp/base/file_check.h"
#include "dblp/obs/app_state.h"
#include "dblp/obs/runtime_command.h"
#include "port/datapath.h"  // InstallQuitHandlers

namespace dblp {
namespace {

// What the callbacks share. Used by one thread at a time: the main thread
// while it validates a file (before the prompt thread exists), then the
// prompt thread.
struct PromptEnv {
  bool dry_run = false;
  std::string error;  // dry run: why the line is refused
  bool server = false;
  const char* app = "dblp";
  std::atomic<bool> stop{false};  // Stop(): waits end, the prompt closes
  bool quit = false;              // `quit` ran
  bool job_ended = false;         // a wait saw the job end
};
PromptEnv g_env;

void Say(cmdline* cl, const std::string& s) {
  if (!g_env.dry_run) cmdline_printf(cl, "%s", s.c_str());
}

// A refused command: in a dry run the file's error; live, said at once.
void Refuse(cmdline* cl, const std::string& why) {
  if (g_env.dry_run) {
    if (g_env.error.empty()) g_env.error = why;
    return;
  }
  cmdline_printf(cl, "error: %s\n", why.c_str());
}

bool ServerOnly(cmdline* cl, const char* what) {
  if (g_env.server) return true;
  Refuse(cl, std::string(what) +
                 " is a dblp-server command (the server decides p and the "
                 "policy); a worker accepts show, inject burst, clear stats, "
                 "wait, quit and help");
  return false;
}

// Hands `c` to the engine and says what it did (the engine logs it too).
void Submit(cmdline* cl, const RuntimeCommand& c, const std::string& what) {
  if (g_env.dry_run) return;
  AppState& s = GlobalAppState();
  if (s.round.Load().phase == JobPhase::kDone) {
    Refuse(cl, what + ": the job has ended");
    return;
  }
  RuntimeResult r;
  // Waits through the join: the engine's first round boundary applies it.
  for (;;) {
    if (s.running.load() || s.round.Load().phase == JobPhase::kDone ||
        g_env.stop.load()) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!s.mailbox.Submit(c, s.running, &r)) {
    Refuse(cl, what + ": " + r.text);
    return;
  }
  if (!r.ok) {
    Refuse(cl, what + ": " + r.text);
    return;
  }
  Say(cl, what + ": " + r.text + "\n");
}

// ---- result structures and tokens -------------------------------------------

// cmdline_inst with a fixed number of tokens: cmdline_parse_inst_t ends in
// a flexible array member, which C++ cannot initialise.
template <size_t N>
struct Inst {
  void (*f)(void*, cmdline*, void*);
  void* data;
  const char* help_str;
  cmdline_parse_token_hdr_t* tokens[N + 1];
};
static_assert(offsetof(Inst<1>, tokens) == offsetof(cmdline_inst, tokens));

template <size_t N>
cmdline_parse_inst_t* AsInst(Inst<N>& i) {
  return reinterpret_cast<cmdline_parse_inst_t*>(&i);
}
template <class T>
cmdline_parse_token_hdr_t* Tok(T& t) {
  return &t.hdr;
}

// show stats|round|config|lcores|policy
struct ShowResult {
  cmdline_fixed_string_t show;
  cmdline_fixed_string_t what;
};
cmdline_parse_token_string_t show_show =
    TOKEN_STRING_INITIALIZER(ShowResult, show, "show");
cmdline_parse_token_string_t show_what = TOKEN_STRING_INITIALIZER(
    ShowResult, what, "stats#round#config#lcores#policy");

void OnShow(void* parsed, cmdline* cl, void*) {
  if (g_env.dry_run) return;
  const auto* r = static_cast<ShowResult*>(parsed);
  const AppState& s = GlobalAppState();
  const std::string what = r->what;
  if (what == "stats") {
    Say(cl, FormatView("stats", StatsView(s)));
  } else if (what == "round") {
    Say(cl, FormatView("round", RoundView(s)));
  } else if (what == "config") {
    Say(cl, FormatView("config", ConfigView(s)));
  } else if (what == "policy") {
    Say(cl, FormatView("policy", PolicyView(s)));
  } else {
    const auto lcores = LcoresView(s);
    if (lcores.empty()) Say(cl, "lcores: none running yet\n");
    for (const StateDict& d : lcores) Say(cl, FormatView("lcore", d));
  }
}
Inst<2> cmd_show = {OnShow,
                    nullptr,
                    "show stats|round|config|lcores|policy: what the app "
                    "publishes (also /dblp/* over telemetry)",
                    {Tok(show_show), Tok(show_what), nullptr}};

// set p <value>
struct SetPResult {
  cmdline_fixed_string_t set;
  cmdline_fixed_string_t p;
  cmdline_fixed_string_t value;
};
cmdline_parse_token_string_t setp_set =
    TOKEN_STRING_INITIALIZER(SetPResult, set, "set");
cmdline_parse_token_string_t setp_p =
    TOKEN_STRING_INITIALIZER(SetPResult, p, "p");
cmdline_parse_token_string_t setp_value =
    TOKEN_STRING_INITIALIZER(SetPResult, value, nullptr);

void OnSetP(void* parsed, cmdline* cl, void*) {
  const auto* r = static_cast<SetPResult*>(parsed);
  if (!ServerOnly(cl, "set p")) return;
  RuntimeCommand c;
  std::string err;
  if (!ParseSetP(r->value, &c, &err)) return Refuse(cl, err);
  Submit(cl, c, std::string("set p ") + r->value);
}
Inst<3> cmd_set_p = {OnSetP,
                     nullptr,
                     "set p <value>: fixed tolerance p in [0, 1) from the next "
                     "round on (server)",
                     {Tok(setp_set), Tok(setp_p), Tok(setp_value), nullptr}};

// set policy fixed|dblp|reliable [key=value ...]
struct SetPolicyResult {
  cmdline_fixed_string_t set;
  cmdline_fixed_string_t policy;
  cmdline_fixed_string_t kind;
  cmdline_multi_string_t params;
};
cmdline_parse_token_string_t setpol_set =
    TOKEN_STRING_INITIALIZER(SetPolicyResult, set, "set");
cmdline_parse_token_string_t setpol_policy =
    TOKEN_STRING_INITIALIZER(SetPolicyResult, policy, "policy");
cmdline_parse_token_string_t setpol_kind =
    TOKEN_STRING_INITIALIZER(SetPolicyResult, kind, "fixed#dblp#reliable");
cmdline_parse_token_string_t setpol_params =
    TOKEN_STRING_INITIALIZER(SetPolicyResult, params, TOKEN_STRING_MULTI);

void OnSetPolicy(void* parsed, cmdline* cl, void* with_params) {
  auto* r = static_cast<SetPolicyResult*>(parsed);
  if (!ServerOnly(cl, "set policy")) return;
  const char* params = with_params != nullptr ? r->params : "";
  RuntimeCommand c;
  std::string err;
  if (!ParseSetPolicy(r->kind, params, GlobalAppState().policy.Load().config,
                      &c, &err)) {
    return Refuse(cl, err);
  }
  std::string what = std::string("set policy ") + r->kind;
  if (*params != '\0') what += std::string(" ") + params;
  Submit(cl, c, what);
}
char kWithParams = 1;  // the instance's data: it has a params token
Inst<3> cmd_set_policy = {
    OnSetPolicy,
    nullptr,
    "set policy fixed|dblp|reliable: the tolerance policy from the next round "
    "on, other parameters unchanged (server)",
    {Tok(setpol_set), Tok(setpol_policy), Tok(setpol_kind), nullptr}};
Inst<4> cmd_set_policy_params = {
    OnSetPolicy,
    &kWithParams,
    "set policy fixed [p_fixed=]P | dblp [p_low=P] [p_high=P] [clr_freq=N] "
    "[clr_eta=X]: the policy with these parameters (server)",
    {Tok(setpol_set), Tok(setpol_policy), Tok(setpol_kind), Tok(setpol_params),
     nullptr}};

// inject burst <loss> <iterations>
struct InjectResult {
  cmdline_fixed_string_t inject;
  cmdline_fixed_string_t burst;
  cmdline_fixed_string_t loss;
  uint64_t iterations;
};
cmdline_parse_token_string_t inj_inject =
    TOKEN_STRING_INITIALIZER(InjectResult, inject, "inject");
cmdline_parse_token_string_t inj_burst =
    TOKEN_STRING_INITIALIZER(InjectResult, burst, "burst");
cmdline_parse_token_string_t inj_loss =
    TOKEN_STRING_INITIALIZER(InjectResult, loss, nullptr);
cmdline_parse_token_num_t inj_iterations =
    TOKEN_NUM_INITIALIZER(InjectResult, iterations, RTE_UINT64);

void OnInject(void* parsed, cmdline* cl, void*) {
  const auto* r = static_cast<InjectResult*>(parsed);
  RuntimeCommand c;
  std::string err;
  if (!ParseInjectBurst(r->loss, r->iterations, &c, &err)) {
    return Refuse(cl, err);
  }
  Submit(cl, c,
         std::string("inject burst ") + r->loss + " " +
             std::to_string(r->iterations));
}
Inst<4> cmd_inject = {
    OnInject,
    nullptr,
    "inject burst <loss> <iterations>: the software loss injector drops "
    "frames at <loss> for the next <iterations> iterations (server: the "
    "pushes it receives; worker: its broadcast)",
    {Tok(inj_inject), Tok(inj_burst), Tok(inj_loss), Tok(inj_iterations),
     nullptr}};

// clear stats
struct ClearResult {
  cmdline_fixed_string_t clear;
  cmdline_fixed_string_t stats;
};
cmdline_parse_token_string_t clear_clear =
    TOKEN_STRING_INITIALIZER(ClearResult, clear, "clear");
cmdline_parse_token_string_t clear_stats =
    TOKEN_STRING_INITIALIZER(ClearResult, stats, "stats");

void OnClear(void*, cmdline* cl, void*) {
  RuntimeCommand c;
  c.kind = RuntimeCommand::Kind::kClearStats;
  Submit(cl, c, "clear stats");
}
Inst<2> cmd_clear = {OnClear,
                     nullptr,
                     "clear stats: show stats and /dblp/stats count from here "
                     "(summary.json keeps the job's totals)",
                     {Tok(clear_clear), Tok(clear_stats), nullptr}};

// wait iteration|round|ms <n>
struct WaitResult {
  cmdline_fixed_string_t wait;
  cmdline_fixed_string_t what;
  uint64_t n;
};
cmdline_parse_token_string_t wait_wait =
    TOKEN_STRING_INITIALIZER(WaitResult, wait, "wait");
cmdline_parse_token_string_t wait_what =
    TOKEN_STRING_INITIALIZER(WaitResult, what, "iteration#round#ms");
cmdline_parse_token_num_t wait_n =
    TOKEN_NUM_INITIALIZER(WaitResult, n, RTE_UINT64);

void OnWait(void* parsed, cmdline* cl, void*) {
  if (g_env.dry_run) return;
  const auto* r = static_cast<WaitResult*>(parsed);
  const std::string what = r->what;
  const auto start = std::chrono::steady_clock::now();
  const AppState& s = GlobalAppState();
  for (;;) {
    if (g_env.stop.load()) return;
    const RoundSnapshot round = s.round.Load();
    const bool running =
        round.phase == JobPhase::kPush || round.phase == JobPhase::kBroadcast;
    if (what == "ms") {
      // Clamped to a day: a larger n would overflow the clock's type.
      const uint64_t ms = std::min<uint64_t>(r->n, 86'400'000);
      if (std::chrono::steady_clock::now() - start >=
          std::chrono::milliseconds(ms)) {
        return;
      }
    } else if (running && (what == "iteration"
                               ? round.iteration >= r->n
                               : std::max(round.push_round,
                                          round.broadcast_round) >= r->n)) {
      return;
    }
    if (round.phase == JobPhase::kDone && what != "ms") {
      g_env.job_ended = true;
      Say(cl, "wait " + what + " " + std::to_string(r->n) +
                  ": the job ended at iteration " +
                  std::to_string(round.iteration) + "\n");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
Inst<3> cmd_wait = {
    OnWait,
    nullptr,
    "wait iteration <n> | wait round <n> | wait ms <n>: until the job reaches "
    "iteration (or round) <n>, or for <n> ms (for --cmdline-file)",
    {Tok(wait_wait), Tok(wait_what), Tok(wait_n), nullptr}};

// quit
struct WordResult {
  cmdline_fixed_string_t word;
};
cmdline_parse_token_string_t quit_quit =
    TOKEN_STRING_INITIALIZER(WordResult, word, "quit");

void OnQuit(void*, cmdline* cl, void*) {
  if (g_env.dry_run) return;
  Say(cl, "quit: ending the job (as on SIGINT)\n");
  g_env.quit = true;
  std::raise(SIGINT);  // the apps' handler: the loops end, reports written
}
Inst<1> cmd_quit = {
    OnQuit,
    nullptr,
    "quit: end the job cleanly, as SIGINT does (reports are written)",
    {Tok(quit_quit), nullptr}};

cmdline_parse_token_string_t help_help =
    TOKEN_STRING_INITIALIZER(WordResult, word, "help");

void OnHelp(void*, cmdline* cl, void*) {
  if (g_env.dry_run) return;
  std::string h =
      "commands (Tab completes, ? lists what fits here):\n"
      "  show stats|round|config|lcores|policy\n";
  if (g_env.server) {
    h += "  set p <value>                      fixed p in [0,1) from the next "
         "round\n"
         "  set policy fixed [p_fixed=]P\n"
         "  set policy dblp [p_low=P] [p_high=P] [clr_freq=N] [clr_eta=X]\n"
         "  set policy reliable\n"
         "  inject burst <loss> <iterations>   drop pushes at <loss> from the "
         "next iteration\n";
  } else {
    h += "  inject burst <loss> <iterations>   drop this worker's broadcast "
         "frames at <loss>\n";
  }
  h += "  clear stats                        show stats counts from here\n"
       "  wait iteration <n> | wait round <n> | wait ms <n>\n"
       "  quit                               end the job (as SIGINT)\n"
       "changes apply at the next round boundary; the app logs the iteration\n";
  Say(cl, h);
}
Inst<1> cmd_help = {
    OnHelp, nullptr, "help: the commands", {Tok(help_help), nullptr}};

cmdline_parse_ctx_t g_ctx[] = {
    AsInst(cmd_show),       AsInst(cmd_set_p),
    AsInst(cmd_set_policy), AsInst(cmd_set_policy_params),
    AsInst(cmd_inject),     AsInst(cmd_clear),
    AsInst(cmd_wait),       AsInst(cmd_quit),
    AsInst(cmd_help),       nullptr,
};

termios g_saved_term;
bool g_term_saved = false;
void RestoreTerminal() {
  if (g_term_saved) tcsetattr(STDIN_FILENO, TCSANOW, &g_saved_term);
}

std::string ParseError(int rc, const std::string& line) {
  switch (rc) {
    case CMDLINE_PARSE_AMBIGUOUS:
      return "'" + line + "' is ambiguous";
    case CMDLINE_PARSE_BAD_ARGS:
      return "'" + line +
             "': bad or missing arguments (e.g. set p 0.05, inject burst 0.7 "
             "2, wait iteration 10)";
    default:
      return "'" + line + "': unknown command (help lists them)";
  }
}

// A command file is a few lines: a cap far above any real one keeps a
// device or a huge file from exhausting memory.
constexpr size_t kMaxCommandFileBytes = 1 << 20;

bool ReadFile(const std::string& path, std::string* text, std::string* err) {
  return ReadRegularFile(path, kMaxCommandFileBytes, text, err);
}

}  // namespace

void ValidateCommandFileOrDie(const PromptOptions& opts) {
  if (opts.file.empty()) return;
  const std::string where = "--cmdline-file=" + opts.file;
  std::string text, err;
  if (!ReadFile(opts.file, &text, &err)) {
    std::fprintf(stderr,
                 "error: %s: %s; give a readable regular file of commands\n",
                 where.c_str(), err.c_str());
    std::exit(2);
  }
  g_env.server = opts.server;
  g_env.app = opts.app;
  g_env.dry_run = true;
  cmdline* cl = cmdline_new(g_ctx, "", -1, -1);
  if (cl == nullptr) {
    std::fprintf(stderr, "error: %s: cmdline_new failed\n", where.c_str());
    std::exit(2);
  }
  for (const CommandLine& line : SplitCommandFile(text)) {
    g_env.error.clear();
    const std::string buf = line.text + "\n";
    const int rc = cmdline_parse(cl, buf.c_str());
    // cmdline_parse returns the length it parsed on success.
    std::string why = rc < 0 ? ParseError(rc, line.text) : g_env.error;
    if (!why.empty()) {
      std::fprintf(stderr,
                   "error: %s line %u: %s; fix the line (help lists "
                   "the commands, docs/OPERATIONS.md describes them)\n",
                   where.c_str(), line.number, why.c_str());
      std::exit(2);
    }
  }
  cmdline_free(cl);
  g_env.dry_run = false;
}

void Prompt::Start() {
  if (!opts_.interactive && opts_.file.empty()) return;
  InstallQuitHandlers();  // `quit` raises SIGINT: never the default action
  g_env.server = opts_.server;
  g_env.app = opts_.app;
  g_env.stop.store(false);
  if (rte_ctrl_thread_create(&thread_, "dblp-prompt", nullptr, &Prompt::Main,
                             this) != 0) {
    std::fprintf(stderr, "%s: cannot start the prompt thread\n", opts_.app);
    return;
  }
  started_ = true;
}

void Prompt::Stop() {
  if (!started_) return;
  g_env.stop.store(true);
  pthread_join(thread_, nullptr);
  started_ = false;
}

void* Prompt::Main(void* arg) {
  static_cast<Prompt*>(arg)->Run();
  return nullptr;
}

void Prompt::Run() {
  const std::string prompt = std::string(opts_.app) + "> ";
  if (!opts_.file.empty()) {
    std::string text, err;
    if (!ReadFile(opts_.file, &text, &err)) {
      std::fprintf(stderr, "%s: --cmdline-file=%s: %s\n", opts_.app,
                   opts_.file.c_str(), err.c_str());
    } else {
      // No prompt of its own (cmdline_new prints it): each line is echoed.
      cmdline* cl = cmdline_new(g_ctx, "", -1, STDOUT_FILENO);
      for (const CommandLine& line : SplitCommandFile(text)) {
        if (g_env.stop.load() || g_env.quit || g_env.job_ended) break;
        cmdline_printf(cl, "%s%s\n", prompt.c_str(), line.text.c_str());
        const std::string buf = line.text + "\n";
        const int rc = cmdline_parse(cl, buf.c_str());
        if (rc < 0) {
          // Validated at start; only a cmdline change could get here.
          cmdline_printf(cl, "error: line %u: %s\n", line.number,
                         ParseError(rc, line.text).c_str());
        }
      }
      cmdline_free(cl);
    }
  }
  if (!opts_.interactive || g_env.quit || g_env.stop.load()) return;
  // cmdline puts the terminal in raw mode; an exit that never returns
  // here (rte_exit on a failed job) must give it back too.
  if (tcgetattr(STDIN_FILENO, &g_saved_term) == 0) {
    g_term_saved = true;
    std::atexit(RestoreTerminal);
  }
  cmdline* cl = cmdline_stdin_new(g_ctx, prompt.c_str());
  if (cl == nullptr) return;
  while (!g_env.stop.load() && !g_env.quit) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int r = poll(&p, 1, 100);
    if (r <= 0) continue;
    char c;
    if (read(STDIN_FILENO, &c, 1) <= 0) {
      std::fprintf(stderr,
                   "\n%s: end of input: the prompt closes, the job goes on "
                   "(SIGINT ends it)\n",
                   opts_.app);
      break;
    }
    if (cmdline_in(cl, &c, 1) < 0) break;  // Ctrl-D
  }
  cmdline_stdin_exit(cl);
}

}  // namespace dblp
