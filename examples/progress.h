// examples/progress.h — the progress line the training examples print:
//   "step   100  loss 0.2120  token accuracy 0.924  2605 tokens/s"
// with a name in front when one model of several trains (progress{.name = "mlp"}).
#pragma once

#include <attn/nn/loss.h>

#include <chrono>
#include <cstdio>

struct progress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  const char* name = nullptr;

  // Prints at step 0, every `every` steps and at the last one; the rate counts `per_step` units
  // (steps, tokens) a step.
  void report(int step, int steps, int every, const attn::nn::loss_result& l, const char* accuracy_name,
              double per_step, const char* unit) const {
    if (step % every != 0 && step != steps - 1) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (name) std::printf("%s ", name);
    std::printf("step %5d  loss %.4f  %s %.3f  %.1f %s/s\n", step, l.loss, accuracy_name,
                double(l.correct) / double(l.count), double(step + 1) * per_step / secs, unit);
  }
};
