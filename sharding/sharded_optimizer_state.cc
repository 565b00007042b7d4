// ShardedOptimizer's optimizer-state I/O (checkpoints, tests): the f32
// state of a whole group gathered from wherever its parts live, set back
// from a whole group, and the step counters.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "runtime/status.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

int ShardedOptimizer::num_states() const {
  if (config_.optimizer.type == OptimizerType::kAdam) return 3;
  return config_.optimizer.momentum > 0 ? 2 : 1;
}

std::vector<std::string> ShardedOptimizer::state_names() const {
  return StateNames(config_.optimizer.type == OptimizerType::kAdam ? StateTier::Rule::kAdam
                                                                   : StateTier::Rule::kSgd,
                    num_states() == 2);
}

ShardedOptimizer::Progress ShardedOptimizer::progress() const {
  return Progress{steps_applied_, steps_skipped_, scaler_.scale(), scaler_.clean_steps(),
                  scaler_.overflows_left()};
}

void ShardedOptimizer::set_progress(const Progress& p) {
  steps_applied_ = p.steps_applied;
  steps_skipped_ = p.steps_skipped;
  scaler_.Restore(p.loss_scale, p.clean_steps, p.overflows_left);
}

absl::Status ShardedOptimizer::CheckState(absl::string_view call, int g, int which,
                                          size_t size) const {
  MW_RETURN_IF_ERROR(RequireFinalized(call));
  MW_RETURN_IF_ERROR(CheckGroup(g, call));
  if (which < 0 || which >= num_states()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": state ", which, " of ", num_states(),
                                                   " kept by this optimizer"));
  }
  const int64_t padded = layout_.groups[g].padded_numel;
  if (static_cast<int64_t>(size) != padded) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": ", size, " slots for group ", g, "'s ", padded, " elements"));
  }
  if (!device_.holds_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(call, ": ", device_.name(), " holds no values"));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::GatherState(int g, int which, absl::Span<float> out) {
  MW_RETURN_IF_ERROR(CheckState("GatherState", g, which, out.size()));
  const FlatGroup& flat = layout_.groups[g];
  Group& group = groups_[g];
  if (!flat.trainable) {
    if (which != 0) {
      std::fill(out.begin(), out.end(), 0.0f);
      return absl::OkStatus();
    }
    return GatherFrozen(g, out);
  }
  const int64_t un = update_numel(flat);
  // This rank's update range: the host part, then the device part.
  std::vector<float> part(un);
  for (const Tier& t : TiersOf(flat, group)) {
    MW_RETURN_IF_ERROR(t.tier->ReadState(which, 0, t.tier->numel(), part.data() + t.begin));
  }
  if (!rules_.shards_updates()) {  // every rank updates (and holds) the whole group
    std::copy(part.begin(), part.end(), out.begin());
    return absl::OkStatus();
  }
  MW_ASSIGN_OR_RETURN(DeviceBuffer mine, device_.Allocate(un * 4, MemoryCategory::kWorkspace,
                                                          absl::StrCat(flat.name, ".state_shard")));
  MW_ASSIGN_OR_RETURN(DeviceBuffer full,
                      device_.Allocate(flat.padded_numel * 4, MemoryCategory::kWorkspace,
                                       absl::StrCat(flat.name, ".state_gather")));
  MW_RETURN_IF_ERROR(device_.CopyAsync(mine.data(), part.data(), un * 4, *comm_stream_));
  MW_RETURN_IF_ERROR(shards().AllGather(mine.data(), full.data(), un, DType::kF32, *comm_stream_));
  MW_RETURN_IF_ERROR(device_.CopyAsync(out.data(), full.data(), flat.padded_numel * 4, *comm_stream_));
  return comm_stream_->Synchronize();
}

absl::Status ShardedOptimizer::GatherFrozen(int g, absl::Span<float> out) {
  const FlatGroup& flat = layout_.groups[g];
  // Stage 3 holds a shard: gathered exactly (GatherForRead), into `scratch`
  // unless an exact copy is held already.
  DeviceBuffer scratch;
  const void* full = residence_->data(g);
  if (rules_.shards_parameters()) {
    MW_ASSIGN_OR_RETURN(const DeviceBuffer* gathered, gatherer_->GatherForRead(g, scratch));
    full = gathered->data();
  }
  MW_ASSIGN_OR_RETURN(DeviceBuffer wide,
                      device_.Allocate(flat.padded_numel * 4, MemoryCategory::kWorkspace,
                                       absl::StrCat(flat.name, ".state_gather")));
  MW_RETURN_IF_ERROR(kernels::Cast(device_, *comm_stream_, full, config_.param_dtype(),
                                   wide.data(), DType::kF32, flat.padded_numel));
  MW_RETURN_IF_ERROR(device_.CopyAsync(out.data(), wide.data(), flat.padded_numel * 4, *comm_stream_));
  return comm_stream_->Synchronize();
}

absl::Status ShardedOptimizer::SetState(int g, int which, absl::Span<const float> full) {
  MW_RETURN_IF_ERROR(CheckState("SetState", g, which, full.size()));
  const FlatGroup& flat = layout_.groups[g];
  Group& group = groups_[g];
  const int64_t ub = update_begin(flat);
  for (const Tier& t : TiersOf(flat, group)) {
    MW_RETURN_IF_ERROR(t.tier->WriteState(which, 0, t.tier->numel(), full.data() + ub + t.begin));
  }
  if (which != 0) return comm_stream_->Synchronize();
  // A secondary partition (hpZ) holds the old values.
  if (gatherer_ != nullptr) gatherer_->ParametersChanged(g);
  // The parameters the rank holds (the whole group at stages 0-2, its
  // shard at stage 3), rounded from the master weights as Step() refreshes
  // them, wherever they live. Host memory is written after the tiers'
  // writes on the stream have run (an f32 run's device part keeps its
  // master weights in the parameters themselves).
  if (residence_->place(g) != ParamResidence::Place::kDevice) {
    MW_RETURN_IF_ERROR(comm_stream_->Synchronize());
  }
  return residence_->Write(g, full.data() + rules_.held_parameters_begin(flat, shards().rank()),
                           *comm_stream_, absl::StrCat(flat.name, ".state_in"));
}

absl::Status ShardedOptimizer::MasterWeights(absl::string_view name, absl::Span<float> out) {
  MW_ASSIGN_OR_RETURN(const ParameterPlacement* found, Placement(name));
  const ParameterPlacement& place = *found;
  const int g = place.group;
  if (static_cast<int64_t>(out.size()) != place.numel) {
    return absl::InvalidArgumentError(absl::StrCat("MasterWeights('", name, "'): ", out.size(),
                                                   " slots for ", place.numel, " elements"));
  }
  if (!device_.holds_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat("MasterWeights('", name, "'): ", device_.name(), " holds no values"));
  }
  std::vector<float> full(layout_.groups[g].padded_numel);
  MW_RETURN_IF_ERROR(GatherState(g, 0, absl::MakeSpan(full)));
  std::copy(full.begin() + place.offset, full.begin() + place.offset + place.numel, out.begin());
  return absl::OkStatus();
}

}  // namespace memwall
