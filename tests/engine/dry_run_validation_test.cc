// The dry run's answer holds on a real run: on the host backend with a
// small device, the largest GPT the plan says fits trains a real step, and
// the next size up really runs out of memory with the report, on 1 and 2
// real ranks (the plan dry-runs rank 0 of N; ranks hold equal shards).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "checkpointing/planner.h"
#include "engine/dry_run.h"
#include "models/spec.h"
#include "runtime/status.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

// gpt-tiny's family: vocab 256, seq 64, 4 layers, hidden = 64 * m.
std::string Spec(int64_t m) {
  return absl::StrCat("gpt-tiny:layers=4,hidden=", 64 * m, ",heads=", m);
}

Config StrategyConfig(int stage, bool recompute) {
  Config c;
  c.bf16 = true;
  c.train_micro_batch_size_per_gpu = 4;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 200000;
  c.activation_checkpointing.planner = recompute ? "sqrt" : "none";
  return c;
}

bool PlanFits(const Config& config, int64_t m, int64_t capacity) {
  DryRunOptions o;
  o.model = SpecModel(Spec(m));
  o.device_bytes = capacity;
  o.gpus = testing::World().world_size();
  o.runtime_allowance = 0;  // host: no CUDA runtime
  o.batch = config.train_micro_batch_size_per_gpu;
  const absl::StatusOr<DryRunResult> r = DryRun(o, config);
  REQUIRE(r.ok());
  return r->fits;
}

// One real host step; the status of creating the trainer or stepping.
absl::Status RealStep(const Config& config, int64_t m, int64_t capacity) {
  auto device = CreateDevice({Backend::kHost, 0, capacity}).value();
  const GptConfig c = ParseGptModel(Spec(m)).value();
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), config,
                                 *device, testing::World(), 1);
  if (!trainer.ok()) return trainer.status();
  const int64_t b = config.train_micro_batch_size_per_gpu;
  const Chain chain = (*trainer)->ChainFor({b, c.seq}).value();
  PlannerOptions po;
  const RecomputationPlan plan =
      MakePlan(chain, config.activation_checkpointing.planner, po).value();
  MW_RETURN_IF_ERROR((*trainer)->SetRecomputationPlan(plan, chain));
  std::vector<float> ids(b * c.seq);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % c.vocab);
  Batch batch;
  MW_ASSIGN_OR_RETURN(batch.input, Tensor::FromHost(*device, ids, {b, c.seq}, MemoryCategory::kOther, "in"));
  MW_ASSIGN_OR_RETURN(batch.target, Tensor::FromHost(*device, ids, {b * c.seq}, MemoryCategory::kOther, "t"));
  return (*trainer)->TrainStep({&batch, 1}).status();
}

TEST_CASE("the largest model the plan fits trains, and the next one up runs out of memory",
          "[plan][validation]") {
  for (int64_t capacity : {int64_t{24} * kMiB, int64_t{48} * kMiB}) {
    for (const auto& [stage, recompute] : std::vector<std::pair<int, bool>>{
             {0, false}, {2, false}, {3, true}}) {
      const Config config = StrategyConfig(stage, recompute);
      int64_t m = 1;
      while (PlanFits(config, m + 1, capacity)) ++m;
      INFO("capacity " << FormatBytes(capacity) << ", stage " << stage << ", recompute "
                       << recompute << ", " << testing::World().world_size()
                       << " ranks: largest hidden " << 64 * m);
      REQUIRE(PlanFits(config, m, capacity));
      CHECK(RealStep(config, m, capacity).ok());
      const absl::Status larger = RealStep(config, m + 1, capacity);
      CHECK(larger.code() == absl::StatusCode::kResourceExhausted);
      CHECK_THAT(std::string(larger.message()), Catch::StartsWith("out of memory on host:0"));
    }
  }
}

}  // namespace
}  // namespace memwall
