// The training step following a recomputation plan, on real ranks: every
// planner's losses and weights equal the run without recomputation bit for
// bit, and the activation peak the allocator records equals the plan's
// prediction to the byte (host, and meta at a scale this machine could not
// hold), with the parameters' peak unchanged.
#include <cmath>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/values.h"
#include "checkpointing/planner.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::SameBits;

using testing::World;

enum class Model { kMlp, kGpt };

struct Result {
  std::vector<float> losses;
  std::vector<float> weights;
  int64_t activation_peak = 0;
  int64_t parameter_peak = 0;
  Chain chain;
  RecomputationPlan plan;
};

// "least+offload": the least-peak plan with offload allowed (it moves
// segment inputs to the pinned pool).
const char* const kPlanners[] = {"none",      "full",    "uniform:2",    "sqrt",
                                 "selective", "optimal", "least+offload"};

// A batch for `rank`: MLP regression rows or GPT token windows.
Batch MakeBatch(Device& device, Model model, const GptConfig& c, int rank, int step) {
  std::vector<float> input, target;
  std::vector<int64_t> in_shape, target_shape;
  if (model == Model::kMlp) {
    const int rows = 12;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < 16; ++i) input.push_back(std::sin(0.3f * (rank * rows + r + step) + i));
      for (int o = 0; o < 4; ++o) target.push_back(std::cos(0.2f * (rank * rows + r) + o));
    }
    in_shape = {rows, 16};
    target_shape = {rows, 4};
  } else {
    const int64_t sequences = 2, n = sequences * c.seq;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = (rank * n + i) * 7 + step * 3;
      input.push_back(float(t % c.vocab));
      target.push_back(float((t + 5) % c.vocab));
    }
    in_shape = {sequences, c.seq};
    target_shape = {n};
  }
  Batch b;
  b.input = Tensor::FromHost(device, input, in_shape, MemoryCategory::kOther, "data").value();
  b.target = Tensor::FromHost(device, target, target_shape, MemoryCategory::kOther, "data").value();
  return b;
}

Result Train(Model model, const std::string& planner, int stage, bool bf16) {
  const GptConfig c = ParseGptModel("gpt-tiny:layers=4").value();
  DeviceOptions device_options{Backend::kHost, 0, 256 * kMiB};
  device_options.pinned_capacity_bytes = 64 * kMiB;
  auto device = CreateDevice(device_options).value();
  ShardingOptions options;
  options.zero.stage = stage;
  options.zero.reduce_bucket_size = model == Model::kMlp ? 2000 : 20000;
  options.bf16 = bf16;
  options.optimizer.lr = 3e-3f;
  options.gradient_accumulation_steps = 2;
  auto layers = model == Model::kMlp ? MakeMlp({16, 48, 48, 48, 48, 48, 4}) : MakeGpt(c).value();
  std::unique_ptr<LossFunction> loss;
  if (model == Model::kMlp) {
    loss = std::make_unique<MseLoss>();
  } else {
    loss = std::make_unique<CrossEntropyLoss>();
  }
  auto trainer =
      Trainer::Create(std::move(layers), std::move(loss), options, *device, World(), 5).value();
  const Batch probe = MakeBatch(*device, model, c, 0, 0);
  Result r;
  r.chain = trainer->ChainFor(probe.input.shape()).value();
  const Chain& chain = r.chain;
  PlannerOptions po;
  po.resolution = 0;
  if (planner == "optimal") {
    // Halfway between the least peak any plan reaches and keeping all.
    const int64_t least = MinimumPeakPlan(chain, po).predicted_peak;
    po.budget = (least + NoRecomputation(chain).predicted_peak) / 2;
  }
  if (planner == "least+offload") {
    r.chain.offload_flops_per_byte = 1e-3;
    po.allow_offload = true;
    r.plan = MinimumPeakPlan(chain, po);
    int offloads = 0;
    for (const Segment& s : r.plan.segments) offloads += s.mode == SegmentMode::kOffload;
    CHECK(offloads > 0);
  } else {
    r.plan = MakePlan(chain, planner, po).value();
  }
  REQUIRE(trainer->SetRecomputationPlan(r.plan, chain).ok());
  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> batches;
    for (int u = 0; u < 2; ++u) {
      batches.push_back(MakeBatch(*device, model, c, World().rank(), 2 * step + u));
    }
    const auto report = trainer->TrainStep(batches);
    REQUIRE(report.ok());
    r.losses.push_back(report->loss);
  }
  r.activation_peak =
      device->allocator().stats().by_category[static_cast<int>(MemoryCategory::kActivation)].peak;
  r.parameter_peak =
      device->allocator().stats().by_category[static_cast<int>(MemoryCategory::kParameter)].peak;
  // What offload held in the pinned pool at most.
  CHECK(device->pinned_allocator()
            ->stats()
            .by_category[static_cast<int>(MemoryCategory::kCheckpointedActivation)]
            .peak == r.plan.offloaded_bytes);
  for (const auto& layer : trainer->layers()) {
    for (const ParameterDecl& d : layer->Parameters()) {
      int64_t numel = 1;
      for (int64_t x : d.shape) numel *= x;
      std::vector<float> w(numel);
      REQUIRE(trainer->optimizer().MasterWeights(layer->name() + "." + d.name, absl::MakeSpan(w)).ok());
      r.weights.insert(r.weights.end(), w.begin(), w.end());
    }
  }
  return r;
}

TEST_CASE("every plan trains bit for bit like no recomputation, at its predicted peak",
          "[recompute]") {
  for (Model model : {Model::kMlp, Model::kGpt}) {
    for (int stage : {0, 3}) {
      for (bool bf16 : {false, true}) {
        if (model == Model::kMlp && bf16) continue;
        const Result reference = Train(model, "none", stage, bf16);
        CHECK(reference.activation_peak == reference.plan.predicted_peak);
        for (const char* planner : kPlanners) {
          INFO((model == Model::kMlp ? "mlp" : "gpt-tiny:layers=4") << ", stage " << stage
               << (bf16 ? ", bf16" : ", f32") << ", planner " << planner);
          const Result r = Train(model, planner, stage, bf16);
          INFO(PlanSummary(r.chain, r.plan));
          CHECK(SameBits(r.losses, reference.losses));
          CHECK(SameBits(r.weights, reference.weights));
          CHECK(r.activation_peak == r.plan.predicted_peak);
          // Every plan keeps at most what "none" keeps; dropping segments'
          // inner outputs always saves, dropping a layer's own saved
          // tensors only where it saves more than its output (not in the
          // MLP, whose layers keep their outputs alone).
          const std::string p = planner;
          CHECK(r.activation_peak <= reference.activation_peak);
          // Recomputing a segment at stage 3 gathers its layers' parameters
          // one layer at a time, as forward does, not the whole segment.
          CHECK(r.parameter_peak == reference.parameter_peak);
          const bool saves = p == "uniform:2" || p == "sqrt" || p == "optimal" ||
                             p == "least+offload" ||
                             (model == Model::kGpt && (p == "full" || p == "selective"));
          if (saves) CHECK(r.activation_peak < reference.activation_peak);
        }
      }
    }
  }
}

TEST_CASE("meta: GPT-2 1.5B's activation peak under each plan is the predicted one",
          "[recompute][meta]") {
  // Each process plays rank 0 of 64 on its own meta device (no MPI).
  for (const char* planner : kPlanners) {
    INFO(planner);
    DeviceOptions device_options{Backend::kMeta, 0, 4096 * kGiB};
    device_options.pinned_capacity_bytes = 4096 * kGiB;
    auto device = CreateDevice(device_options).value();
    auto comm = SimulatedCommunicator::Create(0, 64).value();
    const GptConfig c = GptPreset("gpt2-1.5b").value();
    ShardingOptions options;
    options.zero.stage = 3;
    options.bf16 = true;
    options.zero.reduce_bucket_size = 50'000'000;
    auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                   options, *device, *comm, 1)
                       .value();
    const int64_t batch = 4;
    Chain chain = trainer->ChainFor({batch, c.seq}).value();
    PlannerOptions po;
    po.budget = std::string(planner) == "optimal" ? 8 * kGiB : 0;
    RecomputationPlan plan;
    if (std::string(planner) == "least+offload") {
      chain.offload_flops_per_byte = 1e-3;
      po.allow_offload = true;
      plan = MinimumPeakPlan(chain, po);
    } else {
      plan = MakePlan(chain, planner, po).value();
    }
    REQUIRE(trainer->SetRecomputationPlan(plan, chain).ok());
    Batch b;
    b.input = Tensor::Empty(*device, DType::kF32, {batch, c.seq}, MemoryCategory::kOther, "data").value();
    b.target = Tensor::Empty(*device, DType::kF32, {batch * c.seq}, MemoryCategory::kOther, "data").value();
    REQUIRE(trainer->TrainStep({&b, 1}).ok());
    const int64_t measured =
        device->allocator().stats().by_category[static_cast<int>(MemoryCategory::kActivation)].peak;
    std::printf("gpt2-1.5b, batch 4, bf16, meta: %-10s activation peak %s (predicted %s), "
                "extra forward %.3g FLOPs\n",
                planner, FormatBytes(measured).c_str(), FormatBytes(plan.predicted_peak).c_str(),
                plan.extra_flops);
    std::fflush(stdout);
    CHECK(measured == plan.predicted_peak);
    if (std::string(planner) == "optimal") CHECK(measured <= 8 * kGiB);
  }
}

TEST_CASE("a plan that does not fit the model is rejected by name", "[recompute][errors]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto trainer = Trainer::Create(MakeMlp({4, 8, 4}), std::make_unique<MseLoss>(),
                                 ShardingOptions(), *device, World(), 1)
                     .value();
  const Chain chain = trainer->ChainFor({2, 4}).value();
  RecomputationPlan plan = FullRecomputation(chain);
  plan.segments[1].mode = SegmentMode::kSelective;
  const absl::Status bad = trainer->SetRecomputationPlan(plan, chain);
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.message() ==
        "plan 'full': segment 1 is selective; expected a single layer that offers selective "
        "recomputation (layer 'gelu0' does not)");
  Chain shorter = chain;
  shorter.layers.pop_back();
  CHECK(trainer->SetRecomputationPlan(NoRecomputation(shorter), shorter).message() ==
        "recomputation plan 'none': for 2 layers; the model has 3");
}

}  // namespace
}  // namespace memwall
