// python/src/options.h — keyword dictionaries from the Python layer to attn's option structs.
//
// The Python functions pass the options a caller gave as one dict; every key is checked here,
// so a misspelt option is an error naming the op and the key, never silently ignored.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <set>
#include <string>

#include "arrays.h"
#include "attn/attention.h"
#include "attn/execution.h"

namespace attn::py {

// Reads keys out of a dict, remembering which were used, and refuses the rest in finish().
class option_reader {
 public:
  option_reader(const char* op, nb::dict d) : op_(op), d_(std::move(d)) {}

  bool has(const char* key);
  nb::handle get(const char* key);  // the value; only after has(key)
  bool flag(const char* key, bool fallback);
  std::int64_t integer(const char* key, std::int64_t fallback);
  double real(const char* key, double fallback);
  std::optional<double> optional_real(const char* key);
  std::string text(const char* key, const char* fallback);
  std::optional<TensorArg> tensor(const char* key);
  void finish();  // throws for keys never read
  const char* op() const { return op_; }

 private:
  template <class T>
  T typed(const char* key, T fallback, const char* what);  // TypeError when not a T

  const char* op_;
  nb::dict d_;
  std::set<std::string> used_;
};

// Any array (NumPy, torch, DLPack) or TypeError naming the argument.
TensorView array_arg(nb::handle h, const char* op, const char* name);
// An array the call writes: a read-only one (a NumPy array with write=False) is a TypeError
// naming the argument, rather than written through.
TensorView writable_arg(nb::handle h, const char* op, const char* name);

// The masking_options keys: attn_mask, is_causal, alignment, window, nonpad_kv_seqlen,
// q_num_heads, kv_num_heads.
void read_masking(option_reader& r, masking_options& o);
// The rest of attention_options: scale, softcap, alibi_slopes, sinks, past_key, past_value, return_qk,
// mask_gradient.
attention_options read_attention(option_reader& r);
// backend, num_threads (and path for the family).
execution read_execution(option_reader& r);

}  // namespace attn::py
