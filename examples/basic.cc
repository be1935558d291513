// examples/basic.cc — causal grouped-query attention, forward and backward (the README example).
#include <attn/attn.h>

#include <cmath>
#include <cstdio>

int main() {
  // B=1, Hq=4 query heads sharing Hkv=2 key/value heads, Nq=Nk=3, D=Dv=2.
  std::vector<double> qv, kv, vv;
  for (int i = 0; i < 24; ++i) qv.push_back(std::sin(i));
  for (int i = 0; i < 12; ++i) kv.push_back(std::cos(i)), vv.push_back(i);
  const auto q = attn::Tensor::from_values({1, 4, 3, 2}, attn::dtype::f32, qv);
  const auto k = attn::Tensor::from_values({1, 2, 3, 2}, attn::dtype::f32, kv);
  const auto v = attn::Tensor::from_values({1, 2, 3, 2}, attn::dtype::f32, vv);

  attn::attention_options opt;
  opt.is_causal = true;  // top-left aligned, as PyTorch
  const attn::attention_result r = attn::attention(q, k, v, opt);
  std::printf("out %s on %s\n", attn::shape_str(r.out.shape()).c_str(), r.backend.c_str());
  for (int i = 0; i < 3; ++i) std::printf("  head 3, row %d: %.4f %.4f\n", i, r.out.get({0, 3, i, 0}), r.out.get({0, 3, i, 1}));

  const auto dout = attn::Tensor::full(r.out.shape(), attn::dtype::f32, 1.0);
  const attn::attention_grads g = attn::attention_backward(q, k, v, r.out, dout, r.lse, opt);
  std::printf("dv[0, 1] = %.4f %.4f (summed over the 2 query heads of group 1)\n", g.dv.get({0, 1, 0, 0}), g.dv.get({0, 1, 0, 1}));
}
