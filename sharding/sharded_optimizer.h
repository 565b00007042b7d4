// ShardedOptimizer: wraps an existing model's optimizer step with ZeRO
// stages 0-3 across data-parallel ranks.
//
// The model keeps its own forward and backward code (plain loops, BLAS,
// anything); it registers its parameters (name, shape, initial values), then
// reads parameters and writes gradients through views this class hands out:
//
//   stage 0  every rank holds full parameters, gradients and optimizer
//            states; gradients are all-reduced in Step().       16P bytes
//   stage 1  optimizer states and f32 master weights are sharded; gradients
//            are reduce-scattered in Step() and the updated shards
//            all-gathered into the full parameters.         4P + 12P/N bytes
//   stage 2  as stage 1, and gradients live only as shards: a group's
//            full-size gradient buffer exists between AcquireGradients()
//            and ReduceGradients(), which reduce-scatters it into the shard
//            (call it right after the group's backward).    2P + 14P/N bytes
//   stage 3  as stage 2, and parameters are sharded too: GatherParameters()
//            all-gathers a group just before its layer runs (forward, and
//            again in backward) and ReleaseParameters() frees it.  16P/N bytes
// (bytes for mixed-precision Adam: 2-byte parameters and gradients, 12 bytes
// of f32 master weights and moments; P counts padded elements, see
// flat_layout.h). In f32 there are no master weights: parameters are the
// master weights, so stage 0 is 4+4+8 = 16P and the shards shrink alike.
//
// Gradient contract: backward ADDS the gradient of (micro-batch mean loss x
// loss_scale()) into the gradient views, over gradient_accumulation_steps
// micro-batches; Step() then averages over ranks and micro-batches, unscales,
// checks for inf/nan (in every precision mode a step with any non-finite
// gradient on any rank is skipped on every rank; fp16 also lowers the
// scale), clips to
// gradient_clipping by the global norm (exchanged once across ranks),
// updates the master weights, refreshes the parameters, and zeroes the
// gradients.
//
// Overlap (zero_optimization.overlap_comm): collectives then run on a
// communication stream of their own (on host, a thread; on cuda, a CUDA
// stream) so that ReduceGradients() returns at once and the reduction of
// group g overlaps the backward of group g-1. Its buffers (the full-size
// bucket, the reduction's pieces) are freed as soon as it is queued; the
// allocator hands their blocks to the caller's stream only once that
// stream is ordered after the reduction, which the next ReduceGradients()
// does (an event, not a host wait), or Step(): one reduction in flight at a
// time (Note [Stream-ordered reuse], runtime/stream_order.h), and what is
// allocated at any moment does not depend on timing, so a dry run
// on meta holds exactly what a real run holds. At stage 3, GatherParameters() also prefetches
// the groups expected next (sharding/gather_scheduler.h: in the order the
// previous step gathered them, or in the direction of travel before a step
// has been recorded) while their elements stay within
// stage3_prefetch_bucket_size and all gathered groups within
// stage3_max_live_parameters; a prefetched group costs its memory while in
// flight, and Step() drops unused ones. Results are identical with and
// without overlap: the same arithmetic runs in the same order. A collective
// that fails asynchronously fails the next Step() (before any update), and,
// as CUDA errors are, stays sticky: the optimizer is unusable after it.
//
// Hybrid sharding (zero_optimization.mics_shard_size = S, stages 1-3;
// DeepSpeed's MiCS, FSDP2's HSDP): the states are sharded over each block
// of S consecutive ranks (shards(), a node typically) as they would be over
// S ranks, and replicated across the N/S blocks. A reduction reduce-scatters
// inside the block, then all-reduces each piece of the shard with the ranks
// holding the same shard in the other blocks, every micro-batch; the step
// divides by all N ranks as before, so the result is unsharded data
// parallelism's up to the order of the sums. Gathers (stages 1-3) and the
// step's gradient check stay inside the block: replicas hold the same
// reduced gradients and update alike. Model states cost 16P/S bytes (stage
// 3); what crosses nodes is the all-reduce of 1/S of the gradients per
// rank. Checkpoints hold whole parameters, so they load at any S.
//
// Optimizer offload (zero_optimization.offload_optimizer_ratio > 0, stages
// 1-3, ZeRO-Offload): the first ratio x shard elements of each group this
// rank updates keep their f32 master weights and Adam moments (or SGD
// momentum) in the device's pinned host pool (category optimizer_state)
// instead of device memory. Their reduced gradients stream to pinned host
// memory on the communication stream as soon as they are final (stages 2-3:
// right after the last micro-batch's ReduceGradients of the group, so with
// overlap_comm the copy of group g runs during the backward of group g-1;
// stage 1: in Step()); Step() updates them with the CPU kernels (the same
// element math as the device kernels: results are bit for bit those without
// offload) and copies the refreshed parameters back; the rest of the shard
// updates on the device as before. In f32 runs the host keeps an f32 master
// copy and the device parameters are refreshed from it. At stages 2-3
// with the whole shard offloaded (ratio 1) no gradient shard stays on the
// device either: each reduction lands in a transient device shard, goes to
// pinned memory and, over micro-batches, accumulates there on the CPU (the
// same rounding as the device's accumulating reduction); the step's
// overflow check and norm then read the host copy. With
// offload_nvme_path the offloaded states live in a file there instead
// (offload/nvme_store.h); a step then updates every group's file copy
// before it makes any current, so a failed write fails Step() with the
// weights, states and parameters all as they were. The groups' chunks
// stream through one set of pinned buffers in one pipeline
// (offload/nvme_chunk_stream.h: reads run ahead into the next group,
// writes finish behind), and the file is synced once, before the commits. At stages 2-3 the
// reduced gradients stay too and Step() may simply be called again; stage 1
// reduces inside Step(), so its caller reruns the micro-batches.
//
// Note [Overlapped update]
// With offload_overlap_step (stages 2-3) a group's CPU update
// does not wait for Step(): right after its last ReduceGradients() queues
// the copy of its final gradients to the host, the group's update is handed
// to a thread of its own (offload/update_worker.h), which waits for that
// copy and updates while backward goes on. The update is speculative: it
// assumes no clipping and no overflow and writes the new state into the
// slice's spare copy (sharding/host_optimizer.h: in pinned memory, or the
// NVMe tier's second copy on disk, the state streaming through its chunk
// buffers while backward runs), leaving the current state alone. Step()
// then waits for the thread, checks the gradients as always, and: on an
// overflow drops every speculative update (the step is skipped, nothing
// changed); when clipping applies (its factor is known only now), or a
// group's hyperparameters differ from those it was updated with, updates
// that group again from the untouched current state with the step's real
// ones; otherwise only commits. The element math and its inputs are those
// of the non-overlapped step, so the results are bit for bit the same in
// every case; only steps that clip pay the update twice. Every buffer is
// allocated on the caller's thread (the refreshed parameters of a group as
// it is handed over, held until Step() commits; one set of NVMe chunk
// buffers, shared, each group streaming through them alone), so what a run
// holds does not depend on the thread's timing and a dry run books exactly
// the same.
//
// Parameter paging (zero_optimization.offload_param, stage 3 with
// offload_optimizer_ratio 1): the rank's parameter shards live in the
// pinned pool as well; GatherParameters() pages a group's shard in (copied
// straight into its place in the gathered buffer) and all-gathers it in
// place, on the communication stream, so prefetched groups page
// in ahead of use under the same prefetch and live-parameter bounds. The
// update writes the refreshed shard straight into the pinned pool. At rest
// the device holds no parameter bytes, only the gradient shards.
//
// Parameters on NVMe (offload_param_nvme_path, with the optimizer states on
// NVMe): the shards past the first offload_param_max_in_cpu elements live
// in a file of their own (offload/nvme_store.h, two copies per shard).
// GatherParameters() reads such a shard into the next of
// offload_param_buffer_count pinned page buffers (reused once the copy out
// of it has run, an event) and pages it in from there. Prefetching starts
// the reads of the upcoming groups' shards (within
// stage3_prefetch_bucket_size, through the store's asynchronous I/O, into
// all but one of the page buffers) while the caller computes, and their
// gathers, at use, wait for them; the disk is what takes time, and the
// page keeps no device memory. Reads ahead whose gather does not come are
// dropped when the step ends, before the update writes the shards. The update leaves the refreshed
// shard in one shared pinned scratch, which is written to the shard's spare
// copy at once; the step commits the parameters' copies with the optimizer
// tier's, after every group has updated and been written, so a failed write
// changes neither file. The gradients go to the optimizer tier's file as
// each reduction completes (sharding/host_optimizer.h, gradients_on_nvme).
// Host memory then holds buffers, not shards.
//
// The parts behind this class, one concern each: the flat layout of
// groups and shards (flat_layout.h), the gradients' collectives in pieces
// and their pacing (gradient_reducer.h), the hyperparameter groups and the
// update rule each element steps with (hyper_groups.h), where each
// group's parameters live, device memory, the pinned pool or an NVMe file
// with its page buffers, and every write to them (param_residence.h over
// param_pages.h), stage 3's gathers
// and prefetches (parameter_gatherer.h, in gather_scheduler.h's order), the
// CPU updates run during backward (overlapped_update.h), the dynamic loss
// scale (loss_scaler.h), the tiers that hold and update optimizer state
// (state_tier.h: device_optimizer.h, host_optimizer.h), and the stream
// order that lets buffers be freed while collectives still read them
// (runtime/stream_order.h). This class sequences them: registration,
// allocation, views and the queued reductions in sharded_optimizer.cc, the
// step in sharded_optimizer_step.cc, optimizer-state I/O in
// sharded_optimizer_state.cc.
//
// Every method that communicates is collective: all ranks call it in the
// same order. Not thread-safe.
#ifndef MEMWALL_SHARDING_SHARDED_OPTIMIZER_H_
#define MEMWALL_SHARDING_SHARDED_OPTIMIZER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/host_optimizer.h"
#include "offload/nvme_store.h"
#include "profiler/memory_profiler.h"
#include "runtime/allocator.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "sharding/device_optimizer.h"
#include "sharding/flat_layout.h"
#include "sharding/gradient_reducer.h"
#include "sharding/hyper_groups.h"
#include "sharding/loss_scaler.h"
#include "sharding/options.h"
#include "sharding/overlapped_update.h"
#include "sharding/param_residence.h"
#include "sharding/stage_rules.h"
#include "sharding/parameter_gatherer.h"

namespace memwall {

class ShardedOptimizer {
 public:
  // Elements per shard are a multiple of this (256 bytes of bf16), so every
  // shard starts aligned for vector loads and collectives.
  static constexpr int64_t kShardAlignmentElements = 128;

  // A parameter's or gradient's memory on the device: numel elements of
  // dtype at data (null on meta).
  struct View {
    void* data = nullptr;
    DType dtype = DType::kF32;
    int64_t numel = 0;
  };

  struct StepResult {
    // False when the step was skipped (a non-finite gradient on some rank).
    bool applied = false;
    // The global gradient norm after unscaling (before clipping); 0 when
    // neither clipping nor fp16 needed it.
    double grad_norm = 0.0;
    // The loss scale for the next step.
    float loss_scale = 1.0f;
  };

  // `device` and `comm` must outlive the optimizer. Errors: kInvalidArgument
  // for a config the sharded optimizer cannot run: a stage outside 0-3 (an
  // unresolved "auto" included), or a communicator of the wrong kind for
  // the device. `caller_stream`: the stream the caller computes on, a stream
  // of `device` (Device::WrapStream of PyTorch's current stream), which
  // becomes stream(); null: the optimizer creates one.
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(
      const ShardingOptions& config, Device& device, Communicator& comm,
      std::unique_ptr<Stream> caller_stream = nullptr);

  // Waits for the communication stream: its work uses this object's buffers.
  ~ShardedOptimizer();

  // Registers a parameter with its initial values (every rank must pass the
  // same values, as in data parallelism; on a device without bytes, meta,
  // the values may be left empty). Before Finalize() only; errors
  // name the parameter (duplicate name, bad shape, wrong number of values).
  absl::Status AddParameter(std::string name, std::vector<int64_t> shape,
                            absl::Span<const float> initial_values);
  // A parameter with its initial values, for AddParameterGroup.
  struct ParameterInit {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;  // NumElements(shape) of them; may be empty on meta
    // False: frozen, kept and sharded but with no gradient and no
    // optimizer state (flat_layout.h); a group may not mix the two.
    bool trainable = true;
    // The hyperparameter group it updates with (>= 0; see
    // SetHyperparameters).
    int hyper_group = 0;
  };
  // Registers `parameters`, in order, as one explicit unit named `group`:
  // one flat group that gathers, releases and reduces together, whatever
  // reduce_bucket_size says (flat_layout.h). Before Finalize() only. Errors
  // (kInvalidArgument) name the group or the parameter; on error none of
  // the group's parameters stays registered.
  absl::Status AddParameterGroup(std::string group, std::vector<ParameterInit> parameters);
  // Hyperparameter groups, torch's param_groups: each parameter updates with
  // those of its ParameterInit::hyper_group (0 for AddParameter). After
  // Finalize() groups 0..max registered exist, each starting with the
  // config's values (OptimizerConfig).
  int num_hyper_groups() const { return hyper_.size(); }
  const Hyperparameters& hyperparameters(int index) const { return hyper_.values(index); }
  // The learning rate group `index` trains with at the next step: its lr
  // through the config's schedule (sharding/lr_schedule.h; the lr itself
  // without one), at steps_applied().
  float LearningRate(int index) const;
  // Sets group `index`'s values for the following steps (a schedule calls
  // it between steps). Not collective, but every rank must set the same
  // values. kInvalidArgument, changing nothing, for an index out of range,
  // a value the update rule refuses (Adam: lr and weight_decay finite and
  // >= 0, betas in [0, 1), eps > 0), or an SGD momentum without the
  // momentum buffer the config's momentum > 0 keeps; kFailedPrecondition
  // before Finalize().
  absl::Status SetHyperparameters(int index, const Hyperparameters& values);

  // Plans the flat groups and allocates this rank's model states. On error
  // nothing stays allocated and registration may be retried after fixing it.
  absl::Status Finalize();

  const FlatLayout& layout() const { return layout_; }
  const ShardingOptions& config() const { return config_; }
  // Every data-parallel rank (the communicator Create was given).
  Communicator& communicator() { return comm_; }
  // The ranks the states are sharded over: the world, or with hybrid
  // sharding (zero_optimization.mics_shard_size) this rank's shard group,
  // whose size the layout's shards divide by. Its collectives count in the
  // world's stats.
  Communicator& shards() const { return shard_group_ != nullptr ? *shard_group_ : comm_; }
  Device& device() { return device_; }
  // The caller's stream: compute on it, and the optimizer orders itself
  // with events (Stream::Wait), not host waits. Collectives wait for the
  // work queued on it so far; it waits for gathers (GatherParameters) and
  // for reductions before their buffers are reused. A caller computing on
  // another stream synchronises that stream before each call. On host and
  // meta its work runs as it is enqueued.
  Stream& stream() { return *stream_; }
  // Every registered parameter, in registration order (layout().placements'
  // order).
  const std::vector<ParameterSpec>& parameters() const { return specs_; }
  // Where parameter `name` lies in the flat layout (its group, offset and
  // numel), or kNotFound; kFailedPrecondition before Finalize().
  absl::StatusOr<const ParameterPlacement*> Placement(absl::string_view name) const;
  // Index of the group holding `name` (Placement's group).
  absl::StatusOr<int> GroupOf(absl::string_view name) const;

  // The parameter as the model reads it (param_dtype). Stage 3: only while
  // its group is gathered (kFailedPrecondition otherwise).
  absl::StatusOr<View> Parameter(absl::string_view name);
  // Where backward adds the parameter's gradient (param_dtype). Stages 2/3:
  // only between AcquireGradients and ReduceGradients of its group. A frozen
  // parameter has none: kFailedPrecondition.
  absl::StatusOr<View> Gradient(absl::string_view name);

  // The same two in f32 for a caller that computes in f32 whatever the
  // storage dtype, available when the views are. ReadParameter copies the
  // parameter, converted from param_dtype, into `out` (its numel elements;
  // nothing is written on meta). AddGradient adds `grad` into the gradient,
  // added in f32 and rounded once to param_dtype, as memwall's own layers
  // add their f32 workspaces. Both wait for their copies; kInvalidArgument
  // for a size that is not the parameter's.
  absl::Status ReadParameter(absl::string_view name, absl::Span<float> out);
  absl::Status AddGradient(absl::string_view name, absl::Span<const float> grad);

  // Stage 3: all-gathers group `g`'s parameters; no-op for stages 0-2.
  absl::Status GatherParameters(int g);
  // Stage 3: frees the gathered copy of group `g`; no-op for stages 0-2.
  absl::Status ReleaseParameters(int g);
  // Stages 2/3: allocates group `g`'s full-size gradient buffer, zeroed.
  // No-op for stages 0-1 (gradients are always there). A frozen group has
  // no gradients: kFailedPrecondition at every stage (so does
  // ReduceGradients).
  absl::Status AcquireGradients(int g);
  // Stages 2/3: reduce-scatters group `g`'s gradients into this rank's
  // shard (accumulating over micro-batches) and frees the full buffer.
  // No-op for stages 0-1 (reduced in Step()).
  absl::Status ReduceGradients(int g);
  // Whether group `g`'s full-size gradient buffer exists (stages 2/3,
  // between AcquireGradients and ReduceGradients); false for a bad index.
  bool HoldsGradients(int g) const;

  // One optimizer step; see the class comment. kFailedPrecondition if a
  // group's gradients are still acquired or parameters still gathered.
  absl::StatusOr<StepResult> Step();
  // Waits until every collective queued so far (reductions, gathers,
  // prefetches: all run on the communication stream) has run, so that a
  // caller may run a collective of its own on the MPI world without
  // interleaving with them. Returns their errors.
  absl::Status WaitForCommunication();

  // Marks phases for `profiler` (not owned; null to stop): "gather <group>"
  // (stage 3), "reduce <group>" (stages 2-3), and in Step() "reduce",
  // "update" and "all-gather"; records the CPU updates of the offloaded
  // parts ("update <group>", at the step or on the update thread) on the
  // "cpu update" track, and the NVMe tier's transfers on the "nvme read"
  // and "nvme write" tracks. Not while a step's update thread runs.
  void set_profiler(MemoryProfiler* profiler);

  // Multiply the loss by this before backward (1 unless fp16).
  float loss_scale() const { return scaler_.scale(); }
  int64_t steps_applied() const { return steps_applied_; }
  int64_t steps_skipped() const { return steps_skipped_; }

  // The NVMe tier's file (null without offload_nvme_path): its path and
  // size for reports, and fault injection for tests.
  NvmeStore* nvme_store() { return nvme_.get(); }
  // Parameters on NVMe: their file (null without offload_param_nvme_path).
  NvmeStore* param_store() { return residence_ != nullptr ? residence_->store() : nullptr; }
  // Whether the offloaded part of the update runs during backward (Note
  // [Overlapped update]: offload_optimizer.overlap_step at stages 2-3 with
  // an offloaded part).
  bool overlaps_update() const {
    return config_.zero.offload_overlap_step && rules_.shards_gradients() &&
           config_.zero.offload_optimizer_ratio > 0;
  }
  // Overlapped update: seconds the update thread has spent updating (its
  // own throughput, for benchmarks); 0 without it.
  double overlapped_update_seconds() const {
    return overlapped_ != nullptr ? overlapped_->busy_seconds() : 0.0;
  }
  // Steps whose speculative updates had to be computed again (clipping, or
  // hyperparameters changed after backward), of those applied.
  int64_t redone_updates() const { return redone_updates_; }

  // Offload: how many of the elements this rank updates in group `g` (the
  // first ones) update on the host.
  int64_t host_numel(const FlatGroup& g) const;
  // Stages 2-3 with the whole shard on host: the reduced gradients go
  // straight to host memory (each micro-batch's, in the reduction dtype)
  // and no gradient shard stays on the device.
  bool streams_gradients(const FlatGroup& g) const {
    return rules_.shards_gradients() && host_numel(g) > 0 && host_numel(g) == update_numel(g);
  }

  // Collective: copies the f32 master weights of `name` (the parameters in
  // f32 mode) into `out`, gathering shards. For tests.
  absl::Status MasterWeights(absl::string_view name, absl::Span<float> out);

  // Forgets a step that failed part-way (an allocation or a collective
  // error in a micro-batch or in Step before its update): waits for the
  // communication stream, drops gathered groups, prefetches, gradient
  // buckets and reductions in flight, and zeroes the accumulated gradients.
  // Parameters and optimizer states are untouched: Step() allocates all it
  // needs before the first group updates, so a failure never leaves part
  // of the model updated. The next micro-batch starts a fresh step.
  absl::Status AbortStep();

  // Checkpoints. The f32 arrays the optimizer keeps per element: 0 master
  // weights (the parameters in f32 runs), then Adam's m and v, or SGD's
  // momentum buffer (none without momentum).
  int num_states() const;
  // Their names, as checkpoints and state dicts name them (state_tier.h
  // StateNames): "master", then "exp_avg" and "exp_avg_sq", or
  // "momentum".
  std::vector<std::string> state_names() const;
  // Collective: state `which` of group g, all padded_numel elements (padding
  // included), into `out` on every rank, wherever its parts live (device,
  // pinned pool, NVMe). kInvalidArgument for a bad group, state or size;
  // kFailedPrecondition on meta. A frozen group's master weights are its
  // parameters and its moments zeros; SetState of them sets the parameters
  // and ignores the moments.
  absl::Status GatherState(int g, int which, absl::Span<float> out);
  // Not collective: sets this rank's part of group g's state `which` from
  // the whole group `full` (every rank passes the same values). Setting the
  // master weights also sets the parameters this rank holds, rounded to the
  // parameter dtype as Step() rounds them, so after every group's master
  // weights are set the model is the one whose master weights those are.
  absl::Status SetState(int g, int which, absl::Span<const float> full);
  // The step counters and the dynamic loss scaler, to save and restore.
  struct Progress {
    int64_t steps_applied = 0;
    int64_t steps_skipped = 0;
    float loss_scale = 1.0f;
    int clean_steps = 0;
    int overflows_left = 0;
  };
  Progress progress() const;
  void set_progress(const Progress& progress);

 private:
  // A flat group's gradients and optimizer states; its parameters are
  // residence_'s.
  struct Group {
    // param_dtype; full (stages 0-1), or the shard (2-3).
    DeviceBuffer grads;
    // Stages 2-3: the full-size gradient buffer while acquired.
    DeviceBuffer grad_bucket;
    // The optimizer state of this rank's update range, in tiers (Note
    // [State tiers], sharding/state_tier.h): the first host_numel elements
    // on the host (offload: pinned or NVMe), the rest on the device.
    std::unique_ptr<HostOptimizerSlice> host;
    std::unique_ptr<DeviceOptimizerSlice> device_state;
    // Reductions into the shard this step (stages 2-3): at the last
    // micro-batch's, the host part's gradients start streaming to host
    // and hybrid sharding sums the shard with its replicas.
    int reductions = 0;
  };

  ShardedOptimizer(const ShardingOptions& config, Device& device, Communicator& comm,
                   std::unique_ptr<Stream> stream, std::unique_ptr<Stream> comm_stream,
                   std::unique_ptr<Event> caller_event);
  // The communication stream's next work waits for the caller stream's
  // work so far (an event, not a host wait): what it writes may reuse a
  // block that work still reads, and what it reads that work wrote.
  absl::Status OrderAfterCaller();

  bool mixed() const { return config_.param_dtype() != DType::kF32; }
  // A tier of a group's state and the first element of the update range
  // it holds.
  struct Tier {
    StateTier* tier;
    int64_t begin;
  };
  absl::InlinedVector<Tier, 2> TiersOf(const FlatGroup& flat, Group& group);
  // Where element i of group g's update range sits in the parameters
  // this rank holds (null on meta, and for a shard on NVMe).
  void* ParamsAt(int g, int64_t i);
  absl::Status CheckState(absl::string_view call, int g, int which, size_t size) const;
  // The view of the parameter at `place` inside its group's buffer at
  // `base`.
  View ViewOf(const ParameterPlacement& place, void* base) const;
  // Elements this rank updates in group g, and where they start.
  int64_t update_numel(const FlatGroup& g) const;
  int64_t update_begin(const FlatGroup& g) const;
  // Takes `initial_values` over (no copy: a caller's model may be most of
  // the host's memory).
  absl::Status Register(std::string name, std::vector<int64_t> shape,
                        std::vector<float> initial_values, std::string group,
                        bool trainable, int hyper_group);
  // GatherState of a frozen group: its parameters in f32 (gathered at
  // stage 3) for the master weights, zeros for the moments it never had.
  absl::Status GatherFrozen(int g, absl::Span<float> out);
  // The f32 staging behind ReadParameter and AddGradient: a device
  // workspace of `view`'s elements.
  absl::StatusOr<DeviceBuffer> F32Workspace(absl::string_view name, const View& view,
                                            size_t given);
  absl::Status RequireFinalized(absl::string_view call) const;
  absl::Status CheckGroup(int g, absl::string_view call) const;
  // kFailedPrecondition naming `call` for a frozen group.
  absl::Status CheckTrainable(int g, absl::string_view call) const;
  // Group g's parameters (residence_), gradients and optimizer states,
  // allocated, then set to the registered initial values; `group` is g's
  // (Finalize fills them before they become groups_).
  absl::Status AllocateGroup(int g, Group& group);
  absl::Status InitializeGroup(int g, Group& group);
  // ReduceGradients' collectives for group g, queued on the communication
  // stream (stages 2-3).
  absl::Status QueueReduction(int g);
  // This rank's gradient elements of group g (param_dtype).
  void* UpdateGradients(const FlatGroup& flat, Group& group);
  absl::Status ZeroGradients(const FlatGroup& flat, Group& group);

  // Step()'s phases, in order.
  absl::Status CheckStepReady();
  // Hybrid sharding (stages 2-3): sums the shards of groups reduced fewer
  // times than gradient_accumulation_steps with their replicas.
  absl::Status SumUnfinishedReplicas();
  // Stages 0-1: the all-reduce or reduce-scatter of the full gradients.
  absl::Status ReduceHeldGradients();
  // Whether any gradient this rank updates is inf or nan (on any rank, at
  // stages 1-3), and the global sum of squares when `need_norm`.
  struct GradientCheck {
    bool overflow = false;
    double squares = 0.0;
  };
  absl::StatusOr<GradientCheck> CheckGradients(bool need_norm);
  absl::Status ExchangeGradientCheck(GradientCheck& check);
  // The update of every group (device and host parts), `grad_scale`
  // unscaling, averaging and clipping the gradients.
  absl::Status UpdateGroups(float grad_scale);
  struct UpdateWorkspace {
    // Offload: one shared pinned scratch (pinned tier), or one per group,
    // indexed by group, for its refreshed parameters (NVMe tier,
    // two-phase).
    std::vector<DeviceBuffer> host_scratch;
    // Parameters on NVMe: one scratch for the refreshed shard, aligned
    // for the file (written before the next group updates), and one buffer
    // the gradients (on NVMe too) are read into.
    DeviceBuffer param_scratch;
    DeviceBuffer grad_buffer;
    // NVMe tier at the step: the chunk buffers (chunk_buffers_) every
    // group's state streams through, in one stream.
    DeviceBuffer nvme_buffers;
  };
  absl::StatusOr<UpdateWorkspace> AllocateUpdateWorkspace(bool two_phase);
  // Overlapped update (Note [Overlapped update]): handing group g's host
  // update to its thread with the rule the step would use if nothing clips.
  absl::Status Speculate(int g);
  // Stages 1-2: all-gathers the updated shards into the full parameters.
  absl::Status RefreshParameters();
  absl::Status ZeroAllGradients();

  const ShardingOptions config_;
  // What the stage shards (Create checked the stage).
  const StageRules rules_{config_.zero.stage};
  Device& device_;
  Communicator& comm_;
  // The caller's stream (stream()): initialisation, fresh gradient
  // buffers, and the caller's compute.
  std::unique_ptr<Stream> stream_;
  // Collectives and the optimizer's own kernels; asynchronous when
  // overlap_comm is set.
  std::unique_ptr<Stream> comm_stream_;
  // OrderAfterCaller's event.
  std::unique_ptr<Event> caller_event_;
  std::unique_ptr<GradientReducer> reducer_;
  MemoryProfiler* profiler_ = nullptr;

  std::vector<ParameterSpec> specs_;
  std::vector<std::vector<float>> initial_;
  std::vector<int> hyper_of_;  // per registered parameter
  HyperparameterGroups hyper_{config_.optimizer, config_.schedule};
  absl::flat_hash_map<std::string, int> index_;
  bool finalized_ = false;
  FlatLayout layout_;
  std::vector<Group> groups_;
  // The NVMe tier's file, when offload_nvme_path is set.
  std::unique_ptr<NvmeStore> nvme_;
  // Where each group's parameters live (set with the groups).
  std::unique_ptr<ParamResidence> residence_;
  // zero_hpz_partition_size's blocks of ranks (stage 3; null without).
  std::unique_ptr<Communicator> secondary_comm_;
  // Hybrid sharding (mics_shard_size): this rank's shard group and the
  // ranks holding its shard in the other groups (null without).
  std::unique_ptr<Communicator> shard_group_, replica_group_;
  // Stage 3's gathers (set with the groups).
  std::unique_ptr<ParameterGatherer> gatherer_;
  // Overlapped update: its thread and what it keeps (null without it).
  std::unique_ptr<OverlappedUpdate> overlapped_;
  // The NVMe tier's chunk buffers, sized for the largest host part (set
  // with the groups; none without the NVMe tier).
  NvmeChunkStream::Buffers chunk_buffers_;

  LossScaler scaler_;
  int64_t steps_applied_ = 0;
  int64_t steps_skipped_ = 0;
  int64_t redone_updates_ = 0;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_SHARDED_OPTIMIZER_H_
