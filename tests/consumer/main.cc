// Consumes the installed package: one causal attention, prints the output shape and backend.
#include <attn/attn.h>

#include <cstdio>

int main() {
  attn::Tensor q = attn::Tensor::full({1, 2, 3, 4}, attn::dtype::f32, 0.5);
  attn::attention_options o;
  o.is_causal = true;
  const attn::attention_result r = attn::attention(q, q, q, o);
  std::printf("consumer ok %s %.4f\n", attn::shape_str(r.out.shape()).c_str(), r.out.get({0, 1, 2, 3}));
  return r.out.get({0, 1, 2, 3}) == 0.5 ? 0 : 1;
}
