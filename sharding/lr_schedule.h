// Learning-rate schedules: DeepSpeed's WarmupLR, WarmupDecayLR and
// WarmupCosineLR, as the optimizer applies them (LrSchedule, options.h).
//
// Step k counts the optimizer's applied steps from 0, and the step trains
// with the schedule's value at k. (DeepSpeed's engine steps its scheduler
// after each optimizer step and starts it at iteration -1, whose rate is
// 0, so its step k trains with the value at k - 1; memwall does not spend
// the first step at rate 0.) With W = max(2, warmup_num_steps) and
// T = total_num_steps, the warm-up fraction is
//   g(k) = log(k + 1) / log(W)   (log, the default)   or   k / W   (linear),
// and the rate of a group whose own learning rate is `lr`:
//   WarmupLR        k < W: min + (max - min) g(k);   else max
//   WarmupDecayLR   k < W: min + (max - min) g(k);
//                   else min + (max - min) max(0, (T - k) / max(1, T - W))
//   WarmupCosineLR  lr x ratio, with k clamped to T - 1, the last of T steps,
//                   whose ratio is cmin (so it stays there, never rising again):
//                   k < W: ratio = wmin + (1 - wmin) g(k)
//                   else   ratio = max(0, cmin + (1 - cmin) (1 + cos(pi (k - W + 1) / max(1, T - W))) / 2)
// WarmupLR and WarmupDecayLR set the rate itself (every group the same);
// WarmupCosineLR scales each group's own.
#ifndef MEMWALL_SHARDING_LR_SCHEDULE_H_
#define MEMWALL_SHARDING_LR_SCHEDULE_H_

#include <cstdint>

#include "sharding/options.h"

namespace memwall {

// The learning rate step `step` trains with, for a group whose own is
// `lr`; `lr` itself when the schedule's type is kNone. Computed in double
// and rounded once.
float ScheduledLr(const LrSchedule& schedule, int64_t step, float lr);

}  // namespace memwall

#endif  // MEMWALL_SHARDING_LR_SCHEDULE_H_
