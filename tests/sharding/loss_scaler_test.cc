// The loss scale as DeepSpeed's dynamic loss scaler moves it, step by step.
#include "sharding/loss_scaler.h"

#include "catch2/catch.hpp"

namespace memwall {
namespace {

LossScaleConfig Dynamic(int power, int window, int hysteresis, float min_scale) {
  LossScaleConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  return c;
}

TEST_CASE("the scale halves after hysteresis overflows and doubles after clean windows",
          "[loss_scaler]") {
  LossScaler s(Dynamic(4, 3, 2, 2.0f), /*fp16=*/true);
  CHECK(s.scale() == 16.0f);
  s.Update(true);  // first overflow: hysteresis holds the scale
  CHECK(s.scale() == 16.0f);
  CHECK(s.overflows_left() == 1);
  s.Update(true);  // second: halves, hysteresis restarts
  CHECK(s.scale() == 8.0f);
  CHECK(s.overflows_left() == 2);
  s.Update(false);
  s.Update(false);
  CHECK(s.scale() == 8.0f);
  CHECK(s.clean_steps() == 2);
  s.Update(false);  // the third clean step in a row doubles
  CHECK(s.scale() == 16.0f);
  s.Update(true);
  s.Update(true);
  s.Update(true);
  s.Update(true);  // 16 -> 8 -> 4
  CHECK(s.scale() == 4.0f);
  s.Update(true);
  s.Update(true);  // never below min_loss_scale
  CHECK(s.scale() == 2.0f);
  s.Update(true);
  s.Update(true);
  CHECK(s.scale() == 2.0f);
  CHECK(s.clean_steps() == 0);
}

TEST_CASE("static scales, and runs without fp16, never move; Restore sets all three",
          "[loss_scaler]") {
  LossScaleConfig fixed = Dynamic(4, 1, 1, 1.0f);
  fixed.static_scale = 128.0f;
  LossScaler s(fixed, /*fp16=*/true);
  CHECK(s.scale() == 128.0f);
  s.Update(true);
  s.Update(false);
  CHECK(s.scale() == 128.0f);
  LossScaler off(Dynamic(16, 1, 1, 1.0f), /*fp16=*/false);
  CHECK(off.scale() == 1.0f);
  off.Update(true);
  off.Update(false);
  CHECK(off.scale() == 1.0f);
  LossScaler restored(Dynamic(16, 1000, 2, 1.0f), /*fp16=*/true);
  restored.Restore(512.0f, 999, 1);
  CHECK(restored.scale() == 512.0f);
  CHECK(restored.clean_steps() == 999);
  CHECK(restored.overflows_left() == 1);
  restored.Update(false);  // the 1000th clean step
  CHECK(restored.scale() == 1024.0f);
}

}  // namespace
}  // namespace memwall
