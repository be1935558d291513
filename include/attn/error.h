// attn/error.h — the one exception type attn throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

// Thrown for every invalid argument a user can pass. The message starts with the op name and
// prints what it got, e.g.
//   "attention: q has 5 dims, expected 4 (B, Hq, Nq, D) or 3 (B, Nq, Hq*D)".
// attn never aborts on user input; internal invariants may assert.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace attn
