// python/src/options.cc — see options.h.
#include "options.h"

#include <fmt/format.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "attn/error.h"

namespace attn::py {

bool option_reader::has(const char* key) {
  used_.insert(key);
  return d_.contains(key) && !d_[key].is_none();
}

nb::handle option_reader::get(const char* key) { return d_[key]; }

bool option_reader::flag(const char* key, bool fallback) {
  if (!has(key)) return fallback;
  nb::handle h = get(key);
  if (!PyBool_Check(h.ptr()) && !PyLong_Check(h.ptr()))
    throw nb::type_error(fmt::format("{}: {} must be a bool, got {}", op_, key,
                                     nb::type_name(h.type()).c_str()).c_str());
  return PyObject_IsTrue(h.ptr()) == 1;
}

template <class T>
T option_reader::typed(const char* key, T fallback, const char* what) {
  if (!has(key)) return fallback;
  T v{};
  if (!nb::try_cast(get(key), v))
    throw nb::type_error(fmt::format("{}: {} must be {}, got {}", op_, key, what,
                                     nb::type_name(get(key).type()).c_str()).c_str());
  return v;
}

std::int64_t option_reader::integer(const char* key, std::int64_t fallback) {
  return typed<std::int64_t>(key, fallback, "an int");
}

double option_reader::real(const char* key, double fallback) { return typed<double>(key, fallback, "a number"); }

std::optional<double> option_reader::optional_real(const char* key) {
  if (!has(key)) return std::nullopt;
  return real(key, 0.0);
}

std::string option_reader::text(const char* key, const char* fallback) {
  return typed<std::string>(key, fallback, "a str");
}

std::optional<TensorArg> option_reader::tensor(const char* key) {
  if (!has(key)) return std::nullopt;
  return TensorArg(array_arg(get(key), op_, key));
}

void option_reader::finish() {
  for (auto [k, v] : d_) {
    std::string key = nb::cast<std::string>(k);
    if (!used_.count(key)) throw error(fmt::format("{}: unknown option '{}'", op_, key));
  }
}

TensorView array_arg(nb::handle h, const char* op, const char* name) {
  Array a;
  if (!nb::try_cast(h, a, false))
    throw nb::type_error(fmt::format("{}: {} is a {}, expected an array (NumPy, torch or DLPack)", op, name,
                                     nb::type_name(h.type()).c_str()).c_str());
  return view_of(a, op, name);
}

TensorView writable_arg(nb::handle h, const char* op, const char* name) {
  nb::ndarray<> a;
  if (!nb::try_cast(h, a, false))
    throw nb::type_error(fmt::format("{}: {} must be a writable array (NumPy, torch or DLPack)", op, name).c_str());
  return view_of(Array(a), op, name);
}

namespace {

causal_alignment parse_alignment(const std::string& s, const char* op) {
  if (s == "top_left") return causal_alignment::top_left;
  if (s == "bottom_right") return causal_alignment::bottom_right;
  if (s == "after_past") return causal_alignment::after_past;
  throw error(fmt::format("{}: alignment '{}' is not one of top_left, bottom_right, after_past", op, s));
}

qk_output parse_qk(const std::string& s, const char* op) {
  if (s == "none") return qk_output::none;
  if (s == "scaled") return qk_output::scaled;
  if (s == "softcapped") return qk_output::softcapped;
  if (s == "biased") return qk_output::biased;
  if (s == "probabilities") return qk_output::probabilities;
  throw error(
      fmt::format("{}: return_qk '{}' is not one of None, scaled, softcapped, biased, probabilities", op, s));
}

}  // namespace

void read_masking(option_reader& r, masking_options& o) {
  o.attn_mask = r.tensor("attn_mask");
  o.is_causal = r.flag("is_causal", false);
  o.alignment = parse_alignment(r.text("alignment", "top_left"), r.op());
  if (r.has("window")) {
    std::pair<std::int64_t, std::int64_t> w;
    if (!nb::try_cast(r.get("window"), w))
      throw nb::type_error(fmt::format("{}: window must be a pair of ints (left, right)", r.op()).c_str());
    o.window_left = w.first;
    o.window_right = w.second;
  }
  o.nonpad_kv_seqlen = r.tensor("nonpad_kv_seqlen");
  o.q_num_heads = r.integer("q_num_heads", 0);
  o.kv_num_heads = r.integer("kv_num_heads", 0);
}

attention_options read_attention(option_reader& r) {
  attention_options o;
  read_masking(r, o);
  o.scale = r.optional_real("scale");
  o.softcap = r.real("softcap", 0.0);
  o.alibi_slopes = r.tensor("alibi_slopes");
  o.sinks = r.tensor("sinks");
  o.past_key = r.tensor("past_key");
  o.past_value = r.tensor("past_value");
  o.return_qk = parse_qk(r.text("return_qk", "none"), r.op());
  o.mask_gradient = r.flag("mask_gradient", true);
  return o;
}

execution read_execution(option_reader& r) {
  execution e;
  e.use_backend = parse_backend(r.text("backend", "automatic"));
  e.path = parse_family_path(r.text("path", "automatic"));
  const std::int64_t n = r.integer("num_threads", 0);
  if (n < 0) throw error(fmt::format("{}: num_threads = {} must be >= 0 (0: all cores)", r.op(), n));
  e.num_threads = int(n);
  return e;
}

}  // namespace attn::py
