// Fault injection: an allocation that fails at any point of a training
// step (every allocation of the step is tried in turn, on the device and in
// the pinned pool) fails that step with the allocator's error and changes
// nothing: parameters, optimizer states, counters and the device's books are
// as before, and the next step trains exactly as if the failure had never
// happened. Real ranks: 1 and 2 (a failure on one rank is injected on every
// rank at the same allocation, as a symmetric out-of-memory would occur).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/layers.h"
#include "runtime/units.h"
#include "tests/support/mlp_task.h"
#include "tests/support/mpi_world.h"
#include "tests/support/values.h"

namespace memwall {
namespace {

using testing::SameBits;
using testing::World;

Batch MakeBatch(Device& device, int step) {
  return testing::MlpTaskBatch(device, World().rank(), step);
}

using Setup = testing::MlpSetup;
using Run = testing::MlpRun;


Run Start(Setup s) {
  s.accumulation = 2;
  return testing::StartMlpTask(s, World());
}

std::vector<Batch> Batches(Run& run, int step) {
  std::vector<Batch> batches;
  for (int u = 0; u < 2; ++u) batches.push_back(MakeBatch(*run.device, 2 * step + u));
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

}  // namespace
}  // namespace memwall
