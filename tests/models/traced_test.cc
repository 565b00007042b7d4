// Traced models (models/traced.h): a description's errors name the field;
// a dry run of one holds exactly what it declares, frozen stages hold no
// gradient or optimizer state, and a stage whose input autograd does not
// save lets the engine free that input after its forward.
#include "models/traced.h"

#include <string>

#include "catch2/catch.hpp"
#include "checkpointing/planner.h"
#include "engine/chain.h"
#include "engine/config.h"
#include "engine/dry_run.h"

namespace memwall {
namespace {

// Three stages at f32: an embedding [64, 4] (frozen when asked), a block
// [16, 8] + [128], and a head sharing the embedding (flat groups of 128
// elements' multiples: no padding). Per sample: kept 100, 60 and 40 bytes,
// outputs 16, 16 and (the loss) 4 fixed; the block's forward holds 4000
// bytes of transients besides, the head's backward 5000 (more than any
// other workspace of the step).
std::string Description(bool frozen_embedding, bool block_reads_input,
                        const std::string& dtype = "f32") {
  return std::string(R"({"format": "memwall.traced/1", "model": "Toy", "dtype": ")") + dtype +
         R"(", "attention": "none", "input": [8], "stages": [
    {"name": "embed", "parameters": [{"name": "weight", "shape": [64, 4], "trainable": )" +
         (frozen_embedding ? "false" : "true") + R"(, "group": "embed"}],
     "kept": [0, 100], "output": [0, 16], "input_grad": [0, 0], "forward_flops": [0, 0]},
    {"name": "block", "parameters": [{"name": "w", "shape": [16, 8], "group": "block"},
                                     {"name": "b", "shape": [128], "group": "block"}],
     "kept": [8, 60], "output": [0, 16], "input_grad": [0, 16], "forward_flops": [0, 256],
     "workspace": [0, 4000],
     "reads_input": )" +
         (block_reads_input ? "true" : "false") + R"(},
    {"name": "head", "shared": ["embed.weight"], "kept": [0, 40], "output": [4, 0],
     "input_grad": [0, 16], "forward_flops": [0, 320], "backward_workspace": [0, 5000]}]})";
}

AllocatorStats Step(const std::string& description, const std::string& config_json) {
  auto model = std::make_shared<const TracedModel>(ParseTracedModel(description, "toy").value());
  Model m = TracedModelFactory(model)(3).value();
  Config config = ParseConfig(config_json).value();
  RecomputationPlan keep{"none", {}};
  for (int l = 0; l < 3; ++l) keep.segments.push_back({l, l + 1, SegmentMode::kKeep});
  return DryRunStep(std::move(m), config, 0, 1, int64_t{1} << 40, &keep).value();
}

int64_t Peak(const AllocatorStats& s, MemoryCategory c) {
  return s.by_category[static_cast<int>(c)].peak;
}

TEST_CASE("a traced model's dry run holds what its description declares", "[traced]") {
  const AllocatorStats s = Step(Description(false, true), R"({"zero_optimization": {"stage": 0}})");
  // 256 + 128 + 128 = 512 f32 parameters; gradients likewise; Adam's two
  // moments.
  CHECK(Peak(s, MemoryCategory::kParameter) == 512 * 4);
  CHECK(Peak(s, MemoryCategory::kGradient) == 512 * 4);
  CHECK(Peak(s, MemoryCategory::kOptimizerState) == 512 * 8);
  // Batch 3: kept 300 + 8 + 180 + 120, outputs 48 + 48 + 4 (one f32 each),
  // all live at the end of forward; then the loss's gradient (4 bytes) and
  // the head's input gradient (48) while nothing has been freed yet.
  CHECK(Peak(s, MemoryCategory::kActivation) == 300 + 8 + 180 + 120 + 48 + 48 + 4 + 4 + 48);
  CHECK(Peak(s, MemoryCategory::kWorkspace) == 15000);  // the head's backward, micro-batch 3
}

TEST_CASE("frozen traced parameters hold no gradient or optimizer state", "[traced]") {
  const AllocatorStats s = Step(Description(true, true), R"({"zero_optimization": {"stage": 0}})");
  CHECK(Peak(s, MemoryCategory::kParameter) == 512 * 4);
  CHECK(Peak(s, MemoryCategory::kGradient) == 256 * 4);
  CHECK(Peak(s, MemoryCategory::kOptimizerState) == 256 * 8);
}

TEST_CASE("a stage that does not save its input frees it after its forward", "[traced]") {
  const int64_t reads = Peak(Step(Description(false, true), "{}"), MemoryCategory::kActivation);
  const int64_t frees = Peak(Step(Description(false, false), "{}"), MemoryCategory::kActivation);
  CHECK(reads - frees == 48);  // the embedding's output at micro-batch 3
}

TEST_CASE("stages marked not recomputable are kept by the planners", "[traced]") {
  // The embedding and the head pinned (as memwall.trace marks them), the
  // block not: full recomputation recomputes the block alone.
  std::string d = Description(false, true);
  d.replace(d.find(R"("kept": [0, 100])"), 16, R"("recomputable": false, "kept": [0, 100])");
  d.replace(d.find(R"("kept": [0, 40])"), 15, R"("recomputable": false, "kept": [0, 40])");
  auto model = std::make_shared<const TracedModel>(ParseTracedModel(d, "toy").value());
  CHECK_FALSE(model->stages[0].recomputable);
  CHECK(model->stages[1].recomputable);
  Model m = TracedModelFactory(model)(3).value();
  const Chain chain = ChainOf(m.layers, m.input, DType::kF32).value();
  const RecomputationPlan full = FullRecomputation(chain);
  REQUIRE(full.segments.size() == 3);
  CHECK(full.segments[0].mode == SegmentMode::kKeep);
  CHECK(full.segments[1].mode == SegmentMode::kRecompute);
  CHECK(full.segments[2].mode == SegmentMode::kKeep);
  // Held once forward ends: the embedding's 300 + 48, the block's output
  // 48 (its 8 + 180 kept bytes recomputed), the head's 120 + 4.
  CHECK(full.held_after_forward == 300 + 48 + 48 + 120 + 4);
  CHECK(chain.recompute_held == 0);
}

TEST_CASE("a recomputing plan holds the traced model's recompute inputs for the step",
          "[traced]") {
  // 10 bytes per sample of mask-like inputs: 30 at micro-batch 3, held as
  // 8 f32 elements (32 bytes) from forward's start to backward's end by any
  // plan that recomputes, and by no other.
  std::string d = Description(false, true);
  d.replace(d.find(R"("attention": "none",)"), 20,
            R"("attention": "none", "recompute_inputs": [0, 10],)");
  auto model = std::make_shared<const TracedModel>(ParseTracedModel(d, "toy").value());
  Model m = TracedModelFactory(model)(3).value();
  const Chain chain = ChainOf(m.layers, m.input, DType::kF32).value();
  CHECK(chain.recompute_held == 32);
  const RecomputationPlan none = NoRecomputation(chain), full = FullRecomputation(chain);
  Chain without = chain;
  without.recompute_held = 0;
  CHECK(none.predicted_peak == NoRecomputation(without).predicted_peak);
  CHECK(full.predicted_peak == FullRecomputation(without).predicted_peak + 32);
  CHECK(full.held_after_forward == FullRecomputation(without).held_after_forward + 32);
  // The dry run allocates it: its activation peak is the plan's, to the byte.
  for (const RecomputationPlan* plan : {&none, &full}) {
    Model run = TracedModelFactory(model)(3).value();
    const AllocatorStats s = DryRunStep(std::move(run), ParseConfig("{}").value(), 0, 1,
                                        int64_t{1} << 40, plan).value();
    CHECK(Peak(s, MemoryCategory::kActivation) == plan->predicted_peak);
  }
}

TEST_CASE("a traced model refuses another dtype and names it", "[traced]") {
  auto model = std::make_shared<const TracedModel>(
      ParseTracedModel(Description(false, true, "bf16"), "toy").value());
  auto status = DryRunStep(TracedModelFactory(model)(1).value(), ParseConfig("{}").value(), 0, 1)
                    .status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "layer 'embed' was traced in bf16 but the config trains in f32 (its bf16/fp16 "
        "sections); trace the model in the config's dtype");
}

TEST_CASE("a figure past 64-bit bytes at a large micro-batch does not fit", "[traced]") {
  std::string d = Description(false, true);
  d.replace(d.find(R"("kept": [0, 100])"), 16, R"("kept": [0, 1e15])");
  auto model = std::make_shared<const TracedModel>(ParseTracedModel(d, "toy").value());
  // 1e15 bytes a sample x 2^20 samples: 1e21 bytes saturate at 2^62.
  Model m = TracedModelFactory(model)(int64_t{1} << 20).value();
  RecomputationPlan keep{"none", {}};
  for (int l = 0; l < 3; ++l) keep.segments.push_back({l, l + 1, SegmentMode::kKeep});
  const absl::Status s =
      DryRunStep(std::move(m), ParseConfig("{}").value(), 0, 1, int64_t{1} << 40, &keep).status();
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(s.message()), Catch::Contains("cannot allocate 4294967296.00 GiB (4611686018427387904 bytes) of activation for 'embed'"));
}

TEST_CASE("a bad description names its field", "[traced]") {
  auto message = [](const std::string& text) {
    return std::string(ParseTracedModel(text, "m.json").status().message());
  };
  CHECK(message("{") .rfind("traced model m.json: not JSON", 0) == 0);
  CHECK(message(R"({"format": "x"})") ==
        "traced model m.json: format: expected \"memwall.traced/1\", got \"x\"");
  CHECK(message(R"({"format": "memwall.traced/1", "dtype": "f64"})") ==
        "traced model m.json: dtype: expected \"f32\", \"bf16\" or \"f16\", got \"f64\"");
  std::string d = Description(false, true);
  CHECK(message(std::string(d).replace(d.find("\"kept\": [0, 100]"), 16, "\"kept\": [0]")) ==
        "traced model m.json: stages[0].kept: expected [fixed, per sample] numbers, got [0]");
  // Figures beyond 64-bit byte counts are refused, not wrapped to a small
  // number that would plan "fits: yes".
  std::string huge = Description(false, true);
  huge.replace(huge.find(R"("kept": [0, 100])"), 16, R"("kept": [1e19, 1e19])");
  CHECK(message(huge) ==
        "traced model m.json: stages[0].kept: expected at most 2^50 bytes (1 PiB) fixed and per "
        "sample; got [1e+19,1e+19]");
  std::string wide = Description(false, true);
  wide.replace(wide.find(R"("shape": [16, 8])"), 16, R"("shape": [4294967296, 4294967296])");
  CHECK(message(wide) ==
        "traced model m.json: stages[1].parameters 'w'.shape: expected at most 2^48 elements in "
        "all; got [4294967296,4294967296]");
  CHECK(message(std::string(d).replace(d.find("embed.weight"), 12, "embed.bias")) ==
        "traced model m.json: stages 'head'.shared: expected parameters of other stages; no "
        "stage declares 'embed.bias'");
  // A field of the wrong type is an error naming it, not an exception
  // (which ended the process before).
  CHECK(message(std::string(d).replace(d.find(R"("model": "Toy")"), 14, R"("model": 5)")) ==
        "traced model m.json: model: expected a string, got 5");
  CHECK(message(R"({"format": "memwall.traced/1", "dtype": 16})") ==
        "traced model m.json: dtype: expected \"f32\", \"bf16\" or \"f16\", got 16");
  std::string reads = Description(false, true);
  reads.replace(reads.find(R"("kept": [0, 100])"), 16, R"("reads_input": "yes", "kept": [0, 100])");
  CHECK(message(reads) ==
        "traced model m.json: stages[0].reads_input: expected a boolean, got \"yes\"");
  std::string pinned = Description(false, true);
  pinned.replace(pinned.find(R"("kept": [0, 100])"), 16,
                 R"("recomputable": 1, "kept": [0, 100])");
  CHECK(message(pinned) ==
        "traced model m.json: stages[0].recomputable: expected a boolean, got 1");
  std::string inputs = Description(false, true);
  inputs.replace(inputs.find(R"("attention": "none",)"), 20,
                 R"("attention": "none", "recompute_inputs": [0, -1],)");
  CHECK(message(inputs) ==
        "traced model m.json: recompute_inputs: expected finite, per sample >= 0, >= 0 at "
        "micro-batch 1; got [0,-1]");
  std::string frozen = Description(false, true);
  frozen.replace(frozen.find(R"("shape": [16, 8])"), 16, R"("shape": [16, 8], "trainable": 0)");
  CHECK(message(frozen) ==
        "traced model m.json: stages[1].parameters 'w'.trainable: expected a boolean, got 0");
  CHECK(message(R"({"format": "memwall.traced/1", "dtype": "f32", "input": [4],
                    "stages": [7]})") ==
        "traced model m.json: stages[0]: expected an object, got 7");
  CHECK(LoadTracedModel("/nonexistent/m.json").status().code() == absl::StatusCode::kNotFound);
}

// A stack: "emb", blocks "h.0" .. "h.<n-1>" (each a [4, 4] weight in its
// own group "h.K.mlp"; block 0 keeps more, as a first block may), "head".
std::string Stack(int n, const std::string& block3_kept = "[0, 10]") {
  std::string stages = R"({"name": "emb", "parameters": [{"name": "w", "shape": [8, 4]}],
     "kept": [0, 1], "output": [0, 4], "input_grad": [0, 0], "forward_flops": [0, 0]})";
  for (int k = 0; k < n; ++k) {
    const std::string kept = k == 0 ? "[0, 30]" : k == 3 ? block3_kept : "[0, 10]";
    stages += R"(, {"name": "h.)" + std::to_string(k) +
              R"(", "parameters": [{"name": "mlp.w", "shape": [4, 4], "group": "h.)" +
              std::to_string(k) + R"(.mlp"}], "kept": )" + kept +
              R"(, "output": [0, 4], "input_grad": [0, 4], "forward_flops": [0, 32]})";
  }
  stages += R"(, {"name": "head", "shared": ["emb.w"], "kept": [0, 2], "output": [4, 0],
     "input_grad": [0, 4], "forward_flops": [0, 64]})";
  return R"({"format": "memwall.traced/1", "model": "Stack", "dtype": "f32",
     "attention": "none", "input": [2], "stages": [)" + stages + "]}";
}

TEST_CASE("a traced stack scales in depth: the first and last blocks kept, the middle repeated",
          "[traced][depth]") {
  const TracedModel five = ParseTracedModel(Stack(5), "stack").value();
  const TracedBlocks blocks = FindTracedBlocks(five);
  CHECK(blocks.first == 1);
  CHECK(blocks.count == 5);
  CHECK(blocks.prefix == "h");
  // At its own depth: the same model.
  const TracedModel same = WithTracedBlocks(five, 5).value();
  REQUIRE(same.stages.size() == five.stages.size());
  for (size_t i = 0; i < same.stages.size(); ++i) {
    CHECK(same.stages[i].name == five.stages[i].name);
    CHECK(same.stages[i].kept.per_sample == five.stages[i].kept.per_sample);
  }
  // Eight blocks: h.0 as traced, h.1 .. h.6 copies of h.1 renamed (their
  // groups too), h.7 the traced last block; the parameters grow by 3 blocks.
  const TracedModel eight = WithTracedBlocks(five, 8).value();
  REQUIRE(eight.stages.size() == 10);
  CHECK(eight.stages[1].kept.per_sample == 30);
  for (int k = 0; k < 8; ++k) {
    const TracedStage& s = eight.stages[1 + k];
    CHECK(s.name == "h." + std::to_string(k));
    CHECK(s.parameters[0].group == "h." + std::to_string(k) + ".mlp");
  }
  CHECK(eight.stages[9].name == "head");
  CHECK(TracedParameters(eight) == TracedParameters(five) + 3 * 16);
  // One block: the first alone.
  const TracedModel one = WithTracedBlocks(five, 1).value();
  REQUIRE(one.stages.size() == 3);
  CHECK(one.stages[1].name == "h.0");
  CHECK(TracedParameters(one) == 32 + 16);
}

TEST_CASE("a stack whose middle blocks differ, or has none, does not scale", "[traced][depth]") {
  const TracedModel odd = ParseTracedModel(Stack(5, "[0, 11]"), "odd").value();
  const absl::Status differ = WithTracedBlocks(odd, 8).status();
  CHECK(differ.code() == absl::StatusCode::kInvalidArgument);
  CHECK(differ.message() ==
        "odd (Stack): blocks h.1 and h.3 differ in 'kept'; repeating one block would not be "
        "this model");
  const TracedModel flat = ParseTracedModel(Description(false, true), "toy").value();
  CHECK(WithTracedBlocks(flat, 2).status().message() ==
        "toy (Toy): no numbered blocks (stages named <prefix>.0, <prefix>.1, ...) to repeat");
  const TracedModel five = ParseTracedModel(Stack(5), "stack").value();
  CHECK(WithTracedBlocks(five, 0).status().message() ==
        "stack (Stack): blocks: expected 1..1000000, got 0");
}

}  // namespace
}  // namespace memwall
