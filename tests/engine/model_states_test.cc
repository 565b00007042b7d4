// ModelStates, the engine's view of a run's model states, on real MPI ranks
// (mpirun -np 1, 2, 4) at every stage: the views and f32 forms around
// gather/release, one AdamW step from zero state against Adam's closed
// form (Kingma & Ba: m = (1-b1) g, v = (1-b2) g^2, and with bias correction
// the first update is lr * g / (|g| + eps)), the optimizer states gathered
// whole with their padding, the state names torch's AdamW uses, and the
// errors that name the group, state or parameter out of range.
#include "engine/model_states.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/engine.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

const std::vector<float> kWeight = {0.5f, -1.25f, 2.0f, 0.75f, -0.5f, 1.5f};
const std::vector<float> kBias = {0.1f, 0.2f, -0.3f, 0.4f, -0.5f};
// The same on every rank, so the averaged gradient is this one.
const std::vector<float> kWeightGrad = {0.5f, -0.25f, 1.0f, -2.0f, 0.125f, 4.0f};
const std::vector<float> kBiasGrad = {-1.0f, 0.5f, 0.25f, -0.125f, 2.0f};

std::unique_ptr<Engine> Make(int stage) {
  Config config;
  config.zero.stage = stage;
  config.optimizer.lr = 0.01f;
  config.optimizer.weight_decay = 0.0f;
  EngineOptions options;
  options.world = &World();
  options.device_bytes = 16 * kMiB;
  return Engine::Create(options, config,
                        {{"dense", {{"dense.weight", {3, 2}, kWeight}}},
                         {"head", {{"head.bias", {5}, kBias}}}})
      .value();
}

TEST_CASE("the model states a caller reads and writes, at every stage", "[model_states]") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    std::unique_ptr<Engine> engine = Make(stage);
    ModelStates& states = engine->states();
    REQUIRE(states.layout().groups.size() == 2);
    CHECK(states.GroupOf("head.bias").value() == 1);
    CHECK(states.param_dtype() == DType::kF32);
    CHECK(states.state_names() == std::vector<std::string>{"master", "exp_avg", "exp_avg_sq"});

    // Stage 3 holds a shard: the parameter is readable only once gathered.
    const absl::StatusOr<ModelStates::View> early = states.Parameter("dense.weight");
    if (stage == 3) {
      CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK(std::string(early.status().message()) ==
            "parameter 'dense.weight': its group 0 ('dense') is not gathered; call "
            "GatherParameters(0) first");
    } else {
      CHECK(early.ok());
    }
    for (int g : {0, 1}) {
      REQUIRE(states.Gather(g).ok());
      REQUIRE(states.AcquireGradients(g).ok());
    }
    const ModelStates::View weight = states.Parameter("dense.weight").value();
    REQUIRE(weight.numel == 6);
    CHECK(std::vector<float>(static_cast<const float*>(weight.data),
                             static_cast<const float*>(weight.data) + 6) == kWeight);
    std::vector<float> bias(5);
    REQUIRE(states.ReadParameter("head.bias", absl::MakeSpan(bias)).ok());
    CHECK(bias == kBias);
    REQUIRE(states.AddGradient("dense.weight", kWeightGrad).ok());
    REQUIRE(states.AddGradient("head.bias", kBiasGrad).ok());
    for (int g : {1, 0}) {
      REQUIRE(states.ReduceGradients(g).ok());
      REQUIRE(states.Release(g).ok());
    }
    REQUIRE(engine->Step().value().applied);
    CHECK(states.steps_applied() == 1);

    // One step of AdamW from zero state, against the closed form.
    const std::vector<std::pair<const std::vector<float>*, const std::vector<float>*>> groups = {
        {&kWeight, &kWeightGrad}, {&kBias, &kBiasGrad}};
    for (int g = 0; g < 2; ++g) {
      CAPTURE(g);
      const std::vector<float>& p = *groups[g].first;
      const std::vector<float>& grad = *groups[g].second;
      const std::vector<float> master = states.GatherState(g, 0).value();
      const std::vector<float> m = states.GatherState(g, 1).value();
      const std::vector<float> v = states.GatherState(g, 2).value();
      REQUIRE(static_cast<int64_t>(master.size()) == states.layout().groups[g].padded_numel);
      for (size_t j = 0; j < master.size(); ++j) {
        CAPTURE(j);
        if (j >= p.size()) {  // padding: never trained, always zero
          CHECK(master[j] == 0.0f);
          CHECK(m[j] == 0.0f);
          CHECK(v[j] == 0.0f);
          continue;
        }
        // The betas are the config's f32 values (0.9f, 0.999f).
        const double gj = grad[j], b1 = 0.9f, b2 = 0.999f;
        CHECK(m[j] == Approx((1 - b1) * gj).epsilon(1e-6));
        CHECK(v[j] == Approx((1 - b2) * gj * gj).epsilon(1e-6));
        CHECK(master[j] == Approx(p[j] - 0.01 * gj / (std::fabs(gj) + 1e-8)).epsilon(1e-6));
      }
      const std::string name = g == 0 ? "dense.weight" : "head.bias";
      const std::vector<float> named = states.MasterWeights(name).value();
      CHECK(named == std::vector<float>(master.begin(), master.begin() + p.size()));
    }

    // Setting the master weights sets the parameters.
    std::vector<float> set(states.layout().groups[1].padded_numel, 0.0f);
    for (int j = 0; j < 5; ++j) set[j] = 3.0f + j;
    REQUIRE(states.SetState(1, 0, set).ok());
    REQUIRE(states.Gather(1).ok());
    REQUIRE(states.ReadParameter("head.bias", absl::MakeSpan(bias)).ok());
    CHECK(bias == std::vector<float>{3.0f, 4.0f, 5.0f, 6.0f, 7.0f});
    REQUIRE(states.Release(1).ok());

    // Hyperparameter groups and the counters.
    CHECK(states.num_hyper_groups() == 1);
    CHECK(states.LearningRate(0).value() == 0.01f);
    Hyperparameters h = states.hyperparameters(0);
    h.lr = 0.02f;
    REQUIRE(states.SetHyperparameters(0, h).ok());
    CHECK(states.LearningRate(0).value() == 0.02f);
    ModelStates::Progress progress = states.progress();
    progress.steps_applied = 7;
    progress.steps_skipped = 2;
    states.set_progress(progress);
    CHECK(states.steps_applied() == 7);
    CHECK(states.steps_skipped() == 2);
  }
}

TEST_CASE("what is out of range is named", "[model_states][errors]") {
  std::unique_ptr<Engine> engine = Make(2);
  ModelStates& states = engine->states();
  const absl::StatusOr<std::vector<float>> group = states.GatherState(2, 0);
  CHECK(group.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(group.status().message()) == "gather_state: group 2 of 2");
  const absl::StatusOr<std::vector<float>> state = states.GatherState(0, 3);
  CHECK(state.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(state.status().message()) == "GatherState: state 3 of 3 kept by this optimizer");
  const absl::StatusOr<std::vector<float>> name = states.MasterWeights("dense.kernel");
  CHECK(name.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(name.status().message()) == "parameter 'dense.kernel': not registered");
  const absl::StatusOr<float> rate = states.LearningRate(1);
  CHECK(rate.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(rate.status().message()) == "learning_rate: hyperparameter group 1 of 1");
  Hyperparameters bad = states.hyperparameters(0);
  bad.lr = -1.0f;
  const absl::Status refused = states.SetHyperparameters(0, bad);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()) ==
        "SetHyperparameters(0): adam lr: expected a finite value >= 0, got -1");
  CHECK(states.LearningRate(0).value() == 0.01f);  // unchanged
}

}  // namespace
}  // namespace memwall

namespace memwall {
namespace {

TEST_CASE("train_batch_size is checked against the ranks' global batch", "[model_states]") {
  const int ranks = testing::World().world_size();
  Config config;
  config.train_micro_batch_size_per_gpu = 4;
  config.gradient_accumulation_steps = 2;
  EngineOptions options;
  options.world = &testing::World();
  options.device_bytes = 16 * kMiB;
  config.train_batch_size = 8 * ranks;
  CHECK(Engine::Create(options, config, {{"head", {{"head.bias", {5}, kBias}}}}).ok());
  config.train_batch_size = 8 * ranks + 1;
  const absl::Status wrong =
      Engine::Create(options, config, {{"head", {{"head.bias", {5}, kBias}}}}).status();
  CHECK(wrong.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(wrong.message()) ==
        absl::StrCat("train_batch_size: expected train_micro_batch_size_per_gpu x "
                     "gradient_accumulation_steps x ranks = 4 x 2 x ",
                     ranks, " = ", 8 * ranks, ", got ", 8 * ranks + 1));
}

}  // namespace
}  // namespace memwall
