// The max-params search (engine/max_params.h) against exhaustive dry runs:
// the size it returns fits under the config it returns, and no larger size
// fits under the most frugal strategy it searches with (each checked here
// by a dry run of its own, so the search's shortcuts, the bisection and
// the skipping of sizes whose model states overflow a budget, are
// checked too).
#include "engine/max_params.h"

#include <string>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "engine/dry_run.h"
#include "models/family.h"
#include "models/spec.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// A small GPT family: member s is hidden 128 s, s heads and s layers.
GptFamily Small() { return ParseGptFamily("gpt:seq=64,vocab=256").value(); }

MaxParamsOptions Machine(int64_t device, int64_t host, int64_t nvme) {
  MaxParamsOptions o;
  o.family = MakeGptFamily(Small());
  o.max_size = 64;
  o.machine.device_bytes = device;
  o.machine.host_bytes = host;
  o.machine.nvme_bytes = nvme;
  o.machine.runtime_allowance = 0;
  o.base.bf16 = true;
  o.base.optimizer.adamw = true;
  o.base.train_micro_batch_size_per_gpu = 1;
  return o;
}

DryRunResult Plan(const MaxParamsOptions& o, const std::string& spec, const Config& config) {
  DryRunOptions at = o.machine;
  at.model = SpecModel(spec);
  return DryRun(at, config).value();
}

TEST_CASE("device memory only: the largest size is the last one stage 3 fits",
          "[max_params]") {
  const MaxParamsOptions o = Machine(96 * kMiB, 0, 0);
  const MaxParamsResult r = MaxParams(o).value();
  REQUIRE(r.size > 1);
  CHECK(r.model == Small().Spec(r.size));
  CHECK(r.strategy == "stage 3, recomputation optimal");
  CHECK(r.config.zero.stage == 3);
  CHECK(r.config.zero.offload_optimizer_ratio == 0);
  CHECK(r.config.activation_checkpointing.planner == "optimal");
  // Every size up to it fits, the next does not: dry runs of each.
  for (int64_t s = 1; s <= r.size + 1; ++s) {
    INFO("size " << s);
    const DryRunResult plan = Plan(o, Small().Spec(s), r.config);
    CHECK(plan.fits == (s <= r.size));
    if (s == r.size) {
      CHECK(plan.device_needed == r.plan.device_needed);
      CHECK(plan.parameters == r.plan.parameters);
      CHECK(plan.device_needed <= 96 * kMiB);
    }
  }
  CHECK(r.next_model == Small().Spec(r.size + 1));
  CHECK(absl::StartsWith(r.next_fails_on, "no ("));
}

TEST_CASE("with host memory and NVMe: offloaded strategies, the fewest tiles, NVMe binding",
          "[max_params]") {
  const MaxParamsOptions o = Machine(40 * kMiB, 256 * kMiB, 1 * kGiB);
  const MaxParamsResult r = MaxParams(o).value();
  REQUIRE(r.size > 1);
  INFO(r.strategy << ", " << r.model);
  // It fits under its config, within every budget.
  const DryRunResult plan = Plan(o, r.model, r.config);
  CHECK(plan.fits);
  CHECK(plan.device_needed == r.plan.device_needed);
  CHECK(plan.nvme_used <= 1 * kGiB);
  CHECK(plan.host_peak <= 256 * kMiB);
  // The next size up fits under none of the strategies, the most frugal
  // (parameters on NVMe, activation checkpoints in host memory, 16 tiles)
  // included: checked by a dry run whatever the search skipped.
  Config frugal = r.config;
  frugal.zero.offload_optimizer_ratio = 1.0f;
  frugal.zero.offload_param = true;
  frugal.zero.offload_nvme_path = "/local_nvme";
  frugal.zero.offload_param_nvme_path = "/local_nvme";
  frugal.zero.offload_param_max_in_cpu = 0;
  frugal.zero.offload_param_buffer_size = INT64_MAX;
  frugal.zero.stage3_gather_on_use = true;
  frugal.activation_checkpointing.offload = true;
  CHECK_FALSE(Plan(o, WithTiles(Small().Spec(r.size + 1), 16).value(), frugal).fits);
  CHECK(Plan(o, WithTiles(Small().Spec(r.size), 16).value(), frugal).fits);
  CHECK(r.next_model == Small().Spec(r.size + 1));
}

TEST_CASE("a block weight too large for the device alone: the fewest tiles that fit",
          "[max_params][tiles]") {
  // One wide block on 16 MiB: its weights must be gathered a tile at a time.
  MaxParamsOptions o = Machine(16 * kMiB, 256 * kMiB, 1 * kGiB);
  const GptFamily wide = ParseGptFamily("gpt:seq=64,vocab=256,layers=1").value();
  o.family = MakeGptFamily(wide);
  const MaxParamsResult r = MaxParams(o).value();
  REQUIRE(r.size > 1);
  REQUIRE(r.tiles > 1);
  INFO(r.strategy << ", " << r.model);
  CHECK(r.model == WithTiles(wide.Spec(r.size), r.tiles).value());
  CHECK(r.config.zero.stage3_gather_on_use);
  CHECK(Plan(o, r.model, r.config).fits);
  // Half as many tiles do not fit under the same config.
  const std::string fewer =
      r.tiles == 2 ? wide.Spec(r.size) : WithTiles(wide.Spec(r.size), r.tiles / 2).value();
  CHECK_FALSE(Plan(o, fewer, r.config).fits);
}

TEST_CASE("a machine the smallest member does not fit answers none, and why", "[max_params]") {
  const MaxParamsOptions o = Machine(1 * kMiB, 0, 0);
  const MaxParamsResult r = MaxParams(o).value();
  CHECK(r.size == 0);
  CHECK(r.next_model == "gpt:layers=1,hidden=128,heads=1,seq=64,vocab=256");
  // Embeddings 256 x 128 + 64 x 128, a block of 12 x 128^2 weights with
  // 13 x 128 biases and LayerNorm elements, the head's LayerNorm 2 x 128.
  CHECK(r.next_parameters == 40960 + 196608 + 1664 + 256);
  // 16 bytes each (bf16 weights and gradients, f32 master and moments):
  // 3,831,808 bytes.
  CHECK(r.next_fails_on ==
        "no (the model states alone need at least 3.65 MiB of device memory per GPU, 1.00 MiB "
        "given)");
}

TEST_CASE("a family key that is searched, or unknown, is refused by name", "[max_params]") {
  const absl::Status hidden = ParseGptFamily("gpt:hidden=4096").status();
  CHECK(hidden.code() == absl::StatusCode::kInvalidArgument);
  CHECK(hidden.message() ==
        "--model gpt:hidden=4096: key 'hidden' is not fixed in a family (hidden and heads grow "
        "with the size; fixed keys: seq, vocab, layers)");
  const absl::Status other = ParseGptFamily("llama-7b").status();
  CHECK(other.message() ==
        "--model: expected the family gpt, optionally with fixed seq, vocab or layers "
        "(gpt:seq=2048,layers=32), got 'llama-7b'");
  CHECK(ParseGptFamily("gpt:seq=0").status().message() ==
        "--model gpt:seq=0: 'seq=0': expected key=N with N >= 1");
}

}  // namespace
}  // namespace memwall
