// Hybrid sharding (zero_optimization.mics_shard_size) on real ranks
// (mpirun -np 1, 2, 4): it trains as unsharded data parallelism does (bit
// for bit where the sums cannot be ordered differently, to rounding where
// they can), its checkpoints load at any other group size and stage, and
// the settings it cannot run are refused by name.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/checkpoint.h"
#include "models/layers.h"
#include "runtime/units.h"
#include "tests/support/mlp_task.h"
#include "tests/support/mpi_world.h"
#include "tests/support/values.h"

namespace memwall {
namespace {

namespace fs = std::filesystem;
using testing::SameBits;
using testing::World;

using Setup = testing::MlpSetup;
using Run = testing::MlpRun;

Setup Hybrid(int stage, int64_t shard_size, int accumulation = 2) {
  Setup s;
  s.name = absl::StrCat("stage ", stage, ", mics_shard_size ", shard_size);
  s.stage = stage;
  s.accumulation = accumulation;
  s.shard_size = shard_size;
  return s;
}

// `steps` steps of `accumulation` micro-batches each; the losses.
std::vector<float> Train(Run& run, int steps, int accumulation) {
  std::vector<float> losses;
  for (int k = 0; k < steps; ++k) {
    const int step = static_cast<int>(run.trainer->steps());
    std::vector<Batch> batches;
    for (int u = 0; u < accumulation; ++u) {
      batches.push_back(testing::MlpTaskBatch(*run.device, World().rank(), step * 4 + u));
    }
    const auto report = run.trainer->TrainStep(batches);
    REQUIRE(report.ok());
    losses.push_back(report->loss);
  }
  return losses;
}

// Every parameter's master weights, in registration order (collective).
std::vector<float> Weights(Run& run) {
  std::vector<float> all;
  for (const ParameterSpec& p : run.trainer->optimizer().parameters()) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    std::vector<float> w(numel);
    REQUIRE(run.trainer->optimizer().MasterWeights(p.name, absl::MakeSpan(w)).ok());
    all.insert(all.end(), w.begin(), w.end());
  }
  return all;
}

float MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

TEST_CASE("hybrid sharding trains as unsharded data parallelism", "[hybrid]") {
  const int n = World().world_size();
  Setup plain;
  plain.name = "stage 0";
  plain.accumulation = 2;
  Run reference = testing::StartMlpTask(plain, World());
  Train(reference, 4, 2);
  const std::vector<float> want = Weights(reference);
  for (int stage = 1; stage <= 3; ++stage) {
    Setup sharded = Hybrid(stage, -1);
    Run whole = testing::StartMlpTask(sharded, World());
    Train(whole, 4, 2);
    const std::vector<float> stage_weights = Weights(whole);
    for (int64_t size : {int64_t{1}, int64_t{2}, int64_t{n}}) {
      if (n % size != 0) continue;
      const Setup s = Hybrid(stage, size);
      INFO(s.name << " on " << n << " ranks");
      Run run = testing::StartMlpTask(s, World());
      CHECK(run.trainer->optimizer().shards().world_size() == size);
      CHECK(run.trainer->optimizer().layout().groups[0].shard_numel * size ==
            run.trainer->optimizer().layout().groups[0].padded_numel);
      Train(run, 4, 2);
      const std::vector<float> got = Weights(run);
      if (size == n) {
        // One group of every rank: the stage itself, bit for bit.
        CHECK(SameBits(got, stage_weights));
      } else if (n == 2) {
        // Two ranks' sums have one order: unsharded data parallelism's
        // result, bit for bit.
        CHECK(SameBits(got, want));
      }
      // Whatever the order of the sums: within the rounding the stages
      // differ by among themselves (up to 2.7e-7 on 4 ranks).
      INFO("hybrid vs stage 0: " << MaxDifference(got, want) << ", stage " << stage
                                 << " vs stage 0: " << MaxDifference(stage_weights, want));
      CHECK(MaxDifference(got, want) <= 2e-6f);
    }
  }
}

TEST_CASE("hybrid sharding in bf16, with optimizer offload and clipping", "[hybrid]") {
  // The same sums through each path that keeps the gradients elsewhere:
  // the host part staged after the replicas' sum, the whole shard streamed
  // (each piece summed with the replicas). SGD: a gradient's rounding
  // moves a weight by lr times it (Adam's normalisation would turn a
  // near-zero gradient's sign, flipped by rounding, into a step of lr).
  const int n = World().world_size();
  const int64_t size = n >= 2 ? 2 : 1;
  for (const float offload : {0.0f, 0.5f, 1.0f}) {
    for (const int stage : {2, 3}) {
      Setup base = Hybrid(stage, -1);
      base.bf16 = true;
      base.sgd = true;
      base.offload = offload;
      base.clipping = 0.05f;
      Setup hybrid = base;
      hybrid.shard_size = size;
      INFO("stage " << stage << ", offload " << offload << ", blocks of " << size << " on " << n);
      Run a = testing::StartMlpTask(base, World()), b = testing::StartMlpTask(hybrid, World());
      const std::vector<float> la = Train(a, 3, 2), lb = Train(b, 3, 2);
      const std::vector<float> wa = Weights(a), wb = Weights(b);
      if (size == n) {
        CHECK(SameBits(lb, la));
        CHECK(SameBits(wb, wa));
      }
      // bf16 gradients summed in another order: a rounding apart (2e-6 on
      // 4 ranks).
      INFO("weights differ by " << MaxDifference(wb, wa));
      CHECK(MaxDifference(wb, wa) <= 2e-5f);
      // The losses, computed in bf16 (an ulp is 2^-8 of a value): within
      // 1e-3 (2e-4 on 4 ranks).
      for (size_t k = 0; k < la.size(); ++k) CHECK(std::fabs(lb[k] - la[k]) <= 1e-3f * la[k]);
    }
  }
}

// One step by hand on `run`'s optimizer: every group reduced in the first
// micro-batch, only group 0 in the second. The gradients are small
// multiples of 1/8, so every sum is exact in any order.
std::vector<float> PartialStep(Run& run) {
  ShardedOptimizer& opt = run.trainer->optimizer();
  const int rank = World().rank();
  const int groups = static_cast<int>(opt.layout().groups.size());
  for (int micro = 0; micro < 2; ++micro) {
    for (int g = 0; g < (micro == 0 ? groups : 1); ++g) {
      REQUIRE(opt.AcquireGradients(g).ok());
      for (const ParameterSpec& p : opt.parameters()) {
        if (opt.GroupOf(p.name).value() != g) continue;
        int64_t numel = 1;
        for (int64_t d : p.shape) numel *= d;
        std::vector<float> grad(numel);
        for (int64_t i = 0; i < numel; ++i) {
          grad[i] = float((i * 5 + rank * 3 + micro) % 9 - 4) * 0.125f;
        }
        REQUIRE(opt.AddGradient(p.name, grad).ok());
      }
      REQUIRE(opt.ReduceGradients(g).ok());
    }
  }
  REQUIRE(opt.Step().ok());
  return Weights(run);
}

TEST_CASE("a group reduced in fewer micro-batches than the step's is summed with its replicas",
          "[hybrid]") {
  // On the device, streamed to the host, and streamed with the update
  // overlapped with backward (the group is handed over at the step).
  const int n = World().world_size();
  const int64_t size = n >= 2 ? 2 : 1;
  struct Path {
    float offload;
    bool overlap_step;
  };
  for (const Path path : {Path{0.0f, false}, Path{1.0f, false}, Path{1.0f, true}}) {
    for (const int stage : {2, 3}) {
      Setup plain = Hybrid(stage, -1);
      plain.bf16 = true;
      plain.offload = path.offload;
      plain.overlap_step = path.overlap_step;
      Setup hybrid = plain;
      hybrid.shard_size = size;
      INFO("stage " << stage << ", offload " << path.offload
                    << (path.overlap_step ? ", overlapped" : "") << ", blocks of " << size
                    << " on " << n);
      Run a = testing::StartMlpTask(plain, World()), b = testing::StartMlpTask(hybrid, World());
      CHECK(SameBits(PartialStep(b), PartialStep(a)));
    }
  }
}

std::string TempDir(const std::string& leaf) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return (fs::path(tmp ? tmp : "/tmp") / leaf).string();
}

TEST_CASE("a hybrid checkpoint loads at any other group size and stage, and back",
          "[hybrid][checkpoint]") {
  const int n = World().world_size();
  const int64_t size = n >= 2 ? 2 : 1;
  const std::vector<std::pair<Setup, Setup>> moves = {
      {Hybrid(3, size), Hybrid(3, -1)},
      {Hybrid(3, size), Hybrid(1, 1)},
      {Hybrid(2, -1), Hybrid(2, size)},
      {Hybrid(0, -1), Hybrid(3, size)},
  };
  for (size_t m = 0; m < moves.size(); ++m) {
    const auto& [from, to] = moves[m];
    INFO(from.name << " -> " << to.name << " on " << n << " ranks");
    const std::string dir = TempDir(absl::StrCat("hybrid-", m));
    Run first = testing::StartMlpTask(from, World());
    Train(first, 2, 2);
    REQUIRE(SaveCheckpoint(*first.trainer, dir, 1).ok());
    Run second = testing::StartMlpTask(to, World(), /*seed=*/5);
    REQUIRE(LoadCheckpoint(*second.trainer, dir).ok());
    // Lossless: every master weight, and the moments behind the next step.
    CHECK(SameBits(Weights(second), Weights(first)));
    Run straight = testing::StartMlpTask(to, World());
    Train(straight, 4, 2);
    Train(second, 2, 2);
    CHECK(MaxDifference(Weights(second), Weights(straight)) <= 2e-6f);
  }
}

TEST_CASE("hybrid sharding's settings are checked by name", "[hybrid][errors]") {
  MpiCommunicator& world = World();
  const int n = world.world_size();
  DeviceOptions d{Backend::kHost, 0, int64_t{16} << 20};
  auto device = CreateDevice(d).value();
  const auto refusal = [&](const ShardingOptions& o) {
    return Trainer::Create(MakeMlp(testing::MlpTaskWidths()), std::make_unique<MseLoss>(), o,
                           *device, world, 1)
        .status();
  };
  ShardingOptions o;
  o.zero.stage = 3;
  if (n == 4) {
    o.zero.mics_shard_size = 3;
    const absl::Status s = refusal(o);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()) ==
          "zero_optimization.mics_shard_size: group size: expected a divisor of the 4 ranks, "
          "got 3");
  }
  o.zero.mics_shard_size = 1;
  o.zero.stage = 0;
  absl::Status s = refusal(o);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "zero_optimization.mics_shard_size: expected stage 1, 2 or 3 with it (it shards the "
        "states inside groups of ranks), got stage 0");
  o.zero.stage = 3;
  o.zero.quantized_gradients = true;
  s = refusal(o);
  CHECK(std::string(s.message()) ==
        "zero_optimization.mics_shard_size: not with zero_quantized_gradients (hybrid sharding "
        "reduce-scatters inside the shard group and all-reduces across the groups)");
  o.zero.quantized_gradients = false;
  o.zero.mics_shard_size = 0;
  s = refusal(o);
  CHECK(std::string(s.message()) ==
        "zero_optimization.mics_shard_size: expected -1 (shard across all ranks) or the ranks of "
        "a shard group, >= 1, got 0");

  // A group reduced more often than the step's micro-batches: its shard
  // was summed with the replicas already.
  Setup one = Hybrid(2, 1, /*accumulation=*/1);
  Run run = testing::StartMlpTask(one, World());
  ShardedOptimizer& opt = run.trainer->optimizer();
  REQUIRE(opt.AcquireGradients(0).ok());
  REQUIRE(opt.ReduceGradients(0).ok());
  REQUIRE(opt.AcquireGradients(0).ok());
  s = opt.ReduceGradients(0);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()) ==
        "ReduceGradients: group 0 was reduced gradient_accumulation_steps (1) times this step "
        "already; with mics_shard_size call Step() first");
  REQUIRE(opt.AbortStep().ok());
}

}  // namespace
}  // namespace memwall
