#include "sharding/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace memwall {

LossScaler::LossScaler(const LossScaleConfig& config, bool fp16)
    : config_(config), dynamic_(fp16 && config.static_scale <= 0) {
  if (fp16) {
    scale_ = config.static_scale > 0 ? config.static_scale
                                     : std::ldexp(1.0f, config.initial_scale_power);
  }
  overflows_left_ = config.hysteresis;
}

void LossScaler::Update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    clean_steps_ = 0;
    if (--overflows_left_ <= 0) {
      scale_ = std::max(scale_ / 2.0f, config_.min_loss_scale);
      overflows_left_ = config_.hysteresis;
    }
    return;
  }
  if (++clean_steps_ % config_.loss_scale_window == 0) {
    scale_ *= 2.0f;
    overflows_left_ = config_.hysteresis;
  }
}

void LossScaler::Restore(float scale, int clean_steps, int overflows_left) {
  scale_ = scale;
  clean_steps_ = clean_steps;
  overflows_left_ = overflows_left;
}

}  // namespace memwall
