// The CPU neural-network kernels on every ISA this machine supports: against
// double-precision references written here, against each other bit for bit,
// and (through kernels/nn.h) as device ops with their argument checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/values.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/nn.h"
#include "kernels/nn_math.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "runtime/units.h"

namespace memwall::kernels {
namespace {

using testing::RandomFloats;
using testing::SameBits;

// Units in the last place between a float result and the exact value.
double Ulps(float got, double exact) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
  return std::fabs(got - exact) / ulp;
}

TEST_CASE("ExpF is within 2 ulp of exp on its range and saturates outside it", "[nn]") {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    worst = std::max(worst, Ulps(ExpF(x), std::exp(double(x))));
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst <= 2.0);
  CHECK(ExpF(0.0f) == 1.0f);
  CHECK(ExpF(-1000.0f) == ExpF(-87.33654f));
  CHECK(ExpF(-1000.0f) > 0.0f);
  CHECK(std::isfinite(ExpF(1000.0f)));
  CHECK(ExpF(1000.0f) == ExpF(88.0f));
}

TEST_CASE("TanhF and GELU agree with their double-precision definitions", "[nn]") {
  double tanh_error = 0, gelu_error = 0, grad_error = 0;
  for (float x = -10.0f; x <= 10.0f; x += 0.001f) {
    tanh_error = std::max(tanh_error, std::fabs(TanhF(x) - std::tanh(double(x))));
    const double u = 0.7978845608028654 * (x + 0.044715 * double(x) * x * x);
    const double t = std::tanh(u);
    const double gelu = 0.5 * x * (1 + t);
    const double grad =
        0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
    gelu_error = std::max(gelu_error, std::fabs(GeluElement(x) - gelu) / (1 + std::fabs(gelu)));
    grad_error = std::max(grad_error, std::fabs(GeluGradElement(x, 1.0f) - grad));
  }
  INFO("tanh " << tanh_error << ", gelu " << gelu_error << ", gelu' " << grad_error);
  CHECK(tanh_error < 2e-7);
  CHECK(gelu_error < 1e-6);
  CHECK(grad_error < 2e-6);
  CHECK(TanhF(50.0f) == 1.0f);
  CHECK(TanhF(-50.0f) == -1.0f);
}

// Every NN kernel on one ISA, on fixed inputs; the outputs concatenated.
struct Outputs {
  std::vector<std::vector<float>> all;
};

constexpr int64_t kRows = 37, kH = 83, kS = 19, kMatrices = 3, kVocab = 101, kSeq = 5;

Outputs RunAll(const cpu::NnKernelTable& k) {
  Outputs o;
  const std::vector<float> x = RandomFloats(kRows * kH, 1, 2.0f), dy = RandomFloats(kRows * kH, 2, 1.0f);
  std::vector<float> gamma = RandomFloats(kH, 3, 1.0f), beta = RandomFloats(kH, 4, 1.0f);
  std::vector<float> y(kRows * kH), stats(2 * kRows), dx(kRows * kH), dg(kH, 0.5f), db(kH, -0.5f);
  k.layer_norm_forward(x.data(), gamma.data(), beta.data(), kRows, kH, y.data(), stats.data());
  k.layer_norm_backward(dy.data(), x.data(), stats.data(), gamma.data(), kRows, kH, dx.data(),
                        dg.data(), db.data());
  o.all.insert(o.all.end(), {y, stats, dx, dg, db});

  std::vector<float> gelu(x.size()), dgelu(x.size());
  k.gelu_forward(x.data(), gelu.data(), x.size());
  k.gelu_backward(x.data(), dy.data(), dgelu.data(), x.size());
  o.all.insert(o.all.end(), {gelu, dgelu});

  std::vector<float> scores = RandomFloats(kMatrices * kS * kS, 5, 3.0f);
  k.causal_softmax_forward(scores.data(), kMatrices, kS);
  std::vector<float> dp = RandomFloats(scores.size(), 6, 1.0f);
  k.causal_softmax_backward(scores.data(), dp.data(), kMatrices, kS);
  o.all.insert(o.all.end(), {scores, dp});

  const std::vector<float> logits = RandomFloats(kRows * kVocab, 7, 4.0f);
  std::vector<float> targets(kRows), dl(logits.size()), losses(kRows);
  for (int64_t r = 0; r < kRows; ++r) targets[r] = float((r * 13) % kVocab);
  k.cross_entropy(logits.data(), targets.data(), kRows, kVocab, 1.0f / kRows, dl.data(),
                  losses.data());
  o.all.insert(o.all.end(), {dl, losses});

  std::vector<float> bcast(kRows * kH), colsum(kH, 1.0f);
  k.broadcast_rows(beta.data(), kRows, kH, bcast.data());
  k.column_sum(x.data(), kRows, kH, colsum.data());
  o.all.insert(o.all.end(), {bcast, colsum});

  const std::vector<float> wte = RandomFloats(kVocab * kH, 8, 1.0f), wpe = RandomFloats(kSeq * kH, 9, 1.0f);
  std::vector<float> emb(kRows * kH), dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  std::vector<float> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[r] = float((r * 7) % 4);  // repeated ids
  k.embedding_forward(ids.data(), wte.data(), 0, kVocab, wpe.data(), kRows, kSeq, kH, emb.data());
  k.embedding_backward(ids.data(), dy.data(), kRows, kSeq, kH, 0, kVocab, dwte.data(), dwpe.data());
  o.all.insert(o.all.end(), {emb, dwte, dwpe});
  return o;
}

TEST_CASE("the NN kernels return the same bits on every ISA", "[nn]") {
  const Outputs generic = RunAll(cpu::NnKernels(cpu::Isa::kGeneric));
  for (cpu::Isa isa : cpu::SupportedIsas()) {
    INFO("isa " << cpu::IsaName(isa));
    const Outputs other = RunAll(cpu::NnKernels(isa));
    REQUIRE(other.all.size() == generic.all.size());
    for (size_t i = 0; i < generic.all.size(); ++i) {
      INFO("output " << i);
      CHECK(SameBits(other.all[i], generic.all[i]));
    }
  }
}

TEST_CASE("LayerNorm forward and backward match a double-precision reference", "[nn]") {
  const cpu::NnKernelTable& k = cpu::NnKernels();
  const std::vector<float> x = RandomFloats(kRows * kH, 11, 3.0f), dy = RandomFloats(kRows * kH, 12, 1.0f);
  const std::vector<float> gamma = RandomFloats(kH, 13, 1.0f), beta = RandomFloats(kH, 14, 1.0f);
  std::vector<float> y(x.size()), stats(2 * kRows), dx(x.size()), dg(kH, 0.0f), db(kH, 0.0f);
  k.layer_norm_forward(x.data(), gamma.data(), beta.data(), kRows, kH, y.data(), stats.data());
  k.layer_norm_backward(dy.data(), x.data(), stats.data(), gamma.data(), kRows, kH, dx.data(),
                        dg.data(), db.data());
  std::vector<double> ref_dg(kH, 0.0), ref_db(kH, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < kH; ++i) mean += x[r * kH + i];
    mean /= kH;
    for (int64_t i = 0; i < kH; ++i) var += (x[r * kH + i] - mean) * (x[r * kH + i] - mean);
    var /= kH;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    CHECK(stats[2 * r] == Approx(mean).margin(1e-6));
    CHECK(stats[2 * r + 1] == Approx(rstd).epsilon(1e-6));
    double a = 0, b = 0;
    for (int64_t i = 0; i < kH; ++i) {
      const double xhat = (x[r * kH + i] - mean) * rstd;
      CHECK(y[r * kH + i] == Approx(xhat * gamma[i] + beta[i]).margin(1e-5));
      a += dy[r * kH + i] * gamma[i];
      b += dy[r * kH + i] * gamma[i] * xhat;
      ref_dg[i] += dy[r * kH + i] * xhat;
      ref_db[i] += dy[r * kH + i];
    }
    a /= kH;
    b /= kH;
    for (int64_t i = 0; i < kH; ++i) {
      const double xhat = (x[r * kH + i] - mean) * rstd;
      CHECK(dx[r * kH + i] == Approx(rstd * (dy[r * kH + i] * gamma[i] - a - xhat * b)).margin(1e-5));
    }
  }
  for (int64_t i = 0; i < kH; ++i) {
    CHECK(dg[i] == Approx(ref_dg[i]).margin(1e-4));
    CHECK(db[i] == Approx(ref_db[i]).margin(1e-4));
  }
}

TEST_CASE("the causal softmax normalises the first i + 1 entries of row i", "[nn]") {
  const cpu::NnKernelTable& k = cpu::NnKernels();
  const std::vector<float> scores = RandomFloats(kMatrices * kS * kS, 21, 5.0f);
  std::vector<float> p = scores;
  k.causal_softmax_forward(p.data(), kMatrices, kS);
  const std::vector<float> g = RandomFloats(p.size(), 22, 1.0f);
  std::vector<float> d = g;
  k.causal_softmax_backward(p.data(), d.data(), kMatrices, kS);
  for (int64_t row = 0; row < kMatrices * kS; ++row) {
    const int64_t n = row % kS + 1;
    double max = -1e30, sum = 0;
    for (int64_t j = 0; j < n; ++j) max = std::max(max, double(scores[row * kS + j]));
    for (int64_t j = 0; j < n; ++j) sum += std::exp(scores[row * kS + j] - max);
    double dot = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double ref = std::exp(scores[row * kS + j] - max) / sum;
      CHECK(p[row * kS + j] == Approx(ref).margin(1e-6));
      dot += double(g[row * kS + j]) * ref;
    }
    for (int64_t j = 0; j < n; ++j) {
      const double ref = std::exp(scores[row * kS + j] - max) / sum;
      CHECK(d[row * kS + j] == Approx(ref * (g[row * kS + j] - dot)).margin(1e-6));
    }
    for (int64_t j = n; j < kS; ++j) {
      CHECK(p[row * kS + j] == 0.0f);
      CHECK(d[row * kS + j] == 0.0f);
    }
  }
}

TEST_CASE("cross-entropy losses and gradients match log-sum-exp in double", "[nn]") {
  const cpu::NnKernelTable& k = cpu::NnKernels();
  const std::vector<float> logits = RandomFloats(kRows * kVocab, 31, 6.0f);
  std::vector<float> targets(kRows), dl(logits.size()), losses(kRows);
  for (int64_t r = 0; r < kRows; ++r) targets[r] = float((r * 29) % kVocab);
  const float scale = 1.0f / kRows;
  k.cross_entropy(logits.data(), targets.data(), kRows, kVocab, scale, dl.data(), losses.data());
  for (int64_t r = 0; r < kRows; ++r) {
    double max = -1e30, sum = 0;
    for (int64_t j = 0; j < kVocab; ++j) max = std::max(max, double(logits[r * kVocab + j]));
    for (int64_t j = 0; j < kVocab; ++j) sum += std::exp(logits[r * kVocab + j] - max);
    const double lse = std::log(sum) + max;
    const int64_t t = static_cast<int64_t>(targets[r]);
    CHECK(losses[r] == Approx(lse - logits[r * kVocab + t]).epsilon(1e-6).margin(1e-5));
    double row_sum = 0;
    for (int64_t j = 0; j < kVocab; ++j) {
      const double ref = (std::exp(logits[r * kVocab + j] - lse) - (j == t ? 1 : 0)) * scale;
      CHECK(dl[r * kVocab + j] == Approx(ref).margin(1e-7));
      row_sum += dl[r * kVocab + j];
    }
    CHECK(std::fabs(row_sum) < 1e-6);  // softmax sums to one
  }
}

TEST_CASE("column sums add pairwise: every ISA follows the shared order, within 2 ulp",
          "[nn]") {
  // gpt-tiny's bias gradients: 8 x 128 rows; 37 columns (not a tile's
  // multiple); and a row count that is neither a block's nor a power of 2.
  for (int64_t rows : {int64_t{1024}, int64_t{1000}, int64_t{3}}) {
    INFO("rows " << rows);
    const int64_t cols = 37;
    // Positive terms: no cancellation, so ulps of the result measure the
    // summation order alone.
    std::vector<float> x = RandomFloats(rows * cols, 21, 1.0f);
    for (float& v : x) v = std::fabs(v);
    for (cpu::Isa isa : cpu::SupportedIsas()) {
      INFO("isa " << cpu::IsaName(isa));
      std::vector<float> sum(cols, 0.5f);
      cpu::NnKernels(isa).column_sum(x.data(), rows, cols, sum.data());
      double worst = 0, sequential_worst = 0;
      for (int64_t c = 0; c < cols; ++c) {
        // The order the CUDA twin runs, column by column.
        CHECK(sum[c] == 0.5f + PairwiseColumnSum(x.data(), rows, cols, c));
        double exact = 0;
        float sequential = 0;
        for (int64_t r = 0; r < rows; ++r) {
          exact += x[r * cols + c];
          sequential += x[r * cols + c];
        }
        const float pairwise = PairwiseColumnSum(x.data(), rows, cols, c);
        worst = std::max(worst, Ulps(pairwise, exact));
        sequential_worst = std::max(sequential_worst, Ulps(sequential, exact));
      }
      INFO("worst " << worst << " ulp pairwise, " << sequential_worst << " in row order");
      CHECK(worst <= 2.0);  // measured 1.07-1.94; row order 12.7-13.4
      if (rows == 1024) CHECK(sequential_worst > 4 * worst);
    }
  }
}

TEST_CASE("bias, column-sum and embedding kernels are exact", "[nn]") {
  const cpu::NnKernelTable& k = cpu::NnKernels();
  const std::vector<float> b = {1.5f, -2.0f, 0.25f};
  std::vector<float> y(4 * 3);
  k.broadcast_rows(b.data(), 4, 3, y.data());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) CHECK(y[r * 3 + c] == b[c]);
  }
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<float> sum = {10, 20, 30};
  k.column_sum(x.data(), 2, 3, sum.data());
  CHECK(sum == std::vector<float>{15, 27, 39});

  // vocab 3, seq 2, h 2; ids [2, 0, 2, 2] (rows 0..3, positions 0, 1, 0, 1).
  const std::vector<float> wte = {0, 1, 10, 11, 20, 21}, wpe = {100, 200, 300, 400};
  const std::vector<float> ids = {2, 0, 2, 2};
  std::vector<float> out(8);
  k.embedding_forward(ids.data(), wte.data(), 0, 3, wpe.data(), 4, 2, 2, out.data());
  CHECK(out == std::vector<float>{120, 221, 300, 401, 120, 221, 320, 421});
  const std::vector<float> dout = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> dwte(6, 0.0f), dwpe(4, 0.0f);
  k.embedding_backward(ids.data(), dout.data(), 4, 2, 2, 0, 3, dwte.data(), dwpe.data());
  CHECK(dwte == std::vector<float>{3, 4, 0, 0, 13, 16});
  CHECK(dwpe == std::vector<float>{6, 8, 10, 12});

  // In vocabulary tiles [0, 2) and [2, 3): each tile writes only its
  // tokens' rows (a sentinel marks the others), and adds only into its own
  // rows of the table; the position table once, with the first tile.
  std::vector<float> tiled(8, -1.0f);
  k.embedding_forward(ids.data(), wte.data(), 0, 2, wpe.data(), 4, 2, 2, tiled.data());
  CHECK(tiled == std::vector<float>{-1, -1, 300, 401, -1, -1, -1, -1});
  k.embedding_forward(ids.data(), wte.data() + 2 * 2, 2, 3, wpe.data(), 4, 2, 2, tiled.data());
  CHECK(tiled == out);
  std::vector<float> dtile0(4, 0.0f), dtile1(2, 0.0f), dpos(4, 0.0f);
  k.embedding_backward(ids.data(), dout.data(), 4, 2, 2, 0, 2, dtile0.data(), dpos.data());
  k.embedding_backward(ids.data(), dout.data(), 4, 2, 2, 2, 3, dtile1.data(), nullptr);
  CHECK(dtile0 == std::vector<float>{3, 4, 0, 0});
  CHECK(dtile1 == std::vector<float>{13, 16});
  CHECK(dpos == dwpe);
}

struct Host {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
};

Host MakeHost(Backend backend = Backend::kHost) {
  auto device = CreateDevice({backend, 0, 64 * kMiB}).value();
  auto stream = device->CreateStream().value();
  return {std::move(device), std::move(stream)};
}

TEST_CASE("Gemm computes every transpose combination on host", "[nn][gemm]") {
  Host h = MakeHost();
  const int64_t m = 5, n = 7, k = 3;
  const std::vector<float> a = RandomFloats(m * k, 41, 1.0f), b = RandomFloats(k * n, 42, 1.0f);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      // Store A as [m, k] or, transposed, [k, m]; likewise B.
      std::vector<float> as(m * k), bs(k * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t p = 0; p < k; ++p) (ta ? as[p * m + i] : as[i * k + p]) = a[i * k + p];
      }
      for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < n; ++j) (tb ? bs[j * k + p] : bs[p * n + j]) = b[p * n + j];
      }
      std::vector<float> c(m * n, 1.0f);
      REQUIRE(Gemm(*h.device, *h.stream, ta, tb, m, n, k, 2.0f, as.data(), ta ? m : k, bs.data(),
                   tb ? k : n, 0.5f, c.data(), n)
                  .ok());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0.5;
          for (int64_t p = 0; p < k; ++p) ref += 2.0 * a[i * k + p] * b[p * n + j];
          CHECK(c[i * n + j] == Approx(ref).margin(1e-5));
        }
      }
    }
  }
}

TEST_CASE("nn ops check their arguments and ids", "[nn]") {
  Host h = MakeHost();
  float c = 0;
  const absl::Status bad_ld =
      Gemm(*h.device, *h.stream, false, false, 2, 3, 4, 1.0f, &c, 3, &c, 3, 0.0f, &c, 3);
  CHECK(bad_ld.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad_ld.message()) == "Gemm: leading dimensions (3, 3, 3) shorter than the rows");
  const absl::Status negative = LayerNormForward(*h.device, *h.stream, &c, &c, &c, -1, 4, &c, &c);
  CHECK(negative.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(negative.message()) == "LayerNormForward: a dimension is -1 (< 0)");
  // An empty vocabulary tile.
  const absl::Status empty_tile =
      EmbeddingBackward(*h.device, *h.stream, &c, &c, 1, 1, 1, 3, 3, &c, nullptr);
  CHECK(empty_tile.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(empty_tile.message()) ==
        "EmbeddingBackward: expected a vocabulary tile [begin, end) with 0 <= begin < end, got "
        "[3, 3)");

  const std::vector<float> ids = {0, 3, 2.5f, 9};
  CHECK(CheckIds(*h.device, *h.stream, ids.data(), 2, 4, "token").ok());
  const absl::Status fraction = CheckIds(*h.device, *h.stream, ids.data(), 4, 4, "token");
  CHECK(fraction.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(fraction.message()) == "token 2 is 2.5; expected an id in 0..3");
  const absl::Status range = CheckIds(*h.device, *h.stream, ids.data() + 3, 1, 4, "target");
  CHECK(std::string(range.message()) == "target 0 is 9; expected an id in 0..3");

  // Meta validates shapes but touches no memory (the pointers are null).
  Host meta = MakeHost(Backend::kMeta);
  CHECK(Gemm(*meta.device, *meta.stream, false, false, 2, 3, 4, 1.0f, nullptr, 4, nullptr, 3,
             0.0f, nullptr, 3)
            .ok());
  CHECK(CheckIds(*meta.device, *meta.stream, nullptr, 10, 4, "token").ok());
  const absl::StatusOr<double> loss =
      CrossEntropy(*meta.device, *meta.stream, nullptr, nullptr, 4, 10, 0.25f, nullptr);
  REQUIRE(loss.ok());
  CHECK(*loss == 0.0);
}

TEST_CASE("CrossEntropy as an op returns the summed row losses", "[nn]") {
  Host h = MakeHost();
  const std::vector<float> logits = {0, 0, 0, 0, std::log(3.0f), 0};  // 2 rows of vocab 3
  const std::vector<float> targets = {1, 1};
  std::vector<float> dl(6);
  const absl::StatusOr<double> sum =
      CrossEntropy(*h.device, *h.stream, logits.data(), targets.data(), 2, 3, 0.5f, dl.data());
  REQUIRE(sum.ok());
  // Row 0 is uniform: ln 3. Row 1: logsumexp = ln(1 + 3 + 1) = ln 5, minus
  // its target's logit ln 3. The sum is ln 5.
  CHECK(*sum == Approx(std::log(5.0)).epsilon(1e-6));
  CHECK(dl[1] == Approx((1.0 / 3 - 1) * 0.5).margin(1e-7));
  CHECK(dl[4] == Approx((3.0 / 5 - 1) * 0.5).margin(1e-7));
}

}  // namespace
}  // namespace memwall::kernels
