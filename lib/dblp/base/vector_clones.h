// Per-packet loops built in AVX-512, AVX2 and baseline versions; the CPU
// picks one once, at load time (an ifunc). The loops stay portable C++ and
// the binary runs on any x86-64, at the speed of the machine it runs on.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DBLP_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DBLP_VECTOR_CLONES
#endif
