// tests/dist/npy_tool.cc — the two steps of the `attn run --ring` test (cli_ring.cmake) that
// need no Python:
//   npy_tool make DIR B Hq Hkv N D     writes DIR/{q,k,v,dout}.npy, float32, values in [-1, 1)
//   npy_tool compare A.npy B.npy TOL   exit 0 when shapes match and max |a - b| <= TOL (-inf == -inf)
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "attn/attn.h"
#include "test_util.h"

namespace {

attn::Tensor random(const attn::Shape& shape, unsigned seed) {
  std::mt19937 rng(seed);
  return attn::testing::random_tensor(shape, attn::dtype::f32, rng);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "make" && argc == 8) {
    const std::string dir = argv[2];
    const std::int64_t B = std::stoll(argv[3]), Hq = std::stoll(argv[4]), Hkv = std::stoll(argv[5]),
                       N = std::stoll(argv[6]), D = std::stoll(argv[7]);
    attn::write_npy(dir + "/q.npy", random({B, Hq, N, D}, 1));
    attn::write_npy(dir + "/k.npy", random({B, Hkv, N, D}, 2));
    attn::write_npy(dir + "/v.npy", random({B, Hkv, N, D}, 3));
    attn::write_npy(dir + "/dout.npy", random({B, Hq, N, D}, 4));
    return 0;
  }
  if (cmd == "compare" && argc == 5) {
    const attn::Tensor a = attn::read_npy(argv[2]), b = attn::read_npy(argv[3]);
    const double tol = std::stod(argv[4]);
    if (a.shape() != b.shape()) {
      std::fprintf(stderr, "%s %s vs %s %s\n", argv[2], attn::shape_str(a.shape()).c_str(), argv[3],
                   attn::shape_str(b.shape()).c_str());
      return 1;
    }
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    double worst = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i]) || std::isnan(y[i]) || ((std::isinf(x[i]) || std::isinf(y[i])) && x[i] != y[i])) worst = INFINITY;
      else if (!std::isinf(x[i])) worst = std::max(worst, std::abs(x[i] - y[i]));
    }
    std::printf("%s vs %s: max |diff| %g\n", argv[2], argv[3], worst);
    return worst <= tol ? 0 : 1;
  }
  std::fprintf(stderr, "usage: npy_tool make DIR B Hq Hkv N D | npy_tool compare A.npy B.npy TOL\n");
  return 2;
}
