// Every layer's backward against central finite differences of its forward.
// Tolerances: Linear is linear in each input, so the difference quotient is
// exact up to f32 rounding of the forward (about 1e-7 * |y| * terms / h with
// h = 1e-2): 2e-3. GELU adds an O(h^2) truncation error (h = 1e-3): 2e-3.
#include "models/layers.h"

#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

struct Harness {
  std::unique_ptr<Device> device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  std::unique_ptr<Stream> stream = device->CreateStream().value();
  std::unique_ptr<SimulatedCommunicator> comm = SimulatedCommunicator::Create(0, 1).value();
  std::unique_ptr<ShardedOptimizer> opt;
  std::unique_ptr<LayerContext> ctx;

  explicit Harness(Layer& layer) {
    opt = ShardedOptimizer::Create(ShardingOptions(), *device, *comm).value();
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.7f);
    for (const ParameterDecl& d : layer.Parameters()) {
      std::vector<float> v(NumElements(d.shape));
      for (float& x : v) x = normal(rng);
      REQUIRE(opt->AddParameter(layer.name() + "." + d.name, d.shape, v).ok());
    }
    if (layer.Parameters().empty()) {
      REQUIRE(opt->AddParameter("unused.p", {1}, std::vector<float>{0.0f}).ok());
    }
    REQUIRE(opt->Finalize().ok());
    ctx = std::make_unique<LayerContext>(*device, *stream, *opt, layer.name());
  }

  Tensor Random(std::vector<int64_t> shape, uint32_t seed) {
    Tensor t = Tensor::Empty(*device, DType::kF32, std::move(shape), MemoryCategory::kOther, "test")
                   .value();
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
    return t;
  }
};

// sum(forward(x) * r) in double.
double Objective(Layer& layer, Harness& h, const Tensor& x, const Tensor& r) {
  Tensor y = layer.Forward(*h.ctx, x).value();
  double sum = 0;
  for (int64_t i = 0; i < y.numel(); ++i) sum += double(y.data_as<float>()[i]) * r.data_as<float>()[i];
  return sum;
}

void CheckGradients(Layer& layer, std::vector<int64_t> input_shape, float h_step, double tolerance) {
  Harness h(layer);
  Tensor x = h.Random(input_shape, 1);
  const std::vector<int64_t> out_shape = layer.OutputShape(input_shape).value();
  Tensor r = h.Random(out_shape, 2);
  // Analytic: backward of sum(y * r) is r.
  (void)layer.Forward(*h.ctx, x).value();
  Tensor dx = layer.Backward(*h.ctx, x, r).value();
  auto check = [&](float* value, float analytic, const std::string& what) {
    const float saved = *value;
    *value = saved + h_step;
    const double plus = Objective(layer, h, x, r);
    *value = saved - h_step;
    const double minus = Objective(layer, h, x, r);
    *value = saved;
    const double numeric = (plus - minus) / (2.0 * h_step);
    INFO(what << ": analytic " << analytic << ", numeric " << numeric);
    REQUIRE(std::fabs(analytic - numeric) <= tolerance * std::max(1.0, std::fabs(numeric)));
  };
  for (int64_t i = 0; i < x.numel(); ++i) {
    check(&x.data_as<float>()[i], dx.data_as<float>()[i], "input " + std::to_string(i));
  }
  for (const ParameterDecl& d : layer.Parameters()) {
    auto p = const_cast<float*>(h.ctx->Param(d.name).value());
    const float* g = h.ctx->Grad(d.name).value();
    for (int64_t i = 0; i < NumElements(d.shape); ++i) {
      check(&p[i], g[i], d.name + " " + std::to_string(i));
    }
  }
}

TEST_CASE("Linear's backward matches finite differences", "[layers][gradcheck]") {
  Linear linear("fc", 6, 5);
  CheckGradients(linear, {4, 6}, 1e-2f, 2e-3);
}

TEST_CASE("GELU's backward matches finite differences", "[layers][gradcheck]") {
  Gelu gelu("act");
  CheckGradients(gelu, {3, 7}, 1e-3f, 2e-3);
}

TEST_CASE("the MSE loss gradient matches finite differences", "[layers][gradcheck]") {
  Linear dummy("fc", 1, 1);
  Harness h(dummy);
  Tensor y = h.Random({3, 4}, 5), t = h.Random({3, 4}, 6), g = h.Random({3, 4}, 7);
  MseLoss mse;
  const float loss = mse.Compute(*h.ctx, y, t, g).value();
  double expected = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double e = double(y.data_as<float>()[i]) - t.data_as<float>()[i];
    expected += 0.5 * e * e / 3;
  }
  CHECK(std::fabs(loss - expected) <= 1e-6 * expected);
  Tensor scratch = h.Random({3, 4}, 8);
  for (int64_t i = 0; i < y.numel(); ++i) {
    float& v = y.data_as<float>()[i];
    const float saved = v;
    v = saved + 1e-2f;
    const double plus = mse.Compute(*h.ctx, y, t, scratch).value();
    v = saved - 1e-2f;
    const double minus = mse.Compute(*h.ctx, y, t, scratch).value();
    v = saved;
    REQUIRE(std::fabs((plus - minus) / 2e-2 - g.data_as<float>()[i]) <= 2e-3);
  }
  auto mismatch = mse.Compute(*h.ctx, y, h.Random({4, 3}, 9), g);
  CHECK(std::string(mismatch.status().message()) ==
        "mse loss: the target's shape [4, 3] differs from the output's [3, 4]");
}

TEST_CASE("layers reject inputs of the wrong shape by name", "[layers]") {
  Linear linear("block0.fc1", 16, 8);
  auto shape = linear.OutputShape({4, 15});
  CHECK(shape.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(shape.status().message()) ==
        "layer 'block0.fc1': expected an input of shape [rows, 16], got [4, 15]");
  CHECK(linear.ActivationBytes({4, 16}, DType::kF32) == 4 * 8 * 4);
  CHECK(linear.ActivationBytes({4, 16}, DType::kBF16) == 4 * 8 * 2);
  CHECK(linear.ForwardFlops({4, 16}) == 2.0 * 4 * 16 * 8);
}

}  // namespace
}  // namespace memwall
