// Hyperparameter groups and frozen parameters on real MPI ranks (mpirun -np
// 1, 2, 4), at every ZeRO stage.
//
// The first Adam step has a closed form independent of memwall's kernels:
// from zero moments, the bias-corrected update of a gradient g is
// g / (|g| + eps), so AdamW moves a weight w to
//   w * (1 - lr * wd) - lr * g / (|g| + eps),
// which the tests compute in double and compare within 1e-6 relative.
#include <cmath>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/units.h"
#include "sharding/sharded_optimizer.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  bool trainable;
  int hyper;
};

// An embedding that is frozen, two layers whose weights decay and whose
// biases (hyperparameter group 1) do not, as a fine-tuning run has them.
const std::vector<Param> kModel = {
    {"embed.weight", {37, 5}, false, 0}, {"fc1.weight", {5, 7}, true, 0},
    {"fc1.bias", {7}, true, 1},          {"fc2.weight", {7, 9}, true, 0},
    {"fc2.bias", {9}, true, 1},
};

float InitialValue(size_t p, int64_t j) { return 0.1f * std::sin(0.3f * j + 1.7f * p); }

// Rank r's gradient; its mean over ranks is what the update sees.
float Grad(size_t p, int64_t j, int r) {
  return std::ldexp(std::floor(std::cos(0.41f * j + 0.9f * p + 0.5f * r) * 512.0f), -10);
}

double MeanGrad(size_t p, int64_t j, int ranks) {
  double sum = 0;
  for (int r = 0; r < ranks; ++r) sum += Grad(p, j, r);
  return sum / ranks;
}

ShardingOptions Options(int stage) {
  ShardingOptions o;
  o.zero.stage = stage;
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.1f;
  return o;
}

struct Run {
  std::unique_ptr<Device> device;
  std::unique_ptr<ShardedOptimizer> opt;
};

// Explicit groups, one per layer, as the PyTorch front end registers
// modules (the frozen embedding is a group of its own).
Run Start(const ShardingOptions& options) {
  Run run;
  run.device = CreateDevice(DeviceOptions{Backend::kHost, 0, 64 * kMiB}).value();
  run.opt = ShardedOptimizer::Create(options, *run.device, World()).value();
  std::vector<std::pair<std::string, std::vector<ShardedOptimizer::ParameterInit>>> groups;
  for (size_t p = 0; p < kModel.size(); ++p) {
    const std::string layer = kModel[p].name.substr(0, kModel[p].name.find('.'));
    if (groups.empty() || groups.back().first != layer) groups.push_back({layer, {}});
    ShardedOptimizer::ParameterInit init{kModel[p].name, kModel[p].shape, {}, kModel[p].trainable,
                                         kModel[p].hyper};
    for (int64_t j = 0; j < NumElements(kModel[p].shape); ++j) {
      init.values.push_back(InitialValue(p, j));
    }
    groups.back().second.push_back(std::move(init));
  }
  for (auto& [name, params] : groups) {
    REQUIRE(run.opt->AddParameterGroup(name, std::move(params)).ok());
  }
  REQUIRE(run.opt->Finalize().ok());
  return run;
}

// One micro-batch's backward: every trainable group gets this rank's
// gradients; frozen ones are skipped, as autograd skips them.
void Backward(ShardedOptimizer& opt) {
  const int r = World().rank();
  for (int g = static_cast<int>(opt.layout().groups.size()) - 1; g >= 0; --g) {
    if (!opt.layout().groups[g].trainable) continue;
    REQUIRE(opt.GatherParameters(g).ok());
    REQUIRE(opt.AcquireGradients(g).ok());
    for (int p : opt.layout().groups[g].parameters) {
      std::vector<float> grad(NumElements(kModel[p].shape));
      for (size_t j = 0; j < grad.size(); ++j) grad[j] = Grad(p, j, r);
      REQUIRE(opt.AddGradient(kModel[p].name, grad).ok());
    }
    REQUIRE(opt.ReduceGradients(g).ok());
    REQUIRE(opt.ReleaseParameters(g).ok());
  }
}

std::vector<float> Weights(ShardedOptimizer& opt, size_t p) {
  std::vector<float> w(NumElements(kModel[p].shape));
  REQUIRE(opt.MasterWeights(kModel[p].name, absl::MakeSpan(w)).ok());
  return w;
}

TEST_CASE("each hyperparameter group updates with its own values, as set before the step",
          "[zero][param_groups]") {
  const int ranks = World().world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage << " on " << ranks << " ranks");
    Run run = Start(Options(stage));
    ShardedOptimizer& opt = *run.opt;
    REQUIRE(opt.num_hyper_groups() == 2);
    CHECK(opt.hyperparameters(1).lr == 1e-2f);
    CHECK(opt.hyperparameters(1).weight_decay == 0.1f);
    // A warmup schedule's first value for the weights; no decay for biases.
    Hyperparameters weights = opt.hyperparameters(0), biases = weights;
    weights.lr = 2.5e-3f;
    biases.lr = 4e-3f;
    biases.weight_decay = 0.0f;
    REQUIRE(opt.SetHyperparameters(0, weights).ok());
    REQUIRE(opt.SetHyperparameters(1, biases).ok());
    Backward(opt);
    REQUIRE(opt.Step().value().applied);
    for (size_t p = 0; p < kModel.size(); ++p) {
      INFO(kModel[p].name);
      const Hyperparameters& h = kModel[p].hyper == 0 ? weights : biases;
      const std::vector<float> w = Weights(opt, p);
      for (size_t j = 0; j < w.size(); ++j) {
        const double w0 = InitialValue(p, j);
        double want = w0;  // frozen: untouched
        if (kModel[p].trainable) {
          const double g = MeanGrad(p, j, ranks);
          want = w0 * (1 - double(h.lr) * h.weight_decay) - h.lr * g / (std::fabs(g) + h.eps);
        }
        REQUIRE(std::fabs(w[j] - want) <= 1e-6 * (1 + std::fabs(want)));
      }
    }
  }
}

TEST_CASE("frozen parameters hold no gradient and no optimizer state", "[zero][frozen]") {
  const int64_t n = World().world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage << " on " << n << " ranks");
    Run run = Start(Options(stage));
    ShardedOptimizer& opt = *run.opt;
    const FlatLayout& layout = opt.layout();
    int64_t trainable = 0, frozen = 0;  // padded elements
    for (const FlatGroup& g : layout.groups) (g.trainable ? trainable : frozen) += g.padded_numel;
    REQUIRE(frozen == layout.groups[0].padded_numel);
    REQUIRE(!layout.groups[0].trainable);
    const auto bytes = [&](MemoryCategory c) {
      return run.device->allocator().stats().by_category[static_cast<int>(c)].current;
    };
    // f32: 4 bytes per element of parameters, gradients, and Adam's two
    // moments (the parameters are the master weights); frozen elements
    // only the parameter's.
    const int64_t all = trainable + frozen;
    CHECK(bytes(MemoryCategory::kParameter) == 4 * (stage == 3 ? all / n : all));
    CHECK(bytes(MemoryCategory::kGradient) == 4 * (stage >= 2 ? trainable / n : trainable));
    CHECK(bytes(MemoryCategory::kOptimizerState) == 8 * (stage == 0 ? trainable : trainable / n));

    const absl::StatusOr<ShardedOptimizer::View> grad = opt.Gradient("embed.weight");
    CHECK(grad.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(grad.status().message() == "gradient of 'embed.weight': the parameter is frozen and has none");
    const absl::Status acquire = opt.AcquireGradients(0);
    CHECK(acquire.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(acquire.message() == "AcquireGradients: group 0 ('embed') is frozen and has no gradients");

    Backward(opt);
    REQUIRE(opt.Step().value().applied);
    const std::vector<float> embed = Weights(opt, 0);
    for (size_t j = 0; j < embed.size(); ++j) REQUIRE(embed[j] == InitialValue(0, j));
    // Checkpoint state: the master weights are the parameters; no moments.
    std::vector<float> moment(layout.groups[0].padded_numel, 1.0f);
    REQUIRE(opt.GatherState(0, 1, absl::MakeSpan(moment)).ok());
    for (float x : moment) REQUIRE(x == 0.0f);
  }
}

TEST_CASE("a group mixing trainable and frozen parameters is refused", "[zero][frozen][errors]") {
  auto device = CreateDevice(DeviceOptions{Backend::kHost, 0, 64 * kMiB}).value();
  auto opt = ShardedOptimizer::Create(Options(3), *device, World()).value();
  std::vector<ShardedOptimizer::ParameterInit> block = {
      {"block.weight", {4}, {1, 2, 3, 4}, /*trainable=*/true},
      {"block.bias", {2}, {1, 2}, /*trainable=*/false},
  };
  REQUIRE(opt->AddParameterGroup("block", std::move(block)).ok());
  const absl::Status finalized = opt->Finalize();
  CHECK(finalized.code() == absl::StatusCode::kInvalidArgument);
  CHECK(finalized.message() ==
        "parameter 'block.bias': group 'block' mixes trainable and frozen parameters "
        "('block.bias' is frozen); put frozen ones in a group of their own");
}

TEST_CASE("bad hyperparameters are refused and change nothing", "[zero][param_groups][errors]") {
  Run run = Start(Options(2));
  ShardedOptimizer& opt = *run.opt;
  Hyperparameters h = opt.hyperparameters(0);
  absl::Status s = opt.SetHyperparameters(2, h);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "SetHyperparameters: group 2 of 2 (0..1)");
  h.beta2 = 1.0f;
  s = opt.SetHyperparameters(0, h);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "SetHyperparameters(0): adam beta2: expected 0 <= beta2 < 1, got 1");
  CHECK(opt.hyperparameters(0).beta2 == 0.999f);
  auto fresh = ShardedOptimizer::Create(Options(0), *run.device, World()).value();
  std::vector<ShardedOptimizer::ParameterInit> bad = {{"x", {1}, {0.0f}, true, -1}};
  const absl::Status negative = fresh->AddParameterGroup("x", std::move(bad));
  CHECK(negative.code() == absl::StatusCode::kInvalidArgument);
  CHECK(negative.message() == "parameter 'x': hyperparameter group -1; expected >= 0");
}

}  // namespace
}  // namespace memwall
