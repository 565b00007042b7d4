// The training step: drives a sequential model's layers through forward,
// loss and backward around the ShardedOptimizer's hooks, then steps it.
//
// Per micro-batch: forward in layer order, gathering each layer's flat group
// just before it runs and releasing it when the next layer needs another
// (stage 3; no-ops otherwise), keeping every layer's output for backward;
// the loss; backward in reverse, gathering and acquiring each group's
// gradients when backward enters it and reducing and releasing them when it
// leaves (stages 2-3 reduce-scatter right there, overlapping the next
// group's backward with overlap_comm). Each layer's output is freed after
// the backward that reads it. Mixed precision: the loss gradient is
// multiplied by the optimizer's loss scale (fp16), and each layer's f32
// gradient workspaces are added into the bf16/f16 gradients right after its
// backward (engine/layer.h). After the configured number of micro-batches,
// the optimizer step. The same code runs on host (f32 compute) and meta
// (allocation and accounting only).
#ifndef MEMWALL_ENGINE_TRAINER_H_
#define MEMWALL_ENGINE_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpointing/plan.h"
#include "engine/layer.h"
#include "engine/model_states.h"
#include "profiler/memory_profiler.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "sharding/options.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

// One micro-batch on the device: the first layer's input and the loss's
// target, both f32.
struct Batch {
  Tensor input;
  Tensor target;
};

class Trainer {
 public:
  struct StepReport {
    // Mean loss over this rank's micro-batches (unscaled).
    float loss = 0.0f;
    ShardedOptimizer::StepResult step;
    // This step's collectives: their link bytes inside and across nodes
    // (the whole job's, runtime/communicator.h), and the step's share of
    // the communicator's Arrivals (who arrived last, what it cost).
    LinkBytes traffic;
    Arrivals arrivals;
  };

  // Registers the layers' parameters, initialised from `seed` and each
  // parameter's full name (so every rank starts identical), and finalises
  // the optimizer. `device` and `comm` must outlive the trainer. Errors:
  // kInvalidArgument for duplicate layer names; whatever registration and
  // allocation report. Host, cuda and meta devices all work (the layers
  // compute through kernels/nn.h).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      std::vector<std::unique_ptr<Layer>> layers, std::unique_ptr<LossFunction> loss,
      const ShardingOptions& options, Device& device, Communicator& comm, uint64_t seed);

  // One optimizer step over options.gradient_accumulation_steps
  // micro-batches (exactly that many must be given).
  absl::StatusOr<StepReport> TrainStep(absl::Span<const Batch> micro_batches);

  // Marks phases for `profiler` (not owned; null to stop): "step <k>" >
  // "micro-batch <u>" > "forward" > "<layer>", "loss", "backward" >
  // "<layer>"; and "optimizer step".
  // The optimizer marks its own phases (gathers, reductions) too.
  void set_profiler(MemoryProfiler* profiler) {
    profiler_ = profiler;
    optimizer_->set_profiler(profiler);
  }

  // The recomputation chain of this model for micro-batches whose first
  // input has shape `input` (activations in the run's dtype).
  absl::StatusOr<Chain> ChainFor(const std::vector<int64_t>& input) const;
  // Follow `plan` (made for `chain`, which must be ChainFor's) from the
  // next step on: see checkpointing/plan.h for what each segment mode does.
  // Gradients and losses are bit for bit those of the run without
  // recomputation (the same kernels on the same inputs in the same order).
  // At stage 3 a recomputed segment gathers its parameters layer by layer
  // as forward does (backward gathers them again), so recomputation never
  // raises the parameters' peak: a third gather per step for those layers,
  // as in DeepSpeed, in exchange for segments of any length.
  // kInvalidArgument when the plan does not fit the model.
  absl::Status SetRecomputationPlan(const RecomputationPlan& plan, const Chain& chain);
  const RecomputationPlan& recomputation_plan() const { return plan_; }

  // The engine's internals and their tests drive the optimizer itself;
  // other callers read and write the model states through states().
  ShardedOptimizer& optimizer() { return *optimizer_; }
  ModelStates& states() { return states_; }
  Device& device() { return device_; }
  // Training steps taken (TrainStep calls, skipped steps included): the
  // data position of a resumed run. Set by LoadCheckpoint.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

 private:
  Trainer(std::vector<std::unique_ptr<Layer>> layers, std::unique_ptr<LossFunction> loss,
          Device& device, std::unique_ptr<ShardedOptimizer> optimizer);
  // One micro-batch's forward, loss and backward, over its pass state.
  struct Pass {
    const Batch& batch;
    std::vector<Tensor> outputs;  // each layer's, while kept
    // Offload: outputs[l] waits in the pinned pool (checkpointed
    // activation, owner "<owner>.offloaded") and comes back under its own
    // owner.
    struct Offloaded {
      DeviceBuffer host;
      DType dtype;
      std::vector<int64_t> shape;
      std::string owner;
    };
    std::map<int, Offloaded> offloaded;
    std::set<int> gathered;  // groups gathered and not yet released
    // The chain's recompute_held, from forward's start to backward's end,
    // when the plan recomputes.
    Tensor recompute_held;
    const Tensor& input_of(int l) const;
  };
  absl::StatusOr<float> MicroBatch(const Batch& batch);
  absl::Status Forward(Pass& pass);
  absl::StatusOr<Tensor> Loss(Pass& pass, float& loss);
  absl::Status Backward(Pass& pass, Tensor grad);
  absl::Status Recompute(Pass& pass, const Segment& segment, int l);
  absl::Status Offload(Pass& pass, int l);
  absl::Status Fetch(Pass& pass, int l);
  // Releases the groups in `held` (pass.gathered or a subset) that `next`
  // does not read.
  absl::Status ReleaseUnread(Pass& pass, std::set<int>& held, const std::vector<int>& next);

  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<LossFunction> loss_;
  Device& device_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  ModelStates states_;  // of optimizer_
  // The optimizer's caller stream: layers compute on it (engine/layer.h).
  Stream* stream_;
  std::vector<std::unique_ptr<LayerContext>> contexts_;
  std::unique_ptr<LayerContext> loss_context_;
  // The flat groups each layer reads (its own parameters' and shared ones).
  std::vector<std::vector<int>> groups_of_layer_;
  // For each group, the first layer (lowest index) that reads it: backward
  // reduces the group after that layer.
  std::vector<int> first_user_;
  MemoryProfiler* profiler_ = nullptr;
  int64_t steps_ = 0;
  RecomputationPlan plan_;                    // the recomputation plan
  std::vector<int> segment_of_;  // each layer's segment in plan_
  int64_t recompute_held_ = 0;   // the chain's, when plan_ recomputes
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_TRAINER_H_
