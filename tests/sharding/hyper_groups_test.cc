// HyperparameterGroups: which rule each element of a flat group steps
// with, the values set between steps, and the schedule applied to them.
// Expected segment ranges are worked out by hand from the layout below.
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "sharding/flat_layout.h"
#include "sharding/hyper_groups.h"

namespace memwall {
namespace {

// One group of four parameters (bucket 1000, alignment 8, one rank):
// w1 [0, 12), b1 [12, 15), w2 [15, 35), b2 [35, 40), padded to 40.
// Weights in hyperparameter group 0, biases in group 1.
FlatLayout Layout() {
  std::vector<ParameterSpec> specs = {
      {"a.w1", {3, 4}}, {"a.b1", {3}}, {"b.w2", {4, 5}}, {"b.b2", {5}}};
  return BuildFlatLayout(specs, 1, 1000, 8).value();
}
const std::vector<int> kHyperOf = {0, 1, 0, 1};

OptimizerConfig Config() {
  OptimizerConfig c;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  return c;
}

TEST_CASE("the runs of a group map a range to its parameters' rules, padding with the last") {
  const OptimizerConfig config = Config();
  const LrSchedule none;
  HyperparameterGroups hyper(config, none);
  const FlatLayout layout = Layout();
  REQUIRE(layout.groups.size() == 1);
  REQUIRE(layout.groups[0].padded_numel == 40);
  hyper.Build(layout, kHyperOf);
  REQUIRE(hyper.size() == 2);
  CHECK(hyper.values(1).lr == 1e-2f);
  CHECK(hyper.values(1).weight_decay == 0.1f);

  Hyperparameters biases = config;
  biases.weight_decay = 0.0f;
  REQUIRE(hyper.Set(1, biases).ok());
  const std::vector<StateTier::Segment> rules = hyper.StepRules(/*steps_applied=*/4, 0.5f);
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].adam.weight_decay == 0.1f);
  CHECK(rules[1].adam.weight_decay == 0.0f);
  CHECK(rules[0].adam.step == 5);
  CHECK(rules[0].adam.grad_scale == 0.5f);
  CHECK(rules[1].sgd.grad_scale == 0.5f);

  // Elements [10, 38): the end of w1, b1, w2, and b2 up to the padding.
  std::vector<StateTier::Segment> out;
  hyper.SegmentsOf(0, 10, 28, rules, out);
  REQUIRE(out.size() == 4);
  const int64_t begins[] = {0, 2, 5, 25}, counts[] = {2, 3, 20, 3};
  const float decays[] = {0.1f, 0.0f, 0.1f, 0.0f};
  for (int i = 0; i < 4; ++i) {
    INFO("segment " << i);
    CHECK(out[i].begin == begins[i]);
    CHECK(out[i].count == counts[i]);
    CHECK(out[i].adam.weight_decay == decays[i]);
  }
  // The padding [40 - 2, 40) steps with b2's rule.
  hyper.SegmentsOf(0, 38, 2, rules, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].adam.weight_decay == 0.0f);
  CHECK(out[0].count == 2);
}

TEST_CASE("set refuses what the rule refuses and changes nothing") {
  const OptimizerConfig config = Config();
  const LrSchedule none;
  HyperparameterGroups hyper(config, none);
  hyper.Build(Layout(), kHyperOf);
  Hyperparameters bad = config;
  bad.beta1 = 1.0f;
  absl::Status s = hyper.Set(0, bad);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).rfind("SetHyperparameters(0): ", 0) == 0);
  CHECK(hyper.values(0).beta1 == 0.9f);
  s = hyper.Set(2, config);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "SetHyperparameters: group 2 of 2 (0..1)");

  OptimizerConfig sgd = Config();
  sgd.type = OptimizerType::kSgd;
  HyperparameterGroups plain(sgd, none);
  plain.Build(Layout(), kHyperOf);
  Hyperparameters momentum = sgd;
  momentum.momentum = 0.9f;
  s = plain.Set(0, momentum);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "SetHyperparameters(0): sgd momentum 0.9 needs a momentum buffer, which this optimizer "
        "keeps only when the config's momentum is > 0");
}

TEST_CASE("the schedule scales each group's own rate at the step it trains") {
  const OptimizerConfig config = Config();
  LrSchedule cosine;
  cosine.type = LrSchedule::Type::kWarmupCosineLR;
  cosine.warmup_num_steps = 10;
  cosine.warmup_linear = true;
  cosine.total_num_steps = 100;
  HyperparameterGroups hyper(config, cosine);
  hyper.Build(Layout(), kHyperOf);
  Hyperparameters half = config;
  half.lr = 5e-3f;
  REQUIRE(hyper.Set(1, half).ok());
  // Linear warm-up from warmup_min_ratio 0: step k trains at lr * k / 10,
  // in double, rounded once.
  CHECK(hyper.LearningRate(0, 3) == static_cast<float>(static_cast<double>(1e-2f) * (3.0 / 10)));
  CHECK(hyper.LearningRate(1, 3) == static_cast<float>(static_cast<double>(5e-3f) * (3.0 / 10)));
  CHECK(hyper.LearningRate(1, 3) != hyper.LearningRate(0, 3));
  const std::vector<StateTier::Segment> rules = hyper.StepRules(3, 1.0f);
  CHECK(rules[0].adam.lr == hyper.LearningRate(0, 3));
  CHECK(rules[1].sgd.lr == hyper.LearningRate(1, 3));
}

TEST_CASE("segments compare bit for bit") {
  const OptimizerConfig config = Config();
  const LrSchedule none;
  HyperparameterGroups hyper(config, none);
  hyper.Build(Layout(), kHyperOf);
  std::vector<StateTier::Segment> a, b;
  hyper.SegmentsOf(0, 0, 40, hyper.StepRules(0, 1.0f), a);
  hyper.SegmentsOf(0, 0, 40, hyper.StepRules(0, 1.0f), b);
  CHECK(HyperparameterGroups::SameSegments(a, b));
  hyper.SegmentsOf(0, 0, 40, hyper.StepRules(0, 0.5f), b);  // another clipping factor
  CHECK_FALSE(HyperparameterGroups::SameSegments(a, b));
  hyper.SegmentsOf(0, 0, 39, hyper.StepRules(0, 1.0f), b);
  CHECK_FALSE(HyperparameterGroups::SameSegments(a, b));
}

}  // namespace
}  // namespace memwall
