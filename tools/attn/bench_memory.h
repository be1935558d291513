// tools/attn/bench_memory.h — how much memory one call of `attn bench` touches, from the
// process's resident set (Linux /proc; NAN elsewhere).
#pragma once

namespace attn::cli::bench {

// Peak resident memory added by one call: free heap pages are returned first (malloc_trim) and
// the kernel's high-water mark reset (clear_refs 5), so HWM − RSS before is what the call
// touched.
//
//   memory_probe m;  m.begin();  call();  double mib = m.end_mib();
struct memory_probe {
  double base_kb = -1;
  void begin();
  double end_mib() const;
};

// The process's peak RSS so far, MiB.
double peak_rss_mib();

}  // namespace attn::cli::bench
