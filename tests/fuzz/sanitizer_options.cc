// Built into every fuzz target: sanitizer defaults that make a finding a
// crash libFuzzer records, whatever the caller's environment says (the
// environment's ASAN_OPTIONS/UBSAN_OPTIONS still override these).
extern "C" {

// UBSan's checks recover by default: a report would scroll by and the run
// would pass. Halting turns it into a crash with a reproducer.
const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1";
}

// Leaks are findings too (a decoder that leaks per message is a DoS).
const char* __asan_default_options() { return "detect_leaks=1"; }

}  // extern "C"
