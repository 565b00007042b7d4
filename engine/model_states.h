// ModelStates: what a caller of the engine reads and writes of a run's
// model states: its parameters, gradients and optimizer states, the
// parameter groups they are sharded in, the hyperparameter groups they
// update with, and the step counters.
//
// The engine (engine/engine.h) and the trainer (engine/trainer.h) hand one
// out; callers that own their model (the Python package, C++ programs,
// benchmarks) use it rather than the sharded optimizer underneath, whose
// other methods (registration, finalisation, the step, the tiers' files)
// are the engine's. It owns nothing: a view of the run's optimizer that
// lives as long as the engine or trainer that made it.
//
// Views and f32 forms follow the optimizer's rules
// (sharding/sharded_optimizer.h): at stage 3 a parameter can be read only
// while its group is gathered, and at stages 2-3 gradients can be added
// only between AcquireGradients and ReduceGradients of their group. Every
// method that communicates is collective (said at each): all ranks call it
// in the same order with the same arguments. Not thread-safe.
#ifndef MEMWALL_ENGINE_MODEL_STATES_H_
#define MEMWALL_ENGINE_MODEL_STATES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "sharding/flat_layout.h"
#include "sharding/hyper_groups.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

class ModelStates {
 public:
  // A parameter's or gradient's memory on the device: numel elements of
  // dtype at data (null on meta).
  using View = ShardedOptimizer::View;
  // The step counters and the dynamic loss scaler, to save and restore.
  using Progress = ShardedOptimizer::Progress;

  // `optimizer` must outlive this object.
  explicit ModelStates(ShardedOptimizer& optimizer) : opt_(optimizer) {}

  // The parameter groups: each flat group's name, size, padding, shard and
  // parameters (sharding/flat_layout.h), and every parameter in
  // registration order (layout().placements' order).
  const FlatLayout& layout() const { return opt_.layout(); }
  const std::vector<ParameterSpec>& parameters() const { return opt_.parameters(); }
  // Index of the group holding `name`; kNotFound for a name never
  // registered.
  absl::StatusOr<int> GroupOf(absl::string_view name) const { return opt_.GroupOf(name); }
  // The dtype parameters and gradients are stored in (bf16, f16 or f32).
  DType param_dtype() const { return opt_.config().param_dtype(); }
  // The caller's stream: its own device work on these views belongs on it
  // (ShardedOptimizer::stream).
  Stream& stream() { return opt_.stream(); }

  // The parameter as the model reads it, and where backward adds its
  // gradient, both in param_dtype. Stage 3: the parameter only while its
  // group is gathered; stages 2-3: the gradient only while acquired
  // (kFailedPrecondition otherwise); a frozen parameter has no gradient.
  absl::StatusOr<View> Parameter(absl::string_view name) { return opt_.Parameter(name); }
  absl::StatusOr<View> Gradient(absl::string_view name) { return opt_.Gradient(name); }
  // The same two in f32, when the views are available: ReadParameter
  // copies the parameter into `out` (its numel elements; nothing written on
  // meta); AddGradient adds `grad` in f32, rounded once to param_dtype.
  // kInvalidArgument for a size that is not the parameter's.
  absl::Status ReadParameter(absl::string_view name, absl::Span<float> out) {
    return opt_.ReadParameter(name, out);
  }
  absl::Status AddGradient(absl::string_view name, absl::Span<const float> grad) {
    return opt_.AddGradient(name, grad);
  }

  // Around the caller's forward and backward, group by group (FSDP's
  // unshard/reshard and reduce). Collective at the stages where they
  // communicate, no-ops where they do not: Gather and Release at stage 3
  // (all-gather the group's parameters before its forward or backward, free
  // the gathered copy after), AcquireGradients and ReduceGradients at
  // stages 2-3 (a zeroed full-size gradient buffer before the group's
  // backward; its reduce-scatter into this rank's shard after). A frozen
  // group has no gradients: kFailedPrecondition from the last two.
  absl::Status Gather(int group) { return opt_.GatherParameters(group); }
  absl::Status Release(int group) { return opt_.ReleaseParameters(group); }
  absl::Status AcquireGradients(int group) { return opt_.AcquireGradients(group); }
  absl::Status ReduceGradients(int group) { return opt_.ReduceGradients(group); }
  // Forgets a step that failed part-way (ShardedOptimizer::AbortStep):
  // gathered groups, buckets and reductions in flight dropped, accumulated
  // gradients zeroed, parameters and optimizer states untouched.
  absl::Status AbortStep() { return opt_.AbortStep(); }

  // Hyperparameter groups, torch's param_groups (sharding/hyper_groups.h):
  // their number, values, and the rate each trains with at the next step
  // (the config's schedule applied; kInvalidArgument naming the index for
  // one out of range). SetHyperparameters is not collective but every rank
  // must set the same values (Engine::Step checks); kInvalidArgument,
  // changing nothing, for a bad index or a value the update rule refuses.
  int num_hyper_groups() const { return opt_.num_hyper_groups(); }
  const Hyperparameters& hyperparameters(int index) const { return opt_.hyperparameters(index); }
  absl::StatusOr<float> LearningRate(int index) const;
  absl::Status SetHyperparameters(int index, const Hyperparameters& values) {
    return opt_.SetHyperparameters(index, values);
  }

  // The f32 arrays kept per element, as checkpoints name them: "master"
  // weights first, then Adam's "exp_avg" and "exp_avg_sq" or SGD's
  // "momentum" buffer (sharding/state_tier.h StateNames).
  int num_states() const { return opt_.num_states(); }
  std::vector<std::string> state_names() const { return opt_.state_names(); }
  // Collective: state `which` of group `group`, all its padded elements,
  // gathered from wherever its parts live (device, pinned pool, NVMe).
  // kInvalidArgument naming the group or state out of range;
  // kFailedPrecondition on meta.
  absl::StatusOr<std::vector<float>> GatherState(int group, int which);
  // Not collective: sets this rank's part of the group's state `which` from
  // the whole group's values (every rank passes the same). Setting the
  // master weights sets the parameters too (ShardedOptimizer::SetState).
  absl::Status SetState(int group, int which, absl::Span<const float> full) {
    return opt_.SetState(group, which, full);
  }
  // Collective: the f32 master weights of parameter `name` (its numel
  // elements). kNotFound for a name never registered; kFailedPrecondition
  // on meta.
  absl::StatusOr<std::vector<float>> MasterWeights(absl::string_view name);

  Progress progress() const { return opt_.progress(); }
  void set_progress(const Progress& progress) { opt_.set_progress(progress); }
  // Multiply the loss by this before backward (1 unless fp16).
  float loss_scale() const { return opt_.loss_scale(); }
  int64_t steps_applied() const { return opt_.steps_applied(); }
  int64_t steps_skipped() const { return opt_.steps_skipped(); }
  // Whether the offloaded update runs during backward
  // (offload_optimizer.overlap_step): the weights it starts from are those
  // before backward.
  bool overlaps_update() const { return opt_.overlaps_update(); }
  // Overlapped update: steps whose speculative updates were computed again,
  // and the seconds the update thread has spent updating (0 without it).
  int64_t redone_updates() const { return opt_.redone_updates(); }
  double overlapped_update_seconds() const { return opt_.overlapped_update_seconds(); }

 private:
  ShardedOptimizer& opt_;
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_MODEL_STATES_H_
