// ZeRO with offload on real MPI ranks (mpirun -np 1, 2, 4): the optimizer
// states in pinned memory or on NVMe, the CPU update overlapped with
// backward, parameter paging and parameters on NVMe, each bit for bit the
// on-device run, with the memory each moves and the errors it names. The
// toy model and the exactness argument are sharded_optimizer_test.cc's.
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

TEST_CASE("optimizer offload trains bit for bit like the on-device update", "[zero][offload]") {
  const int ranks = World().world_size();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (bool overlap : {false, true}) {
        ShardingOptions options = Options(stage, dtype, 2, 0.05f, overlap);
        Run plain = Start(options);
        for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*plain.opt, k).applied);
        const std::vector<float> want = Finish(*plain.opt);
        for (float ratio : {1.0f, 0.5f}) {
          INFO(Name(dtype) << ", stage " << stage << ", overlap " << overlap << ", ratio " << ratio
                           << ", " << ranks << " ranks");
          options.zero.offload_optimizer_ratio = ratio;
          Run offloaded = Start(options);
          for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*offloaded.opt, k).applied);
          const std::vector<float> got = Finish(*offloaded.opt);
          REQUIRE(got.size() == want.size());
          CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
        }
      }
    }
  }
}

// The steps of an overlapped-update run: clean steps, steps that clip,
// an overflow on one rank (skipped everywhere), and a learning rate
// changed after backward, in the middle of the run.
struct Scripted {
  float multiplier = 1;  // x4: the global norm exceeds the clipping (the test sets it so)
  bool overflow = false;
  float lr = 0;  // set: the learning rate, changed between backward and Step
};

std::vector<ShardedOptimizer::StepResult> RunScript(ShardedOptimizer& opt,
                                                    const std::vector<Scripted>& script) {
  std::vector<ShardedOptimizer::StepResult> results;
  for (size_t k = 0; k < script.size(); ++k) {
    const Scripted& s = script[k];
    const float inf = std::numeric_limits<float>::infinity();
    MicroBatches(opt, static_cast<int>(k), s.overflow && World().rank() == 0 ? inf : 0.0f,
                 s.multiplier);
    if (s.lr != 0) {
      Hyperparameters h = opt.config().optimizer;
      h.lr = s.lr;
      REQUIRE(opt.SetHyperparameters(0, h).ok());
    }
    auto result = opt.Step();
    REQUIRE(result.ok());
    results.push_back(*result);
  }
  return results;
}

TEST_CASE("the CPU update overlapped with backward ends bit for bit as the step-time update",
          "[zero][offload][overlap_step]") {
  const int ranks = World().world_size();
  const std::vector<Scripted> script = {
      {1}, {4}, {1}, {1, true}, {4, true}, {1, false, 5e-3f}, {4, false, 2e-2f}, {1}};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int stage = 2; stage <= 3; ++stage) {
      for (int variant = 0; variant < (stage == 3 ? 5 : 4); ++variant) {
        // Variants: the whole shard offloaded (gradients streamed to the
        // host), half of it, the NVMe tier (whole, half), and (stage 3)
        // parameter paging.
        const float ratio = variant == 1 || variant == 3 ? 0.5f : 1.0f;
        const bool nvme = variant == 2 || variant == 3;
        const bool paging = variant == 4;
        for (bool overlap_comm : {false, true}) {
          INFO(Name(dtype) << ", stage " << stage << ", ratio " << ratio << ", NVMe " << nvme
                           << ", paging " << paging << ", overlap_comm " << overlap_comm << ", "
                           << ranks << " ranks");
          ShardingOptions options = Options(stage, dtype, 2, 0.0f, overlap_comm);
          options.zero.offload_optimizer_ratio = ratio;
          options.zero.offload_param = paging;
          if (nvme) {
            const char* dir = std::getenv("TEST_TMPDIR");
            options.zero.offload_nvme_path = dir != nullptr ? dir : "/tmp";
            options.aio.block_size = 4096;  // 1024-element chunks, two buffers
            options.aio.queue_depth = 3;
            options.zero.offload_buffer_count = 2;
          }
          // Clipping between the norms of a plain step and a x4 one (the
          // norm depends on the world size: the ranks' gradients average).
          options.gradient_clipping = 1e30f;  // norms taken, nothing clipped
          Run probe = Start(options);
          const auto norms = RunScript(*probe.opt, {{1}, {4}});
          const float clipping =
              static_cast<float>(std::sqrt(norms[0].grad_norm * norms[1].grad_norm));
          options.gradient_clipping = clipping;
          Run at_step = Start(options);
          const auto want = RunScript(*at_step.opt, script);
          options.zero.offload_overlap_step = true;
          options.zero.offload_cpu_threads = 2;
          Run overlapped = Start(options);
          const auto got = RunScript(*overlapped.opt, script);
          for (size_t k = 0; k < script.size(); ++k) {
            INFO("step " << k);
            CHECK(got[k].applied == want[k].applied);
            CHECK(got[k].grad_norm == want[k].grad_norm);
            CHECK(got[k].loss_scale == want[k].loss_scale);
          }
          // The script covers every path: steps skipped, steps that
          // clipped (x4) or changed the rate (updated again), and clean
          // steps committed as speculated.
          int clipped = 0, skipped = 0;
          for (size_t k = 0; k < script.size(); ++k) {
            clipped += want[k].applied && want[k].grad_norm > clipping;
            skipped += !want[k].applied;
          }
          CHECK(skipped == 2);
          CHECK(clipped == 2);
          // Steps 1 and 6 clipped, steps 5 and 6 changed the rate.
          CHECK(overlapped.opt->redone_updates() == 3);
          CHECK(overlapped.opt->steps_applied() == 6);
          CHECK(overlapped.opt->overlapped_update_seconds() > 0);
          const std::vector<float> a = Finish(*at_step.opt), b = Finish(*overlapped.opt);
          REQUIRE(a.size() == b.size());
          CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("the profile shows the CPU update and the NVMe transfers on tracks of their own",
          "[zero][offload][overlap_step][profiler]") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const int steps = 3;
  for (bool overlap : {false, true}) {
    INFO("overlap_step " << overlap << ", " << World().world_size() << " ranks");
    ShardingOptions options = Options(2, DType::kF32, 1, 0.0f);
    options.zero.offload_optimizer_ratio = 1.0f;
    options.zero.offload_nvme_path = dir != nullptr ? dir : "/tmp";
    // Chunks of 1024 elements: 3 states x 4 bytes x 1024 = 3 blocks of 4096.
    options.aio.block_size = 4096;
    options.aio.queue_depth = 3;
    options.zero.offload_buffer_count = 2;
    options.zero.offload_overlap_step = overlap;
    Run run = Start(options);
    MemoryProfiler profiler(run.device->allocator());
    run.opt->set_profiler(&profiler);
    RunScript(*run.opt, std::vector<Scripted>(steps));
    // Every group's shard updates on the host once a step, its chunks read
    // and written once: 12 bytes an element, each chunk in whole 4096-byte
    // blocks.
    std::map<std::string, int> want_updates;
    int64_t want_bytes = 0;
    for (const FlatGroup& g : run.opt->layout().groups) {
      want_updates["update " + g.name] = steps;
      for (int64_t c = 0; c < g.shard_numel; c += 1024) {
        want_bytes += (12 * std::min<int64_t>(1024, g.shard_numel - c) + 4095) / 4096 * 4096;
      }
    }
    std::map<std::string, int> updates;
    std::map<std::string, std::vector<const ActivityRecord*>> by_group;
    int64_t read = 0, written = 0;
    const std::vector<ActivityRecord> activities = profiler.activities();
    for (const ActivityRecord& a : activities) {
      INFO(a.track << ": " << a.name);
      CHECK(a.end_us >= a.start_us);
      if (a.track == "cpu update") {
        ++updates[a.name];
        by_group[a.name.substr(7)].push_back(&a);
      } else if (a.track == "nvme read") {
        read += a.bytes;
      } else {
        CHECK(a.track == "nvme write");
        written += a.bytes;
      }
    }
    CHECK(updates == want_updates);
    CHECK(read == steps * want_bytes);
    CHECK(written == steps * want_bytes);
    // Where each update ran. At the step: inside the step's "update" phase.
    // Overlapped: after its group's final gradients were handed over (the
    // group's "reduce" phase of that step began) and before the step's
    // "update" phase (Step() waits for the update thread first).
    std::vector<PhaseRecord> update_phases;
    std::map<std::string, std::vector<PhaseRecord>> reduce_phases;
    for (const PhaseRecord& p : profiler.phases()) {
      if (p.name == "update") update_phases.push_back(p);
      if (absl::StartsWith(p.name, "reduce ")) reduce_phases[p.name.substr(7)].push_back(p);
    }
    REQUIRE(update_phases.size() == size_t{steps});
    for (const auto& [group, records] : by_group) {
      REQUIRE(reduce_phases[group].size() == size_t{steps});
      for (int k = 0; k < steps; ++k) {
        INFO(group << ", step " << k);
        const ActivityRecord& a = *records[k];
        if (overlap) {
          CHECK(a.start_us >= reduce_phases[group][k].start_us);
          CHECK(a.end_us <= update_phases[k].start_us);
        } else {
          CHECK(a.start_us >= update_phases[k].start_us);
          CHECK(a.end_us <= update_phases[k].end_us);
        }
      }
    }
  }
}

TEST_CASE("the overlapped update holds a spare copy of the states, and refuses what it cannot do",
          "[zero][offload][overlap_step][errors]") {
  ShardingOptions options = Options(2, DType::kBF16, 1, 0.0f);
  options.zero.offload_optimizer_ratio = 1.0f;
  Run plain = Start(options);
  options.zero.offload_overlap_step = true;
  Run overlapped = Start(options);
  const auto pinned_states = [](Run& run) {
    return run.device->pinned_allocator()
        ->stats()
        .by_category[static_cast<int>(MemoryCategory::kOptimizerState)]
        .current;
  };
  // Adam: master weights and two moments, twice.
  CHECK(pinned_states(overlapped) == 2 * pinned_states(plain));
  CHECK(pinned_states(plain) == 12 * (plain.opt->layout().padded_numel / World().world_size()));

  // The NVMe tier's spare copy is on disk: no state in pinned memory.
  const char* dir = std::getenv("TEST_TMPDIR");
  options.zero.offload_nvme_path = dir != nullptr ? dir : "/tmp";
  Run nvme = Start(options);
  CHECK(pinned_states(nvme) == 0);

  // Gradients streamed to the host (ratio 1) exist only once reduced: a
  // group never reduced cannot be stepped, overlapped or not, and the step
  // changes nothing.
  options.zero.offload_nvme_path.clear();
  for (bool overlap_step : {false, true}) {
    INFO("overlap_step " << overlap_step);
    options.zero.offload_overlap_step = overlap_step;
    Run missing = Start(options);
    const std::vector<float> before = Finish(*missing.opt);
    const int last = static_cast<int>(missing.opt->layout().groups.size()) - 1;
    REQUIRE(missing.opt->AcquireGradients(last).ok());
    REQUIRE(missing.opt->ReduceGradients(last).ok());
    const auto step = missing.opt->Step();
    REQUIRE(step.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(step.status().message() ==
          "Step: group 0's gradients were not reduced this step (call ReduceGradients(0) after "
          "its backward)");
    const std::vector<float> after = Finish(*missing.opt);
    CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
  }
  // With part of the shard on the device, a group not reduced updates from
  // its zero gradients (weight decay only), as without overlap.
  options.zero.offload_optimizer_ratio = 0.5f;
  std::vector<std::vector<float>> ends;
  for (bool overlap_step : {false, true}) {
    options.zero.offload_overlap_step = overlap_step;
    Run partial = Start(options);
    const int last = static_cast<int>(partial.opt->layout().groups.size()) - 1;
    REQUIRE(partial.opt->AcquireGradients(last).ok());
    REQUIRE(partial.opt->ReduceGradients(last).ok());
    REQUIRE(partial.opt->Step().ok());
    ends.push_back(Finish(*partial.opt));
  }
  CHECK(std::memcmp(ends[0].data(), ends[1].data(), ends[0].size() * 4) == 0);
}

TEST_CASE("optimizer offload moves the optimizer-state bytes to the pinned pool",
          "[zero][offload][memory]") {
  const int64_t n = World().world_size();
  for (float ratio : {1.0f, 0.5f, 0.25f}) {
    for (int stage = 1; stage <= 3; ++stage) {
      INFO("stage " << stage << ", ratio " << ratio << ", " << n << " ranks");
      ShardingOptions options = Options(stage, DType::kBF16, 1, 0.0f);
      options.zero.offload_optimizer_ratio = ratio;
      Run run = Start(options);
      // Per group: the first round(ratio x shard) elements on host, the
      // rest on the device, 12 bytes each (f32 master, m, v).
      int64_t host = 0, device = 0;
      for (const FlatGroup& g : run.opt->layout().groups) {
        const int64_t k = std::llround(double(ratio) * g.shard_numel);
        host += 12 * k;
        device += 12 * (g.shard_numel - k);
      }
      const auto current = [](CachingAllocator& a, MemoryCategory c) {
        return a.stats().by_category[static_cast<int>(c)].current;
      };
      for (int k = 0; k < 2; ++k) {  // after Finalize, and after a step
        CHECK(current(run.device->allocator(), MemoryCategory::kOptimizerState) == device);
        CHECK(current(*run.device->pinned_allocator(), MemoryCategory::kOptimizerState) == host);
        CHECK(current(*run.device->pinned_allocator(), MemoryCategory::kWorkspace) == 0);
        // The gradients' landing buffers: the host part, in bf16.
        CHECK(current(*run.device->pinned_allocator(), MemoryCategory::kGradient) == host / 6);
        // With the whole shard offloaded at stages 2-3 no gradient shard
        // stays on the device; otherwise the stage's usual shard does.
        const int64_t P = run.opt->layout().padded_numel;
        CHECK(current(run.device->allocator(), MemoryCategory::kGradient) ==
              (ratio == 1.0f && stage >= 2 ? 0 : (stage == 1 ? 2 * P : 2 * P / n)));
        TrainStep(*run.opt, k);
      }
      if (ratio == 1.0f) CHECK(device == 0);
      // Host scratch: one group's at a time (the refreshed bf16 parameters
      // of its host part; Adam reads its bf16 gradients where they landed,
      // with no f32 copy), never the whole model's; streamed gradients land
      // through pinned pieces of the reduction.
      int64_t scratch = 0;
      for (const FlatGroup& g : run.opt->layout().groups) {
        const int64_t k = std::llround(double(ratio) * g.shard_numel);
        scratch = std::max(scratch, 2 * k);
        if (ratio == 1.0f && stage >= 2) {
          const int64_t piece = std::min(options.zero.reduce_bucket_size / n, g.shard_numel);
          scratch = std::max(scratch, 4 * piece);
        }
      }
      CHECK(run.device->pinned_allocator()
                ->stats()
                .by_category[static_cast<int>(MemoryCategory::kWorkspace)]
                .peak == scratch);
    }
  }
}

TEST_CASE("parameter paging trains bit for bit like stage 3, with no parameter bytes at rest",
          "[zero][offload][paging]") {
  const int64_t n = World().world_size();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool overlap : {false, true}) {
      INFO(Name(dtype) << ", overlap " << overlap << ", " << n << " ranks");
      ShardingOptions options = Options(3, dtype, 2, 0.05f, overlap);
      Run plain = Start(options);
      for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*plain.opt, k).applied);
      options.zero.offload_optimizer_ratio = 1.0f;
      options.zero.offload_param = true;
      Run paged = Start(options);
      const int64_t P = paged.opt->layout().padded_numel;
      const auto current = [](CachingAllocator& a, MemoryCategory c) {
        return a.stats().by_category[static_cast<int>(c)].current;
      };
      for (int k = 0; k < 3; ++k) {
        CHECK(current(paged.device->allocator(), MemoryCategory::kParameter) == 0);
        CHECK(current(*paged.device->pinned_allocator(), MemoryCategory::kParameter) ==
              static_cast<int64_t>(DTypeSize(dtype)) * P / n);
        REQUIRE(TrainStep(*paged.opt, k).applied);
      }
      const std::vector<float> want = Finish(*plain.opt), got = Finish(*paged.opt);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
    }
  }
}

TEST_CASE("the pager stays within its bounds under random prefetch settings",
          "[zero][offload][paging][property]") {
  const int64_t n = World().world_size();
  std::mt19937 rng(2024 + static_cast<unsigned>(n));  // the same settings on every rank
  for (int trial = 0; trial < 20; ++trial) {
    ShardingOptions options = Options(3, DType::kBF16, 1, 0.0f, /*overlap=*/true);
    options.zero.offload_optimizer_ratio = 1.0f;
    options.zero.offload_param = true;
    options.zero.stage3_prefetch_bucket_size = std::uniform_int_distribution<int64_t>(0, 600)(rng);
    options.zero.stage3_max_live_parameters = std::uniform_int_distribution<int64_t>(0, 900)(rng);
    INFO("trial " << trial << ": prefetch " << options.zero.stage3_prefetch_bucket_size
                  << ", max live " << options.zero.stage3_max_live_parameters << ", " << n
                  << " ranks");
    Run run = Start(options);
    int64_t largest = 0;
    for (const FlatGroup& g : run.opt->layout().groups) largest = std::max(largest, g.padded_numel);
    for (int k = 0; k < 2; ++k) REQUIRE(TrainStep(*run.opt, k).applied);
    // The caller's group plus prefetches within the live limit, gathered
    // (2 bytes each): shards page in straight into the gathered buffers.
    const int64_t bound = 2 * (options.zero.stage3_max_live_parameters + largest);
    const int64_t peak = run.device->allocator()
                             .stats()
                             .by_category[static_cast<int>(MemoryCategory::kParameter)]
                             .peak;
    CHECK(peak <= bound);
    CHECK(peak >= 2 * largest);  // at least the largest group was gathered
  }
}

TEST_CASE("the NVMe tier trains bit for bit, and a failed write leaves the state as it was",
          "[zero][offload][nvme]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  const int ranks = World().world_size();
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage << ", " << ranks << " ranks");
    ShardingOptions options = Options(stage, DType::kBF16, 2, 0.05f, /*overlap=*/true);
    Run plain = Start(options);
    for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*plain.opt, k).applied);
    const std::vector<float> want = Finish(*plain.opt);

    options.zero.offload_optimizer_ratio = 1.0f;
    options.zero.offload_nvme_path = dir;
    Run nvme = Start(options);
    REQUIRE(nvme.opt->nvme_store() != nullptr);
    // Master weights and Adam moments on disk (two copies), none pinned.
    CHECK(nvme.device->pinned_allocator()
              ->stats()
              .by_category[static_cast<int>(MemoryCategory::kOptimizerState)]
              .current == 0);
    CHECK(nvme.opt->nvme_store()->size() >= 2 * 12 * nvme.opt->layout().padded_numel / ranks);
    for (int k = 0; k < 2; ++k) {
      // Every group's state streams through one pipeline: one sync a step.
      const int64_t syncs = nvme.opt->nvme_store()->syncs();
      REQUIRE(TrainStep(*nvme.opt, k).applied);
      CHECK(nvme.opt->nvme_store()->syncs() - syncs == 1);
    }
    const std::vector<float> before = Finish(*nvme.opt);
    // The third step's writes fail: Step reports it, nothing moved.
    MicroBatches(*nvme.opt, 2);
    nvme.opt->nvme_store()->InjectWriteFailureAfter(0);
    const absl::StatusOr<ShardedOptimizer::StepResult> failed = nvme.opt->Step();
    REQUIRE_FALSE(failed.ok());
    CHECK_THAT(std::string(failed.status().message()),
               Catch::EndsWith("write failed: Input/output error"));
    CHECK(nvme.opt->steps_applied() == 2);
    const std::vector<float> after = Finish(*nvme.opt);
    CHECK(std::memcmp(after.data(), before.data(), after.size() * 4) == 0);
    // The disk recovers: at stages 2-3 (gradients reduced as backward ran)
    // the same step again lands where the run without offload did; stage 1
    // reduces inside Step, so it redoes the micro-batches.
    nvme.opt->nvme_store()->InjectWriteFailureAfter(-1);
    if (stage == 1) {
      Run again = Start(options);
      for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*again.opt, k).applied);
      const std::vector<float> fresh = Finish(*again.opt);
      CHECK(std::memcmp(fresh.data(), want.data(), fresh.size() * 4) == 0);
      continue;
    }
    const absl::StatusOr<ShardedOptimizer::StepResult> retried = nvme.opt->Step();
    REQUIRE(retried.ok());
    CHECK(retried->applied);
    const std::vector<float> got = Finish(*nvme.opt);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
  }
}

TEST_CASE("parameters on NVMe train bit for bit like pinned ones; a failed write changes nothing",
          "[zero][offload][nvme][paging]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  const int ranks = World().world_size();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool overlap : {false, true}) {
      ShardingOptions options = Options(3, dtype, 2, 0.05f, overlap);
      options.zero.offload_optimizer_ratio = 1.0f;
      options.zero.offload_nvme_path = dir;
      options.zero.offload_param = true;
      Run pinned = Start(options);
      for (int k = 0; k < 3; ++k) REQUIRE(TrainStep(*pinned.opt, k).applied);
      const std::vector<float> want = Finish(*pinned.opt);
      const FlatLayout& layout = pinned.opt->layout();
      const int64_t size = DTypeSize(dtype);
      // All shards on NVMe, or the groups past the first half's.
      int64_t half = 0;
      for (size_t g = 0; g < layout.groups.size() / 2; ++g) half += layout.groups[g].shard_numel;
      for (int64_t max_in_cpu : {int64_t{0}, half}) {
        for (int buffers : {1, 3}) {
          INFO(Name(dtype) << ", overlap_comm " << overlap << ", max_in_cpu " << max_in_cpu << ", "
                           << buffers << " page buffers, " << ranks << " ranks");
          options.zero.offload_param_nvme_path = dir;
          options.zero.offload_param_max_in_cpu = max_in_cpu;
          options.zero.offload_param_buffer_count = buffers;
          Run nvme = Start(options);
          NvmeStore* store = nvme.opt->param_store();
          REQUIRE(store != nullptr);
          // The pinned pool holds the shards within max_in_cpu; the file
          // the rest, twice, each in whole 4096-byte blocks.
          int64_t in_cpu = 0, on_disk = 0, largest = 0;
          for (const FlatGroup& g : layout.groups) {
            const int64_t bytes = g.shard_numel * size;
            if (in_cpu / size + g.shard_numel <= max_in_cpu && on_disk == 0) {
              in_cpu += bytes;
            } else {
              on_disk += (bytes + 4095) / 4096 * 4096;
              largest = std::max(largest, (bytes + 4095) / 4096 * 4096);
            }
          }
          REQUIRE(on_disk > 0);
          const AllocatorStats host = nvme.device->pinned_allocator()->stats();
          CHECK(host.by_category[static_cast<int>(MemoryCategory::kParameter)].current == in_cpu);
          CHECK(store->size() == 2 * on_disk);
          int64_t pages = 0;
          for (const auto& [key, bytes] : nvme.device->pinned_allocator()->OwnerBytes()) {
            if (key.first == "optimizer.param_pages") pages += bytes;
          }
          CHECK(pages == buffers * largest + 4096);
          for (int k = 0; k < 2; ++k) {
            const int64_t read = store->bytes_read(), written = store->bytes_written();
            const int64_t syncs = store->syncs(), state_syncs = nvme.opt->nvme_store()->syncs();
            REQUIRE(TrainStep(*nvme.opt, k).applied);
            // Without prefetch each micro-batch gathers every group twice
            // (forward, backward): 2 x 2 reads; the step writes each once.
            if (!overlap) CHECK(store->bytes_read() - read == 4 * on_disk);
            CHECK(store->bytes_written() - written == on_disk);
            // Each file synced once per step, after its last write (the
            // gradients' and states' file too), not once per group.
            CHECK(store->syncs() - syncs == 1);
            CHECK(nvme.opt->nvme_store()->syncs() - state_syncs == 1);
          }
          if (max_in_cpu == 0) {
            // Reads ahead: the order known (steps have run), gathering a
            // group starts reading the next groups' shards into the page
            // buffers but one (none with 1 buffer); a gather whose read is
            // under way reads nothing more; an abandoned step drops them.
            REQUIRE(layout.groups.size() >= 4);
            const auto rounded = [&](int g) {
              return (layout.groups[g].shard_numel * size + 4095) / 4096 * 4096;
            };
            const int64_t read = store->bytes_read();
            REQUIRE(nvme.opt->GatherParameters(0).ok());
            const int64_t first = rounded(0) + (buffers == 3 ? rounded(1) + rounded(2) : 0);
            CHECK(store->bytes_read() - read == first);
            REQUIRE(nvme.opt->ReleaseParameters(0).ok());
            REQUIRE(nvme.opt->GatherParameters(1).ok());
            CHECK(store->bytes_read() - read == first + (buffers == 3 ? rounded(3) : rounded(1)));
            REQUIRE(nvme.opt->ReleaseParameters(1).ok());
            REQUIRE(nvme.opt->AbortStep().ok());
          }
          const std::vector<float> before = Finish(*nvme.opt);
          // The third step's parameter writes fail (the optimizer states'
          // went to their spare copies): nothing moved.
          MicroBatches(*nvme.opt, 2);
          store->InjectWriteFailureAfter(0);
          const absl::StatusOr<ShardedOptimizer::StepResult> failed = nvme.opt->Step();
          REQUIRE_FALSE(failed.ok());
          CHECK_THAT(std::string(failed.status().message()),
                     Catch::StartsWith("NVMe store " + store->path()));
          CHECK_THAT(std::string(failed.status().message()),
                     Catch::EndsWith("write failed: Input/output error"));
          CHECK(nvme.opt->steps_applied() == 2);
          const std::vector<float> after = Finish(*nvme.opt);
          CHECK(std::memcmp(after.data(), before.data(), after.size() * 4) == 0);
          // The disk recovers: the same step lands where the pinned run did.
          store->InjectWriteFailureAfter(-1);
          const absl::StatusOr<ShardedOptimizer::StepResult> retried = nvme.opt->Step();
          REQUIRE(retried.ok());
          CHECK(retried->applied);
          const std::vector<float> got = Finish(*nvme.opt);
          REQUIRE(got.size() == want.size());
          CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
          // The file has no name in the directory even while the optimizer
          // runs (so a killed run leaves nothing), nor after it.
          const std::string path = store->path();
          CHECK_FALSE(std::filesystem::exists(path));
          nvme.opt.reset();
          CHECK_FALSE(std::filesystem::exists(path));
        }
      }
    }
  }
}

TEST_CASE("parameters on NVMe: settings it cannot honour name the setting",
          "[zero][offload][nvme][paging][errors]") {
  ShardingOptions options = Options(3, DType::kBF16, 1, 0.0f);
  options.zero.offload_optimizer_ratio = 1.0f;
  options.zero.offload_param = true;
  options.zero.offload_param_nvme_path = "/tmp";
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB, 64 * kMiB}).value();
  CHECK(ShardedOptimizer::Create(options, *device, World()).status().message() ==
        "zero_optimization.offload_param: expected offload_optimizer on \"nvme\" with device "
        "\"nvme\" (a step writes both tiers' files before committing either, so a failed write "
        "leaves both as they were)");
  const char* tmp = std::getenv("TEST_TMPDIR");
  options.zero.offload_nvme_path = tmp ? tmp : "/tmp";
  options.zero.offload_overlap_step = true;
  CHECK(ShardedOptimizer::Create(options, *device, World()).status().message() ==
        "zero_optimization.offload_optimizer.overlap_step: not supported with offload_param on "
        "\"nvme\" (the update thread would write the parameters' file while backward reads it)");
  options.zero.offload_overlap_step = false;
  // A shard larger than a page buffer.
  options.zero.offload_param_max_in_cpu = 0;
  options.zero.offload_param_buffer_size = 8;
  auto opt = ShardedOptimizer::Create(options, *device, World()).value();
  for (size_t p = 0; p < kModel.size(); ++p) {
    REQUIRE(opt->AddParameter(kModel[p].name, kModel[p].shape, Initial(p)).ok());
  }
  const absl::Status small = opt->Finalize();
  CHECK(small.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(small.message()),
             Catch::StartsWith("zero_optimization.offload_param.buffer_size: expected at least "));
  CHECK_THAT(std::string(small.message()),
             Catch::EndsWith(" (elements of the largest parameter shard on NVMe, one page buffer "
                             "each), got 8"));
  // Nothing stays behind: no pinned bytes, no file.
  CHECK(device->pinned_allocator()->stats().requested.current == 0);
}

TEST_CASE("optimizer offload: bad settings and a full host pool name the cause",
          "[zero][offload][errors]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();  // no pinned pool
  ShardingOptions options = Options(2, DType::kBF16, 1, 0.0f);
  options.zero.offload_optimizer_ratio = 1.0f;
  const absl::Status no_pool = ShardedOptimizer::Create(options, *device, World()).status();
  CHECK(no_pool.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(no_pool.message() ==
        "ShardedOptimizer: offload_optimizer keeps optimizer states in pinned host memory, but "
        "host:0 has no pinned pool (DeviceOptions::pinned_capacity_bytes)");
  options.zero.stage = 0;
  CHECK(ShardedOptimizer::Create(options, *device, World()).status().message() ==
        "zero_optimization.offload_optimizer: expected stage 1, 2 or 3 with it, got stage 0");
  options.zero.stage = 2;
  options.zero.offload_param = true;
  CHECK(ShardedOptimizer::Create(options, *device, World()).status().message() ==
        "zero_optimization.offload_param: expected stage 3 and offload_optimizer on \"cpu\" with "
        "ratio 1 with it, got stage 2 and ratio 1");
  options.zero.offload_param = false;
  options.zero.offload_optimizer_ratio = 1.5f;
  CHECK(ShardedOptimizer::Create(options, *device, World()).status().message() ==
        "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got 1.5");

  // A pinned pool too small for the states: Finalize fails naming it, and
  // nothing stays allocated.
  options.zero.offload_optimizer_ratio = 1.0f;
  DeviceOptions small{Backend::kHost, 0, 64 * kMiB};
  small.pinned_capacity_bytes = 512;
  auto tiny = CreateDevice(small).value();
  auto opt = ShardedOptimizer::Create(options, *tiny, World()).value();
  for (size_t p = 0; p < kModel.size(); ++p) {
    REQUIRE(opt->AddParameter(kModel[p].name, kModel[p].shape, Initial(p)).ok());
  }
  const absl::Status full = opt->Finalize();
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(full.message()), Catch::Contains("host:0:pinned"));
  CHECK(tiny->allocator().stats().requested.current == 0);
  CHECK(tiny->pinned_allocator()->stats().requested.current == 0);
}

}  // namespace
}  // namespace memwall
