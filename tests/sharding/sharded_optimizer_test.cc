// ZeRO stages 0-3 on real MPI ranks (mpirun -np 1, 2, 4): equivalence with
// a single-process unsharded reference, memory by category to the byte,
// communication volume to the byte, loss scaling across ranks, bad input.
//
// The toy model's gradients are multiples of 2^-12 in (-1, 1) (times the
// loss scale in fp16), so sums over up to 4 ranks and 2 micro-batches are
// exact in f32 whatever order MPI adds them in. Where the sharded schedule
// rounds exactly as the reference does, results must be bitwise equal; the
// two places it legitimately rounds differently get a stated tolerance:
//   * stages 2-3 with accumulation in bf16/f16 round the per-micro-batch
//     reduced sum to the parameter dtype before accumulating (the reference,
//     like stages 0-1, accumulates per rank first): one rounding of a
//     gradient (relative 2^-9 in bf16, 2^-12 in f16, of the larger of the
//     per-rank terms, so more of the total where ranks cancel), which Adam's
//     normalisation turns into a weight difference we bound by lr * 2^-5
//     (bf16) or lr * 2^-8 (f16) per step; the worst seen on 1-4 ranks is
//     about lr * 2^-6.8 per step in bf16;
//   * clipping: the global norm is summed in a different order (per shard,
//     then over ranks), so the clip coefficient may differ in its last bits:
//     relative 1e-6 on the weights.
#include "sharding/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "kernels/elementwise.h"
#include "offload/nvme_store.h"
#include "profiler/memory_profiler.h"
#include "runtime/device.h"
#include "runtime/units.h"
#include "tests/sharding/optimizer_harness.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using namespace zero_test;  // NOLINT: the harness of these tests

TEST_CASE("every stage matches the unsharded reference", "[zero][equivalence]") {
  const int ranks = World().world_size();
  const int kSteps = 4;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int accumulation : {1, 2}) {
      for (float clipping : {0.0f, 0.05f}) {
        Reference reference(Options(0, dtype, accumulation, clipping));
        for (int k = 0; k < kSteps; ++k)
          reference.Step(Options(0, dtype, accumulation, clipping), k, ranks);
        for (int run_index = 0; run_index < 8; ++run_index) {
          const int stage = run_index % 4;
          const bool overlap = run_index >= 4;
          const ShardingOptions options = Options(stage, dtype, accumulation, clipping, overlap);
          INFO("stage " << stage << ", " << Name(dtype) << ", accumulation " << accumulation
                        << ", clipping " << clipping << ", overlap " << overlap << ", " << ranks
                        << " ranks");
          Run run = Start(options);
          for (int k = 0; k < kSteps; ++k) REQUIRE(TrainStep(*run.opt, k).applied);
          CHECK(run.opt->steps_applied() == kSteps);
          const bool rounding_differs = stage >= 2 && accumulation > 1 && dtype != DType::kF32;
          const bool exact = clipping == 0 && !rounding_differs;
          const double lr = options.optimizer.lr;
          const double tolerance =
              rounding_differs ? kSteps * lr * (dtype == DType::kBF16 ? 0x1p-5 : 0x1p-8) : 0.0;
          for (size_t p = 0; p < kModel.size(); ++p) {
            INFO(kModel[p].name);
            std::vector<float> master(reference.master[p].size());
            REQUIRE(run.opt->MasterWeights(kModel[p].name, absl::MakeSpan(master)).ok());
            REQUIRE(run.opt->GatherParameters(run.opt->GroupOf(kModel[p].name).value()).ok());
            auto view = run.opt->Parameter(kModel[p].name).value();
            for (size_t j = 0; j < master.size(); ++j) {
              const float want = reference.master[p][j];
              if (exact) {
                REQUIRE(std::memcmp(&master[j], &want, 4) == 0);
                REQUIRE(Load(view.dtype, view.data, j) == reference.low[p][j]);
              } else {
                REQUIRE(std::fabs(master[j] - want) <= tolerance + 1e-6 * (1 + std::fabs(want)));
                REQUIRE(Load(view.dtype, view.data, j) == Round(dtype, master[j]));
              }
            }
            REQUIRE(run.opt->ReleaseParameters(run.opt->GroupOf(kModel[p].name).value()).ok());
          }
        }
      }
    }
  }
}

TEST_CASE("SGD with momentum shards like Adam", "[zero][sgd]") {
  const int ranks = World().world_size();
  ShardingOptions base = Options(0, DType::kF32, 1, 0.0f);
  base.optimizer.type = OptimizerType::kSgd;
  base.optimizer.momentum = 0.9f;
  base.optimizer.lr = 0.05f;
  std::vector<std::vector<float>> results;
  for (int stage = 0; stage <= 3; ++stage) {
    ShardingOptions options = base;
    options.zero.stage = stage;
    Run run = Start(options);
    for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*run.opt, k).applied);
    std::vector<float> all;
    for (const Param& p : kModel) {
      std::vector<float> w(NumElements(p.shape));
      REQUIRE(run.opt->MasterWeights(p.name, absl::MakeSpan(w)).ok());
      all.insert(all.end(), w.begin(), w.end());
    }
    results.push_back(all);
  }
  // A hand-rolled reference for the first element of "block0.b" would repeat
  // Reference; instead every stage must equal stage 0 bit for bit (the sums
  // are exact), and stage 0 must have moved every weight.
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage << " on " << ranks << " ranks");
    REQUIRE(std::memcmp(results[stage].data(), results[0].data(), results[0].size() * 4) == 0);
  }
  size_t p0 = 0;
  for (size_t p = 0; p < kModel.size(); ++p) {
    const std::vector<float> init = Initial(p);
    for (size_t j = 0; j < init.size(); ++j) CHECK(results[0][p0 + j] != init[j]);
    p0 += init.size();
  }
}

TEST_CASE("per-rank model-state bytes equal the ZeRO formulas", "[zero][memory]") {
  const int64_t n = World().world_size();
  for (int run_index = 0; run_index < 8; ++run_index) {
    const int stage = run_index % 4;
    const bool overlap = run_index >= 4;
    INFO("stage " << stage << " on " << n << " ranks, overlap " << overlap);
    Run run = Start(Options(stage, DType::kBF16, 1, 0.0f, overlap));
    const int64_t P = run.opt->layout().padded_numel;  // a multiple of N by construction
    REQUIRE(P % n == 0);
    const auto bytes = [&](MemoryCategory c) {
      return run.device->allocator().stats().by_category[static_cast<int>(c)].current;
    };
    const int64_t expected_params = stage == 3 ? 2 * P / n : 2 * P;
    const int64_t expected_grads = stage >= 2 ? 2 * P / n : 2 * P;
    const int64_t expected_optimizer = stage == 0 ? 12 * P : 12 * P / n;
    const int64_t formula[] = {16 * P, 4 * P + 12 * P / n, 2 * P + 14 * P / n, 16 * P / n};
    for (int k = 0; k < 2; ++k) {  // at rest after Finalize, and after a step
      CHECK(bytes(MemoryCategory::kParameter) == expected_params);
      CHECK(bytes(MemoryCategory::kGradient) == expected_grads);
      CHECK(bytes(MemoryCategory::kOptimizerState) == expected_optimizer);
      CHECK(bytes(MemoryCategory::kParameter) + bytes(MemoryCategory::kGradient) +
                bytes(MemoryCategory::kOptimizerState) ==
            formula[stage]);
      CHECK(bytes(MemoryCategory::kCommBuffer) == 0);
      CHECK(bytes(MemoryCategory::kWorkspace) == 0);
      TrainStep(*run.opt, k);
    }
    if (stage == 3) {
      // A gathered group adds its full padded size, and only while gathered.
      // With overlap the groups the recorded steps gathered next (here every
      // other group: the budgets hold them all) come in with it, and stay
      // until used or until Step() drops them.
      const FlatGroup& g0 = run.opt->layout().groups[0];
      REQUIRE(run.opt->GatherParameters(0).ok());
      const int64_t prefetched = overlap ? 2 * (P - g0.padded_numel) : 0;
      CHECK(bytes(MemoryCategory::kParameter) == 2 * P / n + 2 * g0.padded_numel + prefetched);
      REQUIRE(run.opt->ReleaseParameters(0).ok());
      CHECK(bytes(MemoryCategory::kParameter) == 2 * P / n + prefetched);
      REQUIRE(run.opt->Step().ok());
      CHECK(bytes(MemoryCategory::kParameter) == 2 * P / n);
    }
  }
}

TEST_CASE("reductions stay within reduce_bucket_size however large a group is",
          "[zero][memory][comm]") {
  // The embedding (185 elements) is a group of its own, larger than the
  // 64-element bucket: it reduces in pieces of 64 / N elements per rank,
  // each through one reused buffer, instead of a full-size f32 copy. The
  // results are those of one piece: "every stage matches the unsharded
  // reference" checks them bit for bit at this bucket size.
  const int64_t n = World().world_size();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      INFO("stage " << stage << ", " << Name(dtype) << ", " << n << " ranks");
      const ShardingOptions options = Options(stage, dtype, 1, 0.0f);
      Run run = Start(options);
      const int64_t bucket = options.zero.reduce_bucket_size;
      int64_t want = 0;
      for (const FlatGroup& g : run.opt->layout().groups) {
        int64_t bytes = 0;
        if (stage == 0) {
          bytes = dtype == DType::kF32 ? 0 : 4 * std::min(bucket, g.padded_numel);
        } else {
          const int64_t piece = std::min(std::max<int64_t>(bucket / n, 1), g.shard_numel);
          const bool pack = dtype != DType::kF32 || (piece < g.shard_numel && n > 1);
          bytes = (pack ? 4 * n * piece : 0) + 4 * piece;
        }
        want = std::max(want, bytes);
      }
      CHECK(run.opt->layout().groups[0].shard_numel > bucket / n);  // pieces happen
      TrainStep(*run.opt, 0);
      const MemoryStat stats = run.device->allocator()
                                   .stats()
                                   .by_category[static_cast<int>(MemoryCategory::kCommBuffer)];
      CHECK(stats.peak == want);
      CHECK(stats.current == 0);
    }
  }
}

TEST_CASE("communication per step equals the ZeRO volumes to the byte", "[zero][comm]") {
  for (int run_index = 0; run_index < 8; ++run_index) {
    const int stage = run_index % 4;
    const bool overlap = run_index >= 4;
    INFO("stage " << stage << ", overlap " << overlap);
    Run run = Start(Options(stage, DType::kBF16, 1, 0.0f, overlap));
    const int64_t P = run.opt->layout().padded_numel;
    World().ResetStats();
    TrainStep(*run.opt, 0);
    const auto bytes = [](Collective c) { return World().stats(c).bytes; };
    // Gradients reduce in f32 (4 bytes), parameters gather in bf16 (2).
    if (stage == 0) {
      CHECK(bytes(Collective::kAllReduce) == 4 * P);  // P elements; ZeRO counts 2P of traffic
      CHECK(bytes(Collective::kReduceScatter) == 0);
      CHECK(bytes(Collective::kAllGather) == 0);
    } else {
      CHECK(bytes(Collective::kAllReduce) == 0);
      CHECK(bytes(Collective::kReduceScatter) == 4 * P);
      // Stages 1-2 gather P once after the step; stage 3 gathers P in
      // forward and again in backward: 2P and 3P elements in all. Step()
      // also gathers its scalars (the inf/nan flag and the squared norm of
      // each rank's shard): 4 f32 per rank.
      const int64_t n = World().world_size();
      CHECK(bytes(Collective::kAllGather) == (stage == 3 ? 2 : 1) * 2 * P + 16 * n);
    }
  }
}

TEST_CASE("a bf16 reduction halves the reduction bytes and stays close", "[zero][comm]") {
  const int n = World().world_size();
  for (int stage : {0, 2}) {
    INFO("stage " << stage << " on " << n << " ranks");
    // SGD, so a gradient difference maps linearly onto the weights.
    ShardingOptions f32 = Options(stage, DType::kF32, 1, 0.0f);
    f32.optimizer.type = OptimizerType::kSgd;
    f32.optimizer.lr = 0.05f;
    ShardingOptions bf16 = f32;
    bf16.reduce_dtype = DType::kBF16;
    Run exact = Start(f32), narrow = Start(bf16);
    const int64_t P = narrow.opt->layout().padded_numel;
    for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*exact.opt, k).applied);
    World().ResetStats();
    for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*narrow.opt, k).applied);
    const int64_t reduced = World().stats(Collective::kAllReduce).bytes +
                            World().stats(Collective::kReduceScatter).bytes;
    CHECK(reduced == 3 * 2 * P);  // 2 bytes per element, 3 steps
    // Per element, the N gradients (|g| < 1) are rounded to bf16 and added
    // in bf16: each rounding is at most 2^-9 of a partial sum below N, so the
    // mean is off by at most 2^-9 * N; SGD moves the weights by lr times
    // that per step (doubled for the weights' feedback into the gradients).
    const double bound = 3 * 0.05 * n * 0x1p-8;
    for (const Param& p : kModel) {
      std::vector<float> a(NumElements(p.shape)), b(a.size());
      REQUIRE(exact.opt->MasterWeights(p.name, absl::MakeSpan(a)).ok());
      REQUIRE(narrow.opt->MasterWeights(p.name, absl::MakeSpan(b)).ok());
      for (size_t j = 0; j < a.size(); ++j) REQUIRE(std::fabs(a[j] - b[j]) <= bound);
    }
  }
}

TEST_CASE("stage 3 prefetches ahead within the prefetch budget and the live limit",
          "[zero][prefetch]") {
  const int64_t n = World().world_size();
  for (int64_t live_limit : {int64_t{1} << 40, int64_t{0}}) {
    INFO("live limit " << live_limit);
    ShardingOptions options = Options(3, DType::kBF16, 1, 0.0f, /*overlap=*/true);
    options.zero.stage3_max_live_parameters = live_limit;
    Run run = Start(options);
    World().ResetStats();  // nothing is in flight yet
    const FlatLayout& layout = run.opt->layout();
    REQUIRE(layout.groups.size() >= 3);
    const int64_t P = layout.padded_numel;
    const auto params = [&] {
      return run.device->allocator().stats().by_category[int(MemoryCategory::kParameter)].current;
    };
    // Forward: the first gather looks ahead to 1, 2, ... as far as allowed.
    REQUIRE(run.opt->GatherParameters(0).ok());
    REQUIRE(run.opt->ReleaseParameters(0).ok());
    REQUIRE(run.opt->GatherParameters(1).ok());
    int64_t expected = 2 * P / n + 2 * layout.groups[1].padded_numel;
    if (live_limit > 0) {
      for (size_t g = 2; g < layout.groups.size(); ++g)
        expected += 2 * layout.groups[g].padded_numel;
    }
    CHECK(params() == expected);
    // A prefetched group is not readable until it is asked for.
    if (live_limit > 0) {
      CHECK(run.opt->Parameter(kModel[layout.groups[2].parameters[0]].name).status().code() ==
            absl::StatusCode::kFailedPrecondition);
    }
    REQUIRE(run.opt->ReleaseParameters(1).ok());
    REQUIRE(run.opt->GatherParameters(2).ok());
    REQUIRE(run.opt->ReleaseParameters(2).ok());
    // Step drops what was prefetched and not used, after which the counters
    // are settled: a prefetched group was used without another gather, so
    // every group was gathered once with prefetch, and 0, 1, 2 without;
    // Step() adds one gather of its scalars (the inf/nan flag and squared
    // norm).
    REQUIRE(run.opt->Step().ok());
    CHECK(params() == 2 * P / n);
    CHECK(World().stats(Collective::kAllGather).calls ==
          (live_limit > 0 ? static_cast<int64_t>(layout.groups.size()) : 3) + 1);
  }
}

TEST_CASE("stage 3 prefetches in the order the previous step gathered", "[zero][prefetch]") {
  // A driver whose forward reads group 0 again at its end, as GPT's LM head
  // reads the tied embedding.
  Run run = Start(Options(3, DType::kBF16, 1, 0.0f, /*overlap=*/true));
  const FlatLayout& layout = run.opt->layout();
  const int last = static_cast<int>(layout.groups.size()) - 1;
  REQUIRE(last >= 2);
  const auto params = [&] {
    return run.device->allocator()
        .stats()
        .by_category[static_cast<int>(MemoryCategory::kParameter)]
        .current;
  };
  const auto use = [&](int g) {
    REQUIRE(run.opt->GatherParameters(g).ok());
    REQUIRE(run.opt->ReleaseParameters(g).ok());
  };
  for (int step = 0; step < 2; ++step) {
    for (int g = 0; g <= last; ++g) use(g);
    use(0);  // the tied head
    REQUIRE(run.opt->Step().ok());
  }
  // Going up to the last group, direction would prefetch nothing beyond
  // it; the recorded order knows group 0 comes next.
  for (int g = 0; g < last; ++g) use(g);
  REQUIRE(run.opt->GatherParameters(last).ok());
  const int64_t shards = 2 * layout.padded_numel / World().world_size();
  const int64_t held =
      shards + 2 * (layout.groups[last].padded_numel + layout.groups[0].padded_numel);
  CHECK(params() == held);
  // In flight, not readable until asked for; then served by the prefetch
  // (no new gathered buffer).
  CHECK(run.opt->Parameter(kModel[layout.groups[0].parameters[0]].name).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(run.opt->ReleaseParameters(last).ok());
  REQUIRE(run.opt->GatherParameters(0).ok());
  CHECK(params() == shards + 2 * layout.groups[0].padded_numel);
  REQUIRE(run.opt->ReleaseParameters(0).ok());
  REQUIRE(run.opt->Step().ok());
  CHECK(params() == shards);
}

TEST_CASE("an inf on one rank skips the step everywhere and halves the scale", "[zero][fp16]") {
  const int ranks = World().world_size(), rank = World().rank();
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    Run run = Start(Options(stage, DType::kF16, 1, 0.0f));
    CHECK(run.opt->loss_scale() == 256.0f);
    REQUIRE(TrainStep(*run.opt, 0).applied);
    std::vector<float> before(NumElements(kModel[1].shape));
    REQUIRE(run.opt->MasterWeights(kModel[1].name, absl::MakeSpan(before)).ok());
    const float bad = rank == ranks - 1 ? std::numeric_limits<float>::infinity() : 0.0f;
    const ShardedOptimizer::StepResult skipped = TrainStep(*run.opt, 1, bad);
    CHECK_FALSE(skipped.applied);
    CHECK(skipped.loss_scale == 128.0f);
    CHECK(run.opt->loss_scale() == 128.0f);
    CHECK(run.opt->steps_skipped() == 1);
    CHECK(run.opt->steps_applied() == 1);
    std::vector<float> after(before.size());
    REQUIRE(run.opt->MasterWeights(kModel[1].name, absl::MakeSpan(after)).ok());
    CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
    // The gradients were cleared: the next step is clean and applies.
    REQUIRE(TrainStep(*run.opt, 2).applied);
    REQUIRE(run.opt->MasterWeights(kModel[1].name, absl::MakeSpan(after)).ok());
    CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) != 0);
  }
}

TEST_CASE("the loss scale grows after clean windows and honours hysteresis", "[zero][fp16]") {
  const int ranks = World().world_size(), rank = World().rank();
  ShardingOptions options = Options(2, DType::kF16, 1, 0.0f);
  options.loss_scale.loss_scale_window = 2;
  options.loss_scale.hysteresis = 2;
  options.loss_scale.min_loss_scale = 64.0f;
  Run run = Start(options);
  const float inf = std::numeric_limits<float>::infinity();
  const float bad = rank == 0 ? inf : 0.0f;
  std::vector<float> scales;
  std::vector<bool> applied;
  // clean, clean (doubles), overflow (hysteresis absorbs), overflow (halves),
  // overflow, overflow (halves), then down to the floor.
  const std::vector<float> inject = {0, 0, bad, bad, bad, bad, bad, bad, bad, bad};
  for (size_t k = 0; k < inject.size(); ++k) {
    const ShardedOptimizer::StepResult r = TrainStep(*run.opt, static_cast<int>(k), inject[k]);
    applied.push_back(r.applied);
    scales.push_back(r.loss_scale);
  }
  // Every rank sees the same decisions (rank 0 injected; others did not).
  CHECK(applied ==
        std::vector<bool>{true, true, false, false, false, false, false, false, false, false});
  CHECK(scales == std::vector<float>{256, 512, 512, 256, 256, 128, 128, 64, 64, 64});
  CHECK(run.opt->steps_applied() == 2);
  CHECK(run.opt->steps_skipped() == 8);
  (void)ranks;
}

TEST_CASE("a stage outside 0-3, an unresolved auto included, is refused on every rank",
          "[zero][errors]") {
  auto device = CreateDevice({Backend::kHost, World().rank(), 64 * kMiB}).value();
  auto unresolved =
      ShardedOptimizer::Create(Options(kAutoStage, DType::kF32, 1, 0.0f), *device, World());
  CHECK(unresolved.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(unresolved.status().message()) ==
        "ShardedOptimizer: zero_optimization.stage: expected 0, 1, 2 or 3, got -1 (\"auto\" "
        "unresolved: the engine resolves it)");
  auto four = ShardedOptimizer::Create(Options(4, DType::kF32, 1, 0.0f), *device, World());
  CHECK(four.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(four.status().message()) ==
        "ShardedOptimizer: zero_optimization.stage: expected 0, 1, 2 or 3, got 4");
  CHECK(device->allocator().stats().requested.peak == 0);
}

TEST_CASE("misuse gets the specific error", "[zero][errors]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto opt = ShardedOptimizer::Create(Options(3, DType::kBF16, 1, 0.0f), *device, World()).value();
  std::vector<float> four(4, 1.0f);
  absl::Status s = opt->AddParameter("w", {2, 3}, four);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) == "parameter 'w': 4 initial values for a shape of 6 elements");
  s = opt->AddParameter("w", {2, 0}, {});
  CHECK(std::string(s.message()) == "parameter 'w': shape[1] is 0; expected >= 1");
  REQUIRE(opt->AddParameter("w", {2, 2}, four).ok());
  s = opt->AddParameter("w", {4}, four);
  CHECK(std::string(s.message()) == "parameter 'w': registered twice");
  auto early = opt->Step();
  CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(early.status().message()) ==
        "Step: call Finalize() after registering the parameters");
  REQUIRE(opt->Finalize().ok());
  s = opt->AddParameter("late", {1}, std::vector<float>{1.0f});
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  auto view = opt->Parameter("w");
  CHECK(view.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(view.status().message()) ==
        "parameter 'w': its group 0 ('w') is not gathered; call GatherParameters(0) first");
  auto grad = opt->Gradient("w");
  CHECK(
      std::string(grad.status().message()) ==
      "gradient of 'w': its group 0 ('w') has no gradient buffer; call AcquireGradients(0) first");
  CHECK(opt->Parameter("nope").status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(opt->GatherParameters(5).message()) ==
        "GatherParameters: group 5 does not exist (1 groups)");
  REQUIRE(opt->AcquireGradients(0).ok());
  auto unreduced = opt->Step();
  CHECK(std::string(unreduced.status().message()) ==
        "Step: group 0 still holds unreduced gradients (call ReduceGradients(0))");
  REQUIRE(opt->ReduceGradients(0).ok());
  CHECK(std::string(opt->ReduceGradients(0).message()) ==
        "ReduceGradients: group 0 has no gradient buffer (call AcquireGradients first)");
  REQUIRE(opt->GatherParameters(0).ok());
  CHECK(std::string(opt->GatherParameters(0).message()) ==
        "GatherParameters: group 0 is already gathered");
  REQUIRE(opt->ReleaseParameters(0).ok());
  REQUIRE(opt->Step().ok());

  // Out of memory at Finalize leaves nothing allocated.
  auto tiny = CreateDevice({Backend::kHost, 0, 4 * kMiB}).value();
  auto big = ShardedOptimizer::Create(Options(0, DType::kF32, 1, 0.0f), *tiny, World()).value();
  REQUIRE(big->AddParameter("w", {1024, 1024}, std::vector<float>(1 << 20, 0.0f)).ok());
  s = big->Finalize();
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(tiny->allocator().stats().requested.current == 0);
}

}  // namespace
}  // namespace memwall
