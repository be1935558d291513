// src/positional/positional_impl.h — validated problems for the positional encodings, and the
// two implementations of each: the float64 reference (reference.cc, the test oracle) and the
// fast path (kernels.cc). The front (positional.cc) checks every user argument, allocates and
// builds these; neither implementation checks user input again.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/positional.h"
#include "core/problem.h"  // strided4

namespace attn::positional_detail {

using detail::strided4;

// Position of row n of batch b: ids[b * sb + n * sn] when ids is set, else offset + n.
struct row_positions {
  const std::int64_t* ids = nullptr;
  std::int64_t sb = 0, sn = 0;  // sb = 0 when the ids are shared by the batch
  std::int64_t offset = 0;
  std::int64_t at(std::int64_t b, std::int64_t n) const { return ids ? ids[b * sb + n * sn] : offset + n; }
};

// x, out: [B, H, N, D] strided (3-D inputs are viewed as 4-D by the front).
struct rotary_problem {
  std::int64_t B = 0, H = 0, N = 0, D = 0, R = 0;
  double base = 10000.0;
  rotary_layout layout = rotary_layout::half_split;
  bool inverse = false;  // backward: rotate by −θ
  strided4 x, out;
  row_positions pos;
};

// out[b, n, d] = (x[b, n, d] if add) + PE(pos(b, n), d). Views are [B, 1, N, D] strided4.
struct sinusoidal_problem {
  std::int64_t B = 0, N = 0, D = 0;
  double base = 10000.0;
  bool add = false;
  strided4 x, out;
  row_positions pos;
};

// Forward: out[b, n, :] = table[pos(b, n), :].  Backward: dtable[pos(b, n), :] += dout[b, n, :].
// table/dout/out are [B, 1, N, D] strided4 views (the table as [1, 1, P, D]); dtable is a
// contiguous float64 accumulator [P, D] that the front zeroes.
struct learned_problem {
  std::int64_t B = 0, N = 0, D = 0, P = 0;
  strided4 table, out, dout;
  double* dtable = nullptr;
  row_positions pos;
};

// Forward: out[0, h, i, j] = table[bucket(j − (offset + i)), h], table viewed as [1, 1, K, H].
// Backward: dtable[bucket, h] += Σ_b dbias[b, h, i, j]; dtable contiguous float64 [K, H].
struct relative_problem {
  std::int64_t Bd = 1, H = 0, Nq = 0, Nk = 0;
  relative_position_options opt;
  strided4 table, out, dbias;
  double* dtable = nullptr;
};

// The T5 bucket formula (documented in positional.h); options were validated by the front.
inline std::int64_t t5_bucket(std::int64_t r, const relative_position_options& o) {
  if (r < -INT64_MAX) r = -INT64_MAX;  // so that −r exists; the bucket is the last one either way
  std::int64_t nb = o.num_buckets, bucket = 0, n = 0;
  if (o.bidirectional) {
    nb /= 2;
    if (r > 0) bucket += nb;
    n = r < 0 ? -r : r;
  } else {
    n = r < 0 ? -r : 0;
  }
  const std::int64_t max_exact = nb / 2;
  if (n < max_exact) return bucket + n;
  // float32 on purpose: T5 (Mesh TensorFlow) and Hugging Face evaluate this line in float32,
  // and truncation makes the last bits matter at bucket edges.
  const float scaled = std::log(float(n) / float(max_exact)) /
                       float(std::log(double(o.max_distance) / double(max_exact))) * float(nb - max_exact);
  const std::int64_t large = scaled >= float(nb) ? nb : max_exact + std::int64_t(scaled);
  return bucket + (large < nb - 1 ? large : nb - 1);
}

namespace reference {
void rotary(const rotary_problem& p);
void sinusoidal(const sinusoidal_problem& p);
void learned_forward(const learned_problem& p);
void learned_backward(const learned_problem& p);
void relative_forward(const relative_problem& p);
void relative_backward(const relative_problem& p);
}  // namespace reference

namespace fast {
void rotary(const rotary_problem& p);
void sinusoidal(const sinusoidal_problem& p);
void learned_forward(const learned_problem& p);
void learned_backward(const learned_problem& p);
void relative_forward(const relative_problem& p);
void relative_backward(const relative_problem& p);
}  // namespace fast

}  // namespace attn::positional_detail
