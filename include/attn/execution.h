// attn/execution.h — how a call runs, kept apart from what it computes (as PyTorch keeps
// SDPA's arguments apart from `sdpa_kernel`). Every op takes an `execution` as its last
// argument; the options structs (attention_options, family_options) hold only the maths.
//
//   attn::attention(q, k, v, opt, {.use_backend = attn::backend::reference});
//   attn::attention(q, k, v, opt, {.num_threads = 1});
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attn {

// Which implementation of the core op runs. `automatic` takes the first eligible fast backend
// and falls back to the float64 reference; explain_backend (attention.h) says why each backend
// before the chosen one was not eligible. The environment variable ATTN_BACKEND (e.g.
// ATTN_BACKEND=reference) overrides `automatic` (never an explicit choice).
// `cuda` (attn/cuda.h) runs only when named: host tensors are copied to the device and back.
enum class backend { automatic, reference, cpu, cuda };

// Which path the family (family.h) takes. `automatic`: the core op for the pairs it can run,
// else the fused f32 kernels for the pairs they run (dot-product scores, float32/16 and
// bfloat16 inputs), else the float64 tiled kernels. `reference` is the family's oracle.
// ATTN_FAMILY_PATH overrides `automatic`.
enum class family_path { automatic, core, tiled, reference, fused };

struct execution {
  backend use_backend = backend::automatic;
  family_path path = family_path::automatic;  // family ops only
  // 0: all available (omp_get_max_threads). Results never depend on it; a count above
  // 4 × the processors (omp_get_num_procs) runs with that many; negative is an attn::error.
  int num_threads = 0;
};

// "automatic", "reference", "cpu" and back; parse_* throws attn::error listing the valid names.
std::string_view to_string(backend b);
backend parse_backend(std::string_view name);
std::string_view to_string(family_path p);
family_path parse_family_path(std::string_view name);

// The names of every backend compiled in, in registry order: cpu, cuda (builds with CUDA; taken
// only when named), reference.
std::vector<std::string> backends();

}  // namespace attn
