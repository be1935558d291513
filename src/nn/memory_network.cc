// src/nn/memory_network.cc — end-to-end memory network: bag-of-words memories, K hops of
// attn::attention, adjacent weight tying.
#include "attn/nn/memory_network.h"

#include <cstring>

#include "attn/linear.h"
#include "attn/nn/activation.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

const char* kOp = "MemoryNetwork";

// out[b, i, :] = Σ_w table[ids[b, i, w], :] (+ temporal[i, :]) over the nonzero ids: [B, S, d].
// ids [B, S, W] (or [B, W] as one sentence, S = 1).
template <class T>
Tensor bag(const Tensor& ids, const Tensor& table, const Tensor* temporal) {
  const std::int64_t W = ids.size(-1), rows = ids.numel() / std::max<std::int64_t>(W, 1), d = table.size(1);
  const std::int64_t S = ids.rank() == 3 ? ids.size(1) : 1;
  Shape shape = ids.shape();
  shape.back() = d;
  Tensor out = Tensor::zeros(shape, table.type());
  T* o = detail::ptr<T>(out);
  const T* e = detail::ptr<T>(table);
  const std::int64_t* id = ids.data_as<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t w = 0; w < W; ++w)
      if (id[r * W + w] != 0)
        for (std::int64_t c = 0; c < d; ++c) o[r * d + c] += e[id[r * W + w] * d + c];
    if (temporal)
      for (std::int64_t c = 0; c < d; ++c) o[r * d + c] += detail::ptr<T>(*temporal)[(r % S) * d + c];
  }
  return out;
}

// Backward of bag: dtable[ids[r, w]] += dout[r], dtemporal[r % S] += dout[r].
template <class T>
void bag_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, const Tensor* dtemporal) {
  const std::int64_t W = ids.size(-1), rows = ids.numel() / std::max<std::int64_t>(W, 1), d = dtable.size(1);
  const std::int64_t S = ids.rank() == 3 ? ids.size(1) : 1;
  const T* g = detail::ptr<T>(dout);
  T* dt = detail::ptr<T>(dtable);
  const std::int64_t* id = ids.data_as<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t w = 0; w < W; ++w)
      if (id[r * W + w] != 0)
        for (std::int64_t c = 0; c < d; ++c) dt[id[r * W + w] * d + c] += g[r * d + c];
    if (dtemporal)
      for (std::int64_t c = 0; c < d; ++c) detail::ptr<T>(*dtemporal)[(r % S) * d + c] += g[r * d + c];
  }
}

}  // namespace

MemoryNetwork::MemoryNetwork(std::int64_t V, std::int64_t d, std::int64_t S, std::int64_t hops, rng& gen, dtype t) {
  if (V < 2 || d < 1 || S < 1 || hops < 1)
    detail::fail(kOp, fmt::format("V = {} must be >= 2 and d = {}, S = {}, hops = {} >= 1", V, d, S, hops));
  for (std::int64_t k = 0; k <= hops; ++k) {
    E.emplace_back(V, d, gen, t);
    fill_normal(E.back().weight, 0.0, 0.1, gen);
    Tensor temporal = Tensor::empty({S, d}, t);
    fill_normal(temporal, 0.0, 0.1, gen);
    T.push_back(temporal);
    dT.push_back(zeros_like(temporal));
  }
}

MemoryNetwork::result MemoryNetwork::forward(const Tensor& story_in, const Tensor& query_in, const Tensor& lengths,
                                             saved* s, bool need_weights) const {
  const dtype t = E.front().weight.type();
  const std::int64_t V = E.front().num_embeddings(), d = E.front().dim(), Smax = T.front().size(0);
  const Tensor story = detail::int64_indices(kOp, "story", story_in), query = detail::int64_indices(kOp, "query", query_in);
  if (story.rank() != 3 || story.size(1) > Smax)
    detail::fail(kOp, fmt::format("story has shape {}, expected [B, S, W] with S <= {}", shape_str(story.shape()), Smax));
  const std::int64_t B = story.size(0);
  if (query.rank() != 2 || query.size(0) != B)
    detail::fail(kOp, fmt::format("query has shape {}, expected [B, W] with B = {}", shape_str(query.shape()), B));
  for (const Tensor* ids : {&story, &query})
    for (std::int64_t i = 0; i < ids->numel(); ++i)
      if (ids->data_as<std::int64_t>()[i] < 0 || ids->data_as<std::int64_t>()[i] >= V)
        detail::fail(kOp, fmt::format("{}[{}] = {} is outside [0, V) = [0, {})", ids == &story ? "story" : "query", i,
                                      ids->data_as<std::int64_t>()[i], V));
  result r;
  if (s) *s = {story, query, lengths, {}, {}};
  attention_options opt = detail::one_head_unscaled(lengths);
  if (need_weights) opt.return_qk = qk_output::probabilities;
  detail::with_type(t, [&](auto zero) {
    using U = decltype(zero);
    Tensor u = bag<U>(query, E[0].weight, nullptr);  // u_1 [B, d]
    u = Tensor::copy_of(u.view().reshape({B, 1, d}));
    for (std::int64_t k = 1; k <= hops(); ++k) {
      const Tensor m = bag<U>(story, E[std::size_t(k - 1)].weight, &T[std::size_t(k - 1)]);
      const Tensor c = bag<U>(story, E[std::size_t(k)].weight, &T[std::size_t(k)]);
      const attention_result a = attention(u, m, c, opt);
      if (need_weights) r.weights.push_back(a.qk);
      if (s) s->hops.push_back({u, m, c, a.out, a.lse});
      u = add(u, a.out);  // u_{k+1} = u_k + o_k
    }
    const Tensor u_last = Tensor::copy_of(u.view().reshape({B, d}));
    if (s) s->u_last = u_last;
    r.logits = linear(u_last, E[std::size_t(hops())].weight);  // u (E^K)ᵀ
  });
  return r;
}

// Each line undoes one line of the forward, last first.
void MemoryNetwork::backward(const saved& s, const Tensor& dlogits) {
  const std::int64_t B = s.story.size(0), d = E.front().dim(), K = hops();
  detail::check_dtype("MemoryNetwork.backward", "dlogits", dlogits, E.front().weight.type());
  detail::check_shape("MemoryNetwork.backward", "dlogits", dlogits, {B, E.front().num_embeddings()});
  detail::with_type(dlogits.type(), [&](auto zero) {
    using U = decltype(zero);
    // logits = u (E^K)ᵀ
    const linear_grads gl = linear_backward(s.u_last, E[std::size_t(K)].weight, dlogits);
    add_into(E[std::size_t(K)].dweight, gl.dW);
    Tensor du = Tensor::copy_of(gl.dx.view().reshape({B, 1, d}));
    const attention_options opt = detail::one_head_unscaled(s.lengths);
    for (std::int64_t k = K; k >= 1; --k) {
      const hop_saved& h = s.hops[std::size_t(k - 1)];
      // u_{k+1} = u_k + o  →  du_k = du, do = du;  o = attention(u_k, m, c)
      const attention_grads g = attention_backward(h.u, h.m, h.c, h.o, du, h.lse, opt);
      du = add(du, g.dq);
      // m = bag(story; E^{k−1}, T^{k−1}),  c = bag(story; E^k, T^k)
      bag_backward<U>(s.story, g.dk, E[std::size_t(k - 1)].dweight, &dT[std::size_t(k - 1)]);
      bag_backward<U>(s.story, g.dv, E[std::size_t(k)].dweight, &dT[std::size_t(k)]);
    }
    // u_1 = bag(query; E^0)
    bag_backward<U>(s.query, Tensor::copy_of(du.view().reshape({B, d})), E[0].dweight, nullptr);
  });
}

void MemoryNetwork::parameters(parameter_list& list, const std::string& prefix) {
  for (std::size_t k = 0; k < E.size(); ++k) {
    const std::string name = fmt::format("E{}", k);
    E[k].parameters(list, join(prefix, name.c_str()));
    add_parameter(list, join(prefix, fmt::format("T{}", k).c_str()), "weight", T[k], dT[k]);
  }
}

}  // namespace attn::nn
