#include "sharding/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace memwall {

float ScheduledLr(const LrSchedule& s, int64_t step, float lr) {
  using Type = LrSchedule::Type;
  if (s.type == Type::kNone) return lr;
  const double w = double(std::max<int64_t>(2, s.warmup_num_steps));
  const double t = double(s.total_num_steps);
  double k = double(std::max<int64_t>(0, step));
  if (s.type == Type::kWarmupCosineLR) k = std::min(k, std::max(0.0, t - 1));
  const double warm = s.warmup_linear ? k / w : std::log(k + 1) / std::log(w);
  if (s.type == Type::kWarmupCosineLR) {
    double ratio;
    if (k < w) {
      ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warm;
    } else {
      const double pi = std::acos(-1.0);
      const double cosine = (1 + std::cos(pi * (k - w + 1) / std::max(1.0, t - w))) / 2;
      ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
    }
    return static_cast<float>(double(lr) * ratio);
  }
  const double low = s.warmup_min_lr, delta = double(s.warmup_max_lr) - s.warmup_min_lr;
  double gamma = 1.0;
  if (k < w) {
    gamma = warm;
  } else if (s.type == Type::kWarmupDecayLR) {
    gamma = std::max(0.0, (t - k) / std::max(1.0, t - w));
  }
  return static_cast<float>(low + delta * gamma);
}

}  // namespace memwall
