// The training job on real MPI ranks (mpirun -np 1, 2): the events rank 0's
// observer receives, in order, with their figures (GPT-2's published
// parameter count, an untrained byte model's loss of ln 256, ZeRO-2's full
// f32 parameters on every rank), a resumed run that continues bit for bit
// as if never stopped, options refused by name before any rank starts, and a
// meta dry run (refused on real ranks).
#include "jobs/train.h"

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/dry_run.h"
#include "models/spec.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

// Every event as a line ("stepped 4", "saved DIR/step-00000003"), and the
// figures of the start, the steps and the summary.
class Recorder : public TrainObserver {
 public:
  void Started(const TrainStart& start) override {
    events.push_back("started");
    this->start = start;
  }
  void Resumed(const std::string& path, int64_t step, const std::string& skipped) override {
    events.push_back(absl::StrCat("resumed ", path, " ", step, skipped.empty() ? "" : " skipped"));
  }
  void NothingToTrain(int64_t step) override {
    events.push_back(absl::StrCat("nothing to train ", step));
  }
  void Stepped(const TrainStep& step) override {
    events.push_back(absl::StrCat("stepped ", step.step));
    steps.push_back(step);
  }
  void Saved(const std::string& path) override { events.push_back(absl::StrCat("saved ", path)); }
  void Finished(const TrainSummary& summary) override {
    events.push_back(absl::StrCat("finished ", summary.steps));
    this->summary = summary;
  }

  std::vector<std::string> events;
  TrainStart start;
  std::vector<TrainStep> steps;
  TrainSummary summary;
};

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

TrainOptions Tiny(int64_t steps) {
  TrainOptions options;
  options.capacity_bytes = 64 << 20;
  options.steps = steps;
  options.log_every = 1;
  return options;
}

// GPT-2's parameters (Radford et al.'s architecture, tied head): token and
// position embeddings, per block 12 h^2 + 13 h (two layer norms, QKV,
// attention projection, the 4h MLP, with biases), the final layer norm.
int64_t Gpt2Parameters(int64_t vocab, int64_t seq, int64_t hidden, int64_t layers) {
  return vocab * hidden + seq * hidden + layers * (12 * hidden * hidden + 13 * hidden) + 2 * hidden;
}

TEST_CASE("the events of a run that saves, in order, with their figures", "[train]") {
  const int ranks = testing::World().world_size();
  const bool rank0 = testing::World().rank() == 0;
  const std::string dir = TempDir("events");
  TrainOptions options = Tiny(5);
  options.log_every = 2;
  options.save_dir = dir;
  options.save_every = 3;
  Recorder seen;
  REQUIRE(RunTrain(options, seen).ok());
  if (!rank0) {
    CHECK(seen.events.empty());  // only rank 0 reports
    return;
  }
  CHECK(seen.events == std::vector<std::string>{
                           "started", "stepped 1", "stepped 2",
                           absl::StrCat("saved ", dir, "/step-00000003"), "stepped 4", "stepped 5",
                           absl::StrCat("saved ", dir, "/step-00000005"), "finished 5"});
  // gpt-tiny: vocab 256, seq 64, hidden 64, 2 layers; the built-in config
  // trains micro-batches of 8 at ZeRO stage 2 in f32.
  const TrainStart& start = seen.start;
  CHECK(start.parameters == Gpt2Parameters(256, 64, 64, 2));
  CHECK(start.trainable_parameters == start.parameters);
  CHECK(start.zero.stage == 2);
  CHECK(start.ranks == ranks);
  CHECK(start.device_bytes == (64 << 20));
  CHECK(start.data == "built-in synthetic corpus");
  CHECK(start.data_bytes == (1 << 20));
  CHECK(start.tokens_per_step == 8 * 64 * ranks);
  CHECK(start.cpu_update_threads == 0);
  CHECK(start.recomputation.empty());
  REQUIRE(seen.steps.size() == 4);
  // Untrained, the model guesses each byte about uniformly: ln 256.
  REQUIRE(seen.steps[0].loss.has_value());
  CHECK(std::fabs(*seen.steps[0].loss - std::log(256.0)) < 0.05);
  CHECK(*seen.steps[3].loss < *seen.steps[0].loss - 0.5);
  for (const TrainStep& s : seen.steps) {
    CHECK(s.applied);
    CHECK_FALSE(s.lr_scheduled);
    CHECK(s.tokens_per_second > 0);
    // Stage 2 keeps the whole f32 model on every rank.
    CHECK(s.peak_by_category[int(MemoryCategory::kParameter)] >= 4 * start.parameters);
    CHECK(s.peak >= s.peak_by_category[int(MemoryCategory::kActivation)]);
  }
  CHECK(seen.summary.skipped == 0);
  CHECK(*seen.summary.first_loss == *seen.steps[0].loss);
  CHECK(*seen.summary.last_loss == *seen.steps[3].loss);
  CHECK(seen.summary.ln_vocab == std::log(256.0));
}

TEST_CASE("a resumed run continues bit for bit and reports where it resumed", "[train]") {
  const bool rank0 = testing::World().rank() == 0;
  const std::string dir = TempDir("resume");
  Recorder whole;
  REQUIRE(RunTrain(Tiny(5), whole).ok());

  TrainOptions first = Tiny(3);
  first.save_dir = dir;
  Recorder stopped;
  REQUIRE(RunTrain(first, stopped).ok());

  // At the saved step already: nothing to train, nothing saved again.
  TrainOptions again = Tiny(3);
  again.resume_dir = again.save_dir = dir;
  Recorder idle;
  REQUIRE(RunTrain(again, idle).ok());

  TrainOptions rest = Tiny(5);
  rest.resume_dir = rest.save_dir = dir;
  Recorder resumed;
  REQUIRE(RunTrain(rest, resumed).ok());
  if (!rank0) return;
  const std::string step3 = absl::StrCat(dir, "/step-00000003");
  CHECK(idle.events == std::vector<std::string>{"started", absl::StrCat("resumed ", step3, " 3"),
                                                "nothing to train 3"});
  CHECK(resumed.events == std::vector<std::string>{"started", absl::StrCat("resumed ", step3, " 3"),
                                                   "stepped 4", "stepped 5",
                                                   absl::StrCat("saved ", dir, "/step-00000005"),
                                                   "finished 2"});
  REQUIRE(whole.steps.size() == 5);
  REQUIRE(resumed.steps.size() == 2);
  CHECK(*resumed.steps[0].loss == *whole.steps[3].loss);
  CHECK(*resumed.steps[1].loss == *whole.steps[4].loss);
}

TEST_CASE("the summary names the rank the others waited for", "[train][arrivals]") {
  // The last rank sleeps 50 ms before each of 4 steps: on 2 ranks the
  // others waited for it the most, at least most of those 200 ms (the
  // first collective of each step; in the rest the last to arrive is
  // chance). One rank has nobody to wait for.
  const int n = testing::World().world_size();
  TrainOptions options = Tiny(4);
  options.slow_rank = n - 1;
  options.slow_step = absl::Milliseconds(50);
  Recorder seen;
  REQUIRE(RunTrain(options, seen).ok());
  if (testing::World().rank() != 0) return;
  if (n == 1) {
    CHECK_FALSE(seen.summary.straggler.has_value());
    return;
  }
  REQUIRE(seen.summary.straggler.has_value());
  const Straggler& s = *seen.summary.straggler;
  CHECK(s.rank == n - 1);
  CHECK(s.calls > 4);
  CHECK(s.last >= 4);
  CHECK(s.cost_seconds >= 4 * 0.035);
  CHECK(s.cost_seconds >= 0.75 * s.waited_seconds);
}

TEST_CASE("the summary's link bytes per step are the dry run's, nodes as the config says",
          "[train][link]") {
  // Each rank its own node: on 2 ranks everything crosses between 2 nodes.
  const int n = testing::World().world_size();
  const std::string config_path = TempDir("nodes.json");
  if (testing::World().rank() == 0) {
    std::ofstream(config_path) << R"({"train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3}, "bf16": {"enabled": true}, "ranks_per_node": 1})";
  }
  REQUIRE(testing::World().Barrier().ok());
  TrainOptions options = Tiny(3);
  options.config_path = config_path;
  Recorder seen;
  REQUIRE(RunTrain(options, seen).ok());
  if (testing::World().rank() != 0) return;
  DryRunOptions plan;
  plan.model = SpecModel(options.model);
  plan.gpus = n;
  plan.runtime_allowance = 0;
  const DryRunResult planned = DryRun(plan, LoadConfig(config_path).value()).value();
  CHECK(seen.summary.nodes == n);
  CHECK(planned.nodes == n);
  CHECK(seen.summary.traffic_per_step.intra_node == 0);
  CHECK(seen.summary.traffic_per_step.inter_node == planned.link_bytes.inter_node);
  if (n > 1) CHECK(planned.link_bytes.inter_node > 0);
}

TEST_CASE("options are refused by name before the run starts", "[train]") {
  Recorder seen;
  TrainOptions steps = Tiny(-1);
  absl::Status status = RunTrain(steps, seen);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) == "--steps: expected >= 0, got -1");
  TrainOptions keep = Tiny(1);
  keep.keep_checkpoints = 0;
  status = RunTrain(keep, seen);
  CHECK(std::string(status.message()) == "--keep_checkpoints: expected >= 1, got 0");
  TrainOptions model = Tiny(1);
  model.model = "gpt-huge";
  status = RunTrain(model, seen);
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith("model 'gpt-huge': expected one of gpt-tiny, gpt2-124m,"));
  CHECK(seen.events.empty());
}

TEST_CASE("a dry run of GPT-2 124M reports its published size and no loss", "[train]") {
  TrainOptions options;
  options.backend = Backend::kMeta;
  options.model = "gpt2-124m";
  options.capacity_bytes = int64_t{16} << 30;
  options.simulate_ranks = 4;
  options.steps = 1;
  Recorder seen;
  const absl::Status status = RunTrain(options, seen);
  if (testing::World().world_size() != 1) {
    // Meta plays its world from one process: on real ranks it is refused.
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()) ==
          "--backend meta: run one process and set --simulate_ranks to the world it plays");
    CHECK(seen.events.empty());
    return;
  }
  REQUIRE(status.ok());
  CHECK(seen.start.parameters == 124439808);  // GPT-2 small, as published
  CHECK(seen.start.ranks == 4);
  CHECK(seen.start.blas.empty());
  REQUIRE(seen.steps.size() == 1);
  CHECK_FALSE(seen.steps[0].loss.has_value());
  CHECK_FALSE(seen.summary.first_loss.has_value());
}

}  // namespace
}  // namespace memwall
