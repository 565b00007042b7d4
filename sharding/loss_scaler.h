// LossScaler: the loss scale of fp16 training (DeepSpeed's dynamic loss
// scaling; sharding/options.h LossScaleConfig), as pure arithmetic.
//
// The scale starts at 2^initial_scale_power (or the static scale). After an
// overflowing step it halves once `hysteresis` overflows have been seen
// since the last change (never below min_loss_scale); after every
// loss_scale_window clean steps in a row it doubles, and the hysteresis
// count starts again. Without fp16, or with a static scale, it never
// changes. Thread-compatible.
#ifndef MEMWALL_SHARDING_LOSS_SCALER_H_
#define MEMWALL_SHARDING_LOSS_SCALER_H_

#include "sharding/options.h"

namespace memwall {

class LossScaler {
 public:
  LossScaler(const LossScaleConfig& config, bool fp16);

  // Multiply the loss by this before backward.
  float scale() const { return scale_; }
  // After a step: whether any gradient was inf or nan.
  void Update(bool overflow);

  // What a checkpoint saves and restores.
  int clean_steps() const { return clean_steps_; }
  int overflows_left() const { return overflows_left_; }
  void Restore(float scale, int clean_steps, int overflows_left);

 private:
  const LossScaleConfig config_;
  const bool dynamic_;
  float scale_ = 1.0f;
  int clean_steps_ = 0;
  int overflows_left_ = 0;  // overflows until the next halving
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_LOSS_SCALER_H_
