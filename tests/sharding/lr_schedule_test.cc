// DeepSpeed's warm-up schedules (sharding/lr_schedule.h) at the steps where
// their pieces meet, against values worked out by hand from DeepSpeed's
// documented formulas.
#include <cmath>

#include "catch2/catch.hpp"
#include "sharding/lr_schedule.h"

namespace memwall {
namespace {

using Type = LrSchedule::Type;

LrSchedule Schedule(Type type, bool linear) {
  LrSchedule s;
  s.type = type;
  s.warmup_linear = linear;
  s.warmup_num_steps = 10;
  s.warmup_min_lr = 1e-4f;
  s.warmup_max_lr = 1e-3f;
  s.total_num_steps = 30;
  s.warmup_min_ratio = 0.2f;
  s.cos_min_ratio = 0.1f;
  return s;
}

TEST_CASE("no schedule leaves each group's rate as it is", "[lr_schedule]") {
  CHECK(ScheduledLr(LrSchedule(), 12345, 3e-4f) == 3e-4f);
}

TEST_CASE("WarmupLR rises from min to max, logarithmically or linearly, then holds",
          "[lr_schedule]") {
  const LrSchedule log = Schedule(Type::kWarmupLR, false), linear = Schedule(Type::kWarmupLR, true);
  CHECK(ScheduledLr(log, 0, 5.0f) == Approx(1e-4));  // log(1) = 0; the group's lr is ignored
  CHECK(ScheduledLr(log, 4, 5.0f) == Approx(1e-4 + 9e-4 * std::log(5.0) / std::log(10.0)));
  CHECK(ScheduledLr(log, 9, 5.0f) == Approx(1e-3));  // log(10) / log(10)
  CHECK(ScheduledLr(linear, 4, 5.0f) == Approx(1e-4 + 9e-4 * 0.4));
  CHECK(ScheduledLr(linear, 9, 5.0f) == Approx(1e-4 + 9e-4 * 0.9));
  CHECK(ScheduledLr(linear, 10, 5.0f) == Approx(1e-3));
  CHECK(ScheduledLr(linear, 1000000, 5.0f) == Approx(1e-3));
  LrSchedule one = linear;
  one.warmup_num_steps = 0;  // at least 2, as DeepSpeed's
  CHECK(ScheduledLr(one, 1, 5.0f) == Approx(1e-4 + 9e-4 * 0.5));
}

TEST_CASE("WarmupDecayLR decays linearly to 0 at total_num_steps", "[lr_schedule]") {
  const LrSchedule s = Schedule(Type::kWarmupDecayLR, true);
  CHECK(ScheduledLr(s, 5, 5.0f) == Approx(1e-4 + 9e-4 * 0.5));
  CHECK(ScheduledLr(s, 10, 5.0f) == Approx(1e-4 + 9e-4 * 20.0 / 20.0));
  CHECK(ScheduledLr(s, 25, 5.0f) == Approx(1e-4 + 9e-4 * 5.0 / 20.0));
  CHECK(ScheduledLr(s, 30, 5.0f) == Approx(1e-4));
  CHECK(ScheduledLr(s, 40, 5.0f) == Approx(1e-4));  // gamma stops at 0
}

TEST_CASE("WarmupCosineLR scales each group's rate: warm-up ratio, then a half cosine",
          "[lr_schedule]") {
  const LrSchedule s = Schedule(Type::kWarmupCosineLR, true);
  const double pi = std::acos(-1.0);
  CHECK(ScheduledLr(s, 0, 2e-3f) == Approx(2e-3 * 0.2));
  CHECK(ScheduledLr(s, 5, 2e-3f) == Approx(2e-3 * (0.2 + 0.8 * 0.5)));
  CHECK(ScheduledLr(s, 5, 1e-3f) == Approx(1e-3 * (0.2 + 0.8 * 0.5)));  // per group
  // The first step after warm-up is already one cosine step in.
  CHECK(ScheduledLr(s, 10, 2e-3f) == Approx(2e-3 * (0.1 + 0.9 * (1 + std::cos(pi / 20)) / 2)));
  CHECK(ScheduledLr(s, 19, 2e-3f) == Approx(2e-3 * (0.1 + 0.9 * 0.5)));
  CHECK(ScheduledLr(s, 29, 2e-3f) == Approx(2e-3 * 0.1));  // the last step: cos(pi)
  CHECK(ScheduledLr(s, 500, 2e-3f) == Approx(2e-3 * 0.1));  // and it stays there
}

}  // namespace
}  // namespace memwall
