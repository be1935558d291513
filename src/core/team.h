// src/core/team.h — ending a parallel region's work so that the thread that carries on after it
// does not sleep at its closing barrier.
#pragma once

#include <omp.h>

#include <atomic>
#include <chrono>

namespace attn::detail {

// Under OMP_WAIT_POLICY=passive a thread that reaches a region's closing barrier before the
// others sleeps there (a futex) and the last one to arrive wakes it: ≈ 37 µs on the 2-core
// virtual machines of docs/PERFORMANCE.md ("Parallel regions under a passive wait policy"), paid
// by the calling thread on every region whose last task ran on a worker. After a `nowait`
// worksharing loop each thread calls arrive(); the master (thread 0, which carries on after the
// region) then waits, spinning for at most kSpin, until every thread has arrived, and a moment
// more for them to reach the barrier, so that it reaches it last and leaves without sleeping.
// Bounded: where a worker lost its core (an oversubscribed machine) the master goes on to the
// barrier and sleeps there, as before. The other threads never spin.
class team_join {
 public:
  void arrive() {
    const int n = omp_get_num_threads();
    done_.fetch_add(1, std::memory_order_acq_rel);
    if (n == 1 || omp_get_thread_num() != 0) return;
    const auto start = std::chrono::steady_clock::now();
    while (done_.load(std::memory_order_acquire) < n)
      if (std::chrono::steady_clock::now() - start > kSpin) return;
    const auto seen = std::chrono::steady_clock::now();  // the others go on to the barrier itself
    while (std::chrono::steady_clock::now() - seen < kGrace) {
    }
  }

 private:
  static constexpr std::chrono::microseconds kSpin{200};
  static constexpr std::chrono::nanoseconds kGrace{1000};
  std::atomic<int> done_{0};
};

}  // namespace attn::detail
