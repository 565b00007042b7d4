// ShardedOptimizer's step (Step, AbortStep): the gradients reduced where
// stages 0-1 hold them in full, checked for inf/nan and their global norm
// taken, then every group's tiers updated (the host parts on the CPU, with
// the two-phase commit that leaves every tier as it was until all have
// updated and written), the parameters refreshed and the gradients zeroed.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "offload/nvme_chunk_stream.h"
#include "runtime/status.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

absl::Status ShardedOptimizer::AbortStep() {
  // Whatever the communication stream and the update thread still run
  // finishes first (an error, if any, is the caller's to see).
  const absl::Status drained = comm_stream_->Synchronize();
  if (overlapped_ != nullptr) overlapped_->Wait();
  if (residence_ != nullptr) residence_->DropReadAheads();
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    if (overlapped_ != nullptr) overlapped_->Drop(static_cast<int>(g));
    gatherer_->Drop(static_cast<int>(g));
    group.grad_bucket.Reset();
    group.reductions = 0;
    if (group.host != nullptr) group.host->DropGradients();
    MW_RETURN_IF_ERROR(ZeroGradients(layout_.groups[g], group));
  }
  if (gatherer_ != nullptr) gatherer_->AbortStep();  // none before Finalize()
  MW_RETURN_IF_ERROR(comm_stream_->Synchronize());
  return drained;
}

absl::Status ShardedOptimizer::SumUnfinishedReplicas() {
  // Hybrid sharding sums a shard with its replicas at its step's last
  // reduction; a group reduced fewer times than gradient_accumulation_steps
  // (on every rank alike: reductions are collective) is summed here. One
  // never reduced holds zeros on every rank.
  if (shard_group_ == nullptr || !rules_.shards_gradients()) return absl::OkStatus();
  GradientReducer::Buffers buffers;
  bool any = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    const FlatGroup& flat = layout_.groups[g];
    if (group.reductions == 0 || group.reductions == config_.gradient_accumulation_steps) continue;
    MW_RETURN_IF_ERROR(reducer_->SizeBuffers(flat, buffers, streams_gradients(flat)));
    if (!streams_gradients(flat)) {
      MW_RETURN_IF_ERROR(reducer_->AllReduceReplicas(flat, group.grads.data(), buffers));
    } else {
      // On the host: brought back piece by piece, summed, landed again.
      MW_RETURN_IF_ERROR(reducer_->AllReduceReplicas(
          flat,
          [&](int64_t begin, int64_t count) { return group.host->EarlierGradients(begin, count); },
          [&](int64_t begin, int64_t count, const void* summed) {
            return group.host->AccumulateGradients(*comm_stream_, summed, config_.reduce_dtype,
                                                   /*first=*/true, begin, count);
          },
          buffers));
    }
    any = true;
  }
  return any ? comm_stream_->Synchronize() : absl::OkStatus();
}

absl::Status ShardedOptimizer::CheckStepReady() {
  MW_RETURN_IF_ERROR(RequireFinalized("Step"));
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].grad_bucket.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Step: group ", g, " still holds unreduced gradients (call ReduceGradients(", g, "))"));
    }
    if (gatherer_->held(static_cast<int>(g)) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Step: group ", g, " is still gathered (call ReleaseParameters(", g, "))"));
    }
    // Gradients streamed to the host exist only as reduced: none at all
    // for a group never reduced this step.
    if (streams_gradients(layout_.groups[g]) && !groups_[g].host->staged()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Step: group ", g, "'s gradients were not reduced this step (call ReduceGradients(", g,
          ") after its backward)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::ReduceHeldGradients() {
  if (!rules_.reduces_at_step()) return absl::OkStatus();
  ScopedPhase phase(profiler_, "reduce");
  // One set of temporaries, sized for the largest group before any
  // reduction starts: an allocation here while an earlier reduction still
  // runs could make the allocator hand back (host: free) the segment it
  // reads. Freed once every reduction has run.
  GradientReducer::Buffers buffers;
  for (const FlatGroup& flat : layout_.groups) {
    if (flat.trainable) MW_RETURN_IF_ERROR(reducer_->SizeBuffers(flat, buffers));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& flat = layout_.groups[g];
    if (!flat.trainable) continue;
    if (rules_.all_reduces()) {
      MW_RETURN_IF_ERROR(reducer_->AllReduce(flat, groups_[g].grads.data(), buffers));
    } else {
      MW_RETURN_IF_ERROR(reducer_->ReduceScatter(flat, groups_[g].grads.data(),
                                                 UpdateGradients(flat, groups_[g]),
                                                 /*accumulate=*/false, /*final=*/true, buffers));
    }
  }
  const bool any = !buffers.wide.empty() || !buffers.packed.empty() || !buffers.out.empty();
  return any ? comm_stream_->Synchronize() : absl::OkStatus();
}

absl::StatusOr<ShardedOptimizer::GradientCheck> ShardedOptimizer::CheckGradients(bool need_norm) {
  // An inf or nan on any rank skips the step on every rank in every
  // precision mode (fp16 also lowers the scale): applying it would turn the
  // master weights into nan. With clipping the norm's sum of squares shows
  // them (an inf or nan makes it non-finite, and squares of finite 16- or
  // 32-bit values cannot overflow a double), so the scan for them runs only
  // without clipping. Every group's scan is queued, then read back with one
  // wait; the per-group sums add in group order.
  const bool need_overflow = !need_norm;
  const DType dtype = config_.param_dtype();
  MW_ASSIGN_OR_RETURN(std::unique_ptr<kernels::GradientScan> scan,
                      kernels::GradientScan::Create(device_, *comm_stream_,
                                                    static_cast<int>(groups_.size()), need_norm,
                                                    need_overflow));
  std::vector<kernels::GradientScan::Result> host(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& flat = layout_.groups[g];
    const int64_t n = update_numel(flat);
    if (!flat.trainable) continue;  // no gradients: host[g] stays clean
    if (!streams_gradients(flat)) {
      MW_RETURN_IF_ERROR(scan->Add(UpdateGradients(flat, groups_[g]), dtype, n));
    } else if (device_.holds_bytes()) {
      // The gradients are on the host (every reduction has run: Step()).
      host[g] = groups_[g].host->ScanGradients(need_overflow, need_norm);
    }
  }
  MW_ASSIGN_OR_RETURN(const std::vector<kernels::GradientScan::Result> scanned, scan->Finish());
  GradientCheck check;
  size_t next = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& flat = layout_.groups[g];
    const kernels::GradientScan::Result& r =
        !flat.trainable || streams_gradients(flat) ? host[g] : scanned[next++];
    check.overflow = check.overflow || r.nonfinite;
    check.squares += r.squares;
  }
  if (rules_.shards_updates()) MW_RETURN_IF_ERROR(ExchangeGradientCheck(check));
  // Every rank holds the same sum here (stage 0: of the same all-reduced
  // gradients; stages 1-3: of the same partials in the same order).
  if (need_norm && !std::isfinite(check.squares)) check.overflow = true;
  return check;
}

absl::Status ShardedOptimizer::ExchangeGradientCheck(GradientCheck& check) {
  // Stages 1-3 each see a shard: exchange (overflow, squares) once. The
  // double travels bit for bit as two f32 slots of an all-gather, and every
  // rank adds the partials in rank order, so all ranks agree exactly. On
  // meta nothing moves (the values read as zero), but the buffer and the
  // collective are a real run's, so the dry run books and counts them too.
  Communicator& shards = this->shards();
  const int world = shards.world_size();
  std::vector<float> mine(4, 0.0f), all(4 * world);
  mine[0] = check.overflow ? 1.0f : 0.0f;
  std::memcpy(&mine[2], &check.squares, sizeof check.squares);
  MW_ASSIGN_OR_RETURN(DeviceBuffer exchange,
                      device_.Allocate(all.size() * 4, MemoryCategory::kCommBuffer,
                                       "optimizer.step_scalars"));
  void* own = ElementOffset(exchange.data(), 4 * shards.rank(), DType::kF32);
  MW_RETURN_IF_ERROR(device_.CopyAsync(own, mine.data(), 16, *comm_stream_));
  MW_RETURN_IF_ERROR(shards.AllGather(own, exchange.data(), 4, DType::kF32, *comm_stream_));
  MW_RETURN_IF_ERROR(device_.CopyAsync(all.data(), exchange.data(), all.size() * 4, *comm_stream_));
  MW_RETURN_IF_ERROR(comm_stream_->Synchronize());
  check = GradientCheck();
  for (int r = 0; r < world; ++r) {
    check.overflow = check.overflow || all[4 * r] != 0.0f;
    double partial;
    std::memcpy(&partial, &all[4 * r + 2], sizeof partial);
    check.squares += partial;
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::ZeroAllGradients() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    MW_RETURN_IF_ERROR(ZeroGradients(layout_.groups[g], groups_[g]));
  }
  return comm_stream_->Synchronize();
}

absl::Status ShardedOptimizer::UpdateGroups(float grad_scale) {
  ScopedPhase update(profiler_, "update");
  const size_t size = DTypeSize(config_.param_dtype());
  // Every buffer the update needs is allocated before any group changes,
  // so that no allocation can fail once the first group has updated (a
  // failed step changes nothing).
  const bool two_phase = nvme_ != nullptr;
  MW_ASSIGN_OR_RETURN(UpdateWorkspace workspace, AllocateUpdateWorkspace(two_phase));
  bool redone = false;
  StateTier::UpdateArgs args;
  const std::vector<StateTier::Segment> rules = hyper_.StepRules(steps_applied_, grad_scale);
  // Gradients on NVMe (with the parameters there) are read into this.
  args.grad_buffer = NvmeStore::AlignUp(workspace.grad_buffer.data());
  std::vector<StateTier::Segment> segments;
  // The NVMe tier at the step: every group's chunks in one stream, so that
  // reads run ahead into the next group and writes finish behind.
  std::unique_ptr<NvmeChunkStream> chunks;
  if (!workspace.nvme_buffers.empty()) {
    chunks =
        std::make_unique<NvmeChunkStream>(*nvme_, NvmeStore::AlignUp(workspace.nvme_buffers.data()),
                                          chunk_buffers_.count, chunk_buffers_.stride);
    for (const Group& group : groups_) {
      if (group.host != nullptr) group.host->QueueChunks(*chunks);
    }
    args.nvme_stream = chunks.get();
  }
  // Tiers that update without touching their current state (NVMe) commit
  // after every group has updated; the others at once (Note [State tiers]).
  std::vector<std::pair<StateTier*, void*>> uncommitted;
  std::vector<int> written_shards;  // groups whose parameters on NVMe are in spare copies
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& flat = layout_.groups[g];
    Group& group = groups_[g];
    if (group.host != nullptr && !group.host->staged()) {
      // Stages 0-1: the host part's gradients go to the host now.
      MW_RETURN_IF_ERROR(group.host->StageGradients(*comm_stream_, UpdateGradients(flat, group)));
    }
    if (group.host != nullptr && overlaps_update()) {
      // Overlapped: its buffers were allocated as it was handed over (Step()
      // hands over any part not handed over in backward).
      args.scratch = overlapped_->params(static_cast<int>(g));
    } else if (residence_->place(static_cast<int>(g)) == ParamResidence::Place::kNvme) {
      args.scratch = NvmeStore::AlignUp(workspace.param_scratch.data());
    } else if (group.host != nullptr) {
      args.scratch = two_phase ? workspace.host_scratch[g].data()
                               : workspace.host_scratch.front().data();
    }
    for (const Tier& t : TiersOf(flat, group)) {
      args.grads = device_.holds_bytes()
                       ? static_cast<const char*>(UpdateGradients(flat, group)) + t.begin * size
                       : nullptr;
      args.params = ParamsAt(static_cast<int>(g), t.begin);
      hyper_.SegmentsOf(static_cast<int>(g), update_begin(flat) + t.begin, t.tier->numel(), rules,
                        segments);
      args.segments = segments;
      if (t.tier == group.host.get() && overlaps_update() &&
          overlapped_->handed(static_cast<int>(g))) {
        // Updated during backward as if nothing clipped: computed again
        // only if the step's settings turn out otherwise.
        if (!HyperparameterGroups::SameSegments(segments,
                                                overlapped_->segments(static_cast<int>(g)))) {
          ScopedActivity activity(profiler_, kCpuUpdateTrack,
                                  absl::StrCat("update ", flat.name, " (again)"));
          const std::unique_ptr<NvmeChunkStream> again = overlapped_->ChunksAlone(*group.host);
          args.nvme_stream = again.get();
          MW_RETURN_IF_ERROR(t.tier->Update(*comm_stream_, args));
          if (again != nullptr) MW_RETURN_IF_ERROR(again->Finish());
          args.nvme_stream = nullptr;
          redone = true;
        }
        uncommitted.push_back({t.tier, args.params});
        continue;
      }
      {
        // The host part's CPU update (the device part is on the streams).
        ScopedActivity activity(t.tier == group.host.get() ? profiler_ : nullptr, kCpuUpdateTrack,
                                absl::StrCat("update ", flat.name));
        MW_RETURN_IF_ERROR(t.tier->Update(*comm_stream_, args));
      }
      if (residence_->place(static_cast<int>(g)) == ParamResidence::Place::kNvme) {
        // The refreshed shard goes to its spare copy now (the scratch is
        // the next group's), synced with the others after the last group;
        // the tier's commit then copies nothing.
        MW_RETURN_IF_ERROR(residence_->WriteUpdated(static_cast<int>(g), args.scratch));
        written_shards.push_back(static_cast<int>(g));
        uncommitted.push_back({t.tier, nullptr});
      } else if (t.tier->two_phase()) {
        uncommitted.push_back({t.tier, args.params});
      } else {
        MW_RETURN_IF_ERROR(t.tier->Commit(*comm_stream_, args.params));
      }
    }
  }
  if (chunks != nullptr) MW_RETURN_IF_ERROR(chunks->Finish());
  MW_RETURN_IF_ERROR(residence_->FinishUpdates(written_shards));
  for (const auto& [tier, params] : uncommitted) {
    MW_RETURN_IF_ERROR(tier->Commit(*comm_stream_, params));
  }
  MW_RETURN_IF_ERROR(residence_->CommitUpdates(written_shards));
  if (overlapped_ != nullptr) {
    for (size_t g = 0; g < groups_.size(); ++g) overlapped_->Drop(static_cast<int>(g));
  }
  if (redone) ++redone_updates_;
  return absl::OkStatus();
}

absl::StatusOr<ShardedOptimizer::UpdateWorkspace> ShardedOptimizer::AllocateUpdateWorkspace(
    bool two_phase) {
  UpdateWorkspace w;
  if (overlaps_update()) return w;  // each host part has its own (Speculate)
  if (two_phase) {
    // Per offloaded group, indexed by group, its refreshed parameters (held
    // until every group has updated).
    w.host_scratch.resize(groups_.size());
    int64_t on_nvme = 0, grads = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].host == nullptr) continue;
      grads = std::max(grads, groups_[g].host->grad_buffer_bytes());
      if (residence_->place(static_cast<int>(g)) == ParamResidence::Place::kNvme) {
        // Written to the file before the next group updates: shared.
        on_nvme = std::max(on_nvme, residence_->update_bytes(static_cast<int>(g)));
        continue;
      }
      MW_ASSIGN_OR_RETURN(
          w.host_scratch[g],
          device_.AllocatePinned(groups_[g].host->scratch_bytes(), MemoryCategory::kWorkspace,
                                 absl::StrCat(layout_.groups[g].name, ".host_scratch")));
    }
    if (grads > 0) {
      MW_ASSIGN_OR_RETURN(w.grad_buffer, device_.AllocatePinned(grads, MemoryCategory::kWorkspace,
                                                                "optimizer.grad_buffer"));
    }
    if (on_nvme > 0) {
      MW_ASSIGN_OR_RETURN(w.param_scratch, device_.AllocatePinned(on_nvme + NvmeStore::kAlignment,
                                                                  MemoryCategory::kWorkspace,
                                                                  "optimizer.param_scratch"));
    }
    if (chunk_buffers_.count > 0) {
      MW_ASSIGN_OR_RETURN(w.nvme_buffers,
                          device_.AllocatePinned(chunk_buffers_.bytes(), MemoryCategory::kWorkspace,
                                                 "optimizer.nvme_buffers"));
    }
    return w;
  }
  int64_t largest = 0;  // one scratch buffer, shared
  for (const Group& group : groups_) {
    if (group.host != nullptr) largest = std::max(largest, group.host->scratch_bytes());
  }
  if (largest > 0) {
    w.host_scratch.emplace_back();
    MW_ASSIGN_OR_RETURN(w.host_scratch.front(),
                        device_.AllocatePinned(largest, MemoryCategory::kWorkspace,
                                               "optimizer.host_scratch"));
  }
  return w;
}

absl::Status ShardedOptimizer::RefreshParameters() {
  // Stages 1-2 hold full parameters but update a shard: all-gather them.
  if (!rules_.gathers_after_update()) return absl::OkStatus();
  ScopedPhase gather(profiler_, "all-gather");
  const DType dtype = config_.param_dtype();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& flat = layout_.groups[g];
    if (!flat.trainable) continue;  // unchanged
    void* full = residence_->data(static_cast<int>(g));
    void* own = device_.holds_bytes()
                    ? ElementOffset(full, flat.shard_begin(shards().rank()), dtype)
                    : nullptr;
    MW_RETURN_IF_ERROR(shards().AllGather(own, full, flat.shard_numel, dtype, *comm_stream_));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedOptimizer::StepResult> ShardedOptimizer::Step() {
  MW_RETURN_IF_ERROR(CheckStepReady());
  // The update writes what the caller's queued work reads; and the host
  // reads streamed gradients below: every reduction must have run (its
  // errors surface here). Unused prefetches go.
  MW_RETURN_IF_ERROR(OrderAfterCaller());
  MW_RETURN_IF_ERROR(comm_stream_->Synchronize());
  MW_RETURN_IF_ERROR(SumUnfinishedReplicas());
  // The overlapped updates (Note [Overlapped update]) have all run; a host
  // part not reduced in backward (its gradients are the zeros on the
  // device) is handed over now.
  for (size_t g = 0; g < groups_.size() && overlaps_update(); ++g) {
    Group& group = groups_[g];
    if (group.host == nullptr || overlapped_->handed(static_cast<int>(g))) continue;
    // Streamed gradients are on the host already (reduced fewer times than
    // the step's micro-batches; CheckStepReady refused none at all).
    if (!streams_gradients(layout_.groups[g])) {
      MW_RETURN_IF_ERROR(
          group.host->StageGradients(*comm_stream_, UpdateGradients(layout_.groups[g], group)));
    }
    MW_RETURN_IF_ERROR(Speculate(static_cast<int>(g)));
  }
  if (overlapped_ != nullptr) MW_RETURN_IF_ERROR(overlapped_->Finish());
  gatherer_->EndStep();
  for (Group& group : groups_) group.reductions = 0;
  // Before the update rewrites the shards.
  residence_->DropReadAheads();
  // 1. Reduce what stages 0-1 hold in full. 2. Look for inf/nan and take
  // the global norm. 3. Skip, or update (clipping folds into the gradient
  // scale), refresh the parameters and zero the gradients.
  // Stream order: from here on only the communication stream writes device
  // memory (host work reads or writes pinned memory, after waiting for it),
  // so the phases free their temporaries without waiting: what reuses a
  // block is queued behind what used it. No phase allocates while its own
  // earlier work may still run (the allocator may hand a fully free segment
  // back, which on host frees the memory). Step 1 waits once when it has
  // temporaries, step 2 once to read its values back, the exchange of
  // stages 1-3 once, the last phase once.
  MW_RETURN_IF_ERROR(ReduceHeldGradients());
  const bool need_norm = config_.gradient_clipping > 0;
  MW_ASSIGN_OR_RETURN(const GradientCheck check, CheckGradients(need_norm));
  const double unscale =
      1.0 / (double(comm_.world_size()) * config_.gradient_accumulation_steps * scaler_.scale());
  StepResult result;
  result.grad_norm = need_norm ? std::sqrt(check.squares) * unscale : 0.0;
  if (check.overflow) {
    scaler_.Update(/*overflow=*/true);
    ++steps_skipped_;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].host != nullptr) groups_[g].host->DropGradients();
      if (overlapped_ != nullptr) overlapped_->Drop(static_cast<int>(g));
    }
    MW_RETURN_IF_ERROR(ZeroAllGradients());
    result.loss_scale = scaler_.scale();
    return result;
  }
  double coefficient = 1.0;
  if (need_norm && result.grad_norm > config_.gradient_clipping) {
    coefficient = config_.gradient_clipping / (result.grad_norm + 1e-6);
  }
  MW_RETURN_IF_ERROR(UpdateGroups(static_cast<float>(unscale * coefficient)));
  MW_RETURN_IF_ERROR(RefreshParameters());
  MW_RETURN_IF_ERROR(ZeroAllGradients());
  scaler_.Update(/*overflow=*/false);
  ++steps_applied_;
  result.applied = true;
  result.loss_scale = scaler_.scale();
  return result;
}

}  // namespace memwall
