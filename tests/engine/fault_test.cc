// Fault injection on real ranks (1 and 2):
// - an allocation that fails at any point of a training step (every
//   allocation of the step is tried in turn, on the device and in the pinned
//   pool) fails that step with the allocator's error and changes nothing:
//   parameters, optimizer states, counters and the device's books are as
//   before, and the next step trains exactly as if the failure had never
//   happened (the failure is injected on every rank at the same allocation,
//   as a symmetric out-of-memory would occur);
// - a collective that one rank leaves at any point of a step (its link
//   died) fails the step on every rank within the communicator's timeout,
//   and the trainer then fails at once instead of hanging;
// - an inf or nan in one rank's batch skips the step on every rank, in
//   every precision mode, with and without clipping and offload.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/layers.h"
#include "runtime/mpi_communicator.h"
#include "runtime/units.h"
#include "tests/support/mlp_task.h"
#include "tests/support/mpi_world.h"
#include "tests/support/values.h"

namespace memwall {
namespace {

using testing::SameBits;
using testing::World;
using Setup = testing::MlpSetup;
using Run = testing::MlpRun;

Run Start(Setup s) {
  s.accumulation = 2;
  return testing::StartMlpTask(s, World());
}

// The step's two micro-batches; with `poison`, the last rank's first one
// carries it (an inf or nan).
std::vector<Batch> Batches(Run& run, int step, std::optional<float> poison = std::nullopt) {
  const bool last = World().rank() == World().world_size() - 1;
  std::vector<Batch> batches;
  for (int u = 0; u < 2; ++u) {
    batches.push_back(testing::MlpTaskBatch(*run.device, World().rank(), 2 * step + u,
                                            u == 0 && last ? poison : std::nullopt));
  }
  return batches;
}

absl::StatusOr<Trainer::StepReport> Step(Run& run, int step) {
  return run.trainer->TrainStep(Batches(run, step));
}

std::vector<float> States(Run& run) { return testing::AllStates(run.trainer->optimizer()); }

TEST_CASE("an allocation failing anywhere in a step changes nothing", "[fault]") {
  const std::vector<Setup> setups = {
      {"stage 0, f32", 0, false},
      {"stage 2, bf16", 2, true},
      {"stage 3, bf16", 3, true},
      {"stage 2, bf16, optimizer offload 0.5", 2, true, 0.5f},
      {"stage 3, bf16, offload + paging", 3, true, 1.0f, true},
  };
  for (const Setup& s : setups) {
    // The run that never fails: its second step is what a retried one gives.
    Run clean = Start(s);
    REQUIRE(Step(clean, 0).ok());
    const std::vector<Batch> second = Batches(clean, 1);
    const int64_t calls_before = clean.device->allocator().allocate_calls();
    const int64_t pinned_before = clean.device->pinned_allocator()->allocate_calls();
    REQUIRE(clean.trainer->TrainStep(second).ok());
    const int64_t device_calls = clean.device->allocator().allocate_calls() - calls_before;
    const int64_t pinned_calls = clean.device->pinned_allocator()->allocate_calls() - pinned_before;
    const std::vector<float> want = States(clean);
    if (World().rank() == 0) {
      std::printf("%s, %d ranks: failing each of %lld device and %lld pinned-pool allocations\n",
                  s.name.c_str(), World().world_size(), static_cast<long long>(device_calls),
                  static_cast<long long>(pinned_calls));
    }
    for (bool pinned : {false, true}) {
      const int64_t calls = pinned ? pinned_calls : device_calls;
      for (int64_t nth = 1; nth <= calls; ++nth) {
        INFO(s.name << ", " << (pinned ? "pinned pool" : "device") << " allocation " << nth << " of "
                    << calls << ", " << World().world_size() << " ranks");
        Run run = Start(s);
        REQUIRE(Step(run, 0).ok());
        const std::vector<float> before = States(run);
        const std::vector<Batch> batches = Batches(run, 1);
        const int64_t live = run.device->allocator().stats().requested.current;
        const int64_t live_pinned = run.device->pinned_allocator()->stats().requested.current;
        CachingAllocator& allocator = pinned ? *run.device->pinned_allocator() : run.device->allocator();
        allocator.InjectFailure(nth);
        const auto failed = run.trainer->TrainStep(batches);
        REQUIRE(failed.status().code() == absl::StatusCode::kResourceExhausted);
        CHECK_THAT(std::string(failed.status().message()), Catch::Contains("injected failure"));
        CHECK(SameBits(States(run), before));
        CHECK(run.trainer->steps() == 1);
        CHECK(run.trainer->optimizer().steps_applied() == 1);
        CHECK(run.device->allocator().stats().requested.current == live);
        CHECK(run.device->pinned_allocator()->stats().requested.current == live_pinned);
        // The retried step is the clean run's second step, bit for bit.
        REQUIRE(run.trainer->TrainStep(batches).ok());
        CHECK(SameBits(States(run), want));
      }
    }
  }
}

TEST_CASE("a rank leaving a collective anywhere in a step fails it on every rank",
          "[fault][timeout]") {
  const int n = World().world_size(), r = World().rank();
  const std::vector<Setup> setups = {
      {"stage 0, f32", 0, false},
      {"stage 2, bf16", 2, true},
      {"stage 3, bf16", 3, true},
      {"stage 3, bf16, offload + paging", 3, true, 1.0f, true},
  };
  CommunicatorOptions options;
  options.timeout = absl::Milliseconds(250);
  for (const Setup& s : setups) {
    // How many collectives a step calls (the same on every rank).
    auto counting = MpiCommunicator::Create(options).value();
    Setup two = s;
    two.accumulation = 2;
    Run clean = testing::StartMlpTask(two, *counting);
    REQUIRE(Step(clean, 0).ok());
    const int64_t before = counting->calls();
    REQUIRE(Step(clean, 1).ok());
    const int64_t calls = counting->calls() - before;
    REQUIRE(calls > 0);
    // The first, second and last calls, and five between.
    std::set<int64_t> tried = {1, 2, calls};
    for (int i = 1; i <= 5; ++i) tried.insert(std::max<int64_t>(1, calls * i / 6));
    if (r == 0) {
      std::printf("%s, %d ranks: %lld collectives per step; leaving %zu of them\n", s.name.c_str(),
                  n, static_cast<long long>(calls), tried.size());
    }
    for (const int64_t k : tried) {
      INFO(s.name << ", rank " << n - 1 << " leaves collective " << k << " of " << calls << ", "
                  << n << " ranks");
      auto comm = MpiCommunicator::Create(options).value();
      Run run = testing::StartMlpTask(two, *comm);
      REQUIRE(Step(run, 0).ok());
      if (r == n - 1) comm->InjectFailure(comm->calls() + k);
      const auto failed = Step(run, 1);
      REQUIRE_FALSE(failed.ok());
      if (r == n - 1) {
        CHECK(failed.status().code() == absl::StatusCode::kUnavailable);
        CHECK_THAT(std::string(failed.status().message()),
                   Catch::Contains("injected failure of collective call"));
      } else {
        CHECK(failed.status().code() == absl::StatusCode::kDeadlineExceeded);
        CHECK_THAT(std::string(failed.status().message()),
                   Catch::Contains("not every rank joined within 250ms"));
      }
      CHECK_THAT(std::string(failed.status().message()),
                 Catch::EndsWith("the communicator is unusable now: end the job and resume from "
                                 "the last checkpoint"));
      CHECK(run.trainer->steps() == 1);
      // The trainer fails at once from now on: with the first error again
      // (the communication stream keeps it) or the broken communicator's.
      const auto again = Step(run, 1);
      CHECK(again.status().code() == failed.status().code());
      CHECK_THAT(std::string(again.status().message()),
                 Catch::Equals(std::string(failed.status().message())) ||
                     Catch::Contains("the communicator failed earlier"));
    }
  }
  REQUIRE(World().Barrier().ok());
}

TEST_CASE("an inf or nan on one rank skips the step on every rank in every precision mode",
          "[fault][overflow]") {
  const int n = World().world_size();
  std::vector<Setup> setups;
  for (const char* precision : {"f32", "bf16", "fp16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (float clipping : {0.0f, 1.0f}) {
        Setup s;
        s.name = absl::StrCat(precision, ", stage ", stage, ", clipping ", clipping);
        s.stage = stage;
        s.bf16 = std::string(precision) == "bf16";
        s.fp16 = std::string(precision) == "fp16";
        s.clipping = clipping;
        setups.push_back(s);
      }
    }
  }
  Setup offload{"fp16, stage 2, optimizer offload", 2, false, 1.0f};
  offload.fp16 = true;
  Setup paging{"bf16, stage 3, offload + paging, clipping 1", 3, true, 1.0f, true};
  paging.clipping = 1.0f;
  Setup partial{"f32, stage 1, optimizer offload 0.5", 1, false, 0.5f};
  setups.insert(setups.end(), {offload, paging, partial});
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Setup& s : setups) {
    for (float poison : {inf, -inf, nan}) {
      INFO(s.name << ", " << poison << " in rank " << n - 1 << "'s batch, " << n << " ranks");
      Run run = Start(s);
      REQUIRE(Step(run, 0).ok());
      const std::vector<float> before = States(run);
      ShardedOptimizer& opt = run.trainer->optimizer();
      const float scale = opt.loss_scale();
      const auto report = run.trainer->TrainStep(Batches(run, 1, poison));
      REQUIRE(report.ok());
      CHECK_FALSE(report->step.applied);
      CHECK(SameBits(States(run), before));
      CHECK(opt.steps_applied() == 1);
      CHECK(opt.steps_skipped() == 1);
      // fp16 counts the overflow towards halving the scale (hysteresis 2:
      // the second halves it); the others have no scale to change.
      CHECK(opt.loss_scale() == scale);
      CHECK(opt.progress().overflows_left == (s.fp16 ? 1 : 2));
      // The gradients were dropped: the next clean step applies everywhere.
      const auto next = Step(run, 2);
      REQUIRE(next.ok());
      CHECK(next->step.applied);
      CHECK_FALSE(SameBits(States(run), before));
    }
  }
}

}  // namespace
}  // namespace memwall
