// Engine: the one way into memwall for every caller (the `memwall` command,
// C++ programs, the Python package).
//
// An engine is built from the full Config (engine/config.h) and a model,
// and owns everything a data-parallel rank trains with:
//   - the ranks: an MPI world (started by the engine, or the caller's), and
//     the communicator the optimizer uses on it: MPI on host, NCCL between
//     GPUs on cuda, a simulated world of EngineOptions::simulate_ranks on
//     meta, where this single process plays rank 0;
//   - the device of this rank (its capacity and pinned pool) and a memory
//     profiler attached to its allocator;
//   - the resolved config: zero_optimization.stage "auto" becomes the
//     configuration the auto strategy (engine/auto_strategy.h) finds
//     fastest among those whose dry run fits, before anything is allocated;
//   - the model and its sharded optimizer (sharding/sharded_optimizer.h):
//       * a model of memwall layers (engine/layer.h), from a ModelFactory:
//         the engine drives forward, backward and the optimizer step
//         (TrainStep) and follows the activation_checkpointing plan;
//       * or a caller-owned model: the caller registers its parameters in
//         explicit groups (each one flat group that gathers, releases and
//         reduces together, as FSDP2's fully_shard names modules), keeps
//         its own forward and backward, reads parameters and adds
//         gradients through states()'s views (or their f32 forms
//         ReadParameter/AddGradient), and calls Step();
//     either way, callers read and write the model states (parameters,
//     gradients, optimizer states, hyperparameter groups, step counters)
//     through states() (engine/model_states.h), never the optimizer;
//   - the compute stream: states().stream() is the device's current
//     stream for the engine's lifetime, so what is allocated without a
//     stream is that stream's, and the allocator reuses blocks a
//     collective still reads only after that stream is ordered after it
//     (Note [Stream-ordered reuse], runtime/stream_order.h). A caller's own
//     device work belongs on that stream;
//   - training checkpoints of either kind of model (engine/checkpoint.h);
//   - out-of-memory errors explained: where in the step it happened, what
//     the auto strategy would run instead (layer models), and the memory
//     reports of that moment (EngineOptions::oom_dir).
//
// Every method that communicates is collective: all ranks call it in the
// same order with the same arguments. Not thread-safe.
#ifndef MEMWALL_ENGINE_ENGINE_H_
#define MEMWALL_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpointing/plan.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/dry_run.h"
#include "engine/model.h"
#include "engine/model_states.h"
#include "engine/trainer.h"
#include "profiler/memory_profiler.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

struct EngineOptions {
  Backend backend = Backend::kHost;
  // Capacity of memwall's allocator on this rank's device.
  int64_t device_bytes = int64_t{256} << 20;
  // The pinned host pool; 0: derived from the config (PinnedBytes).
  int64_t pinned_bytes = 0;
  // meta: the data-parallel world this single process plays rank 0 of.
  int simulate_ranks = 1;
  // The longest any rank waits in a collective for the others.
  absl::Duration collective_timeout = absl::Minutes(10);
  // An MPI world to run on (not owned; must outlive the engine). Null: the
  // engine creates one (initialising MPI if no one has).
  MpiCommunicator* world = nullptr;
  // Layer models: parameters are initialised from this seed and each
  // parameter's name, so every rank starts identical.
  uint64_t seed = 1;
  // The hardware profile (engine/auto_strategy.h) whose step-time model
  // ranks the candidates of stage "auto"; empty: the preset of
  // device_bytes (PresetForMemory), as `memwall plan --auto` picks it.
  std::string hardware;
  // Out of memory: the profiler's reports of that moment are written to
  // <oom_dir>/rank<r>/; empty: none are written.
  std::string oom_dir;
  // Out of memory in a layer model: search what would fit (the auto
  // strategy's dry runs, about a second for GPT-2 sizes and longer for
  // large CNNs) and say so in the error.
  bool oom_advice = true;
  // The model beyond its tensors' shapes (a GPT's heads): recorded in
  // checkpoints, which a run with another description refuses to load.
  std::string model_description;
  // What the run trains on ("corpus.txt, 1048576 bytes"), for the ranks'
  // agreement check; empty: not compared.
  std::string data_description;
  // How the caller's loop runs where ranks must agree on it, or they would
  // meet in different collectives (train: its --steps, --log_every,
  // --save_every, ...); compared like the data; empty: not compared.
  std::string schedule_description;
  // How the caller shows the full plan, quoted by out-of-memory advice
  // ("...; the config and full plan: <plan_command>"); empty: not quoted.
  std::string plan_command;
  // How errors about a checkpoint directory name the caller's argument for
  // it and the way to resume ("--save", "--resume" on the command line).
  SaveDirectory::Names save_names;
  // cuda: the GPU this rank uses; -1: by rank (CudaOrdinalForRank). A
  // caller whose tensors already sit on a GPU (PyTorch) names that one.
  int device_ordinal = -1;
  // cuda, a caller-owned model: the native stream the caller computes on
  // (PyTorch's current stream; nullptr is CUDA's legacy default stream),
  // which the engine's views are read and written in the order of
  // (ModelStates::stream() is it, Device::WrapStream); unset: the engine
  // makes its own. kInvalidArgument on host and meta.
  std::optional<void*> caller_stream;
};

// The pinned pool for `flag` bytes: the flag when > 0; else, when `config`
// offloads optimizer states, 64 GiB (a limit: the pool takes host memory as
// it is used); else as much as the device when activation offload is
// allowed; else none.
int64_t PinnedBytes(int64_t flag, int64_t capacity, const Config& config);

// A parameter of a caller-owned model with its initial values
// (ShardedOptimizer::ParameterInit: name, shape, values, trainable,
// hyperparameter group).
using ParameterInit = ShardedOptimizer::ParameterInit;
// One explicit unit of a caller-owned model.
struct ParameterGroup {
  std::string name;
  std::vector<ParameterInit> parameters;
};
// What a step did: applied or skipped, the gradient norm, the next loss
// scale (ShardedOptimizer::StepResult).
using StepResult = ShardedOptimizer::StepResult;

// The CPU update's threads per rank when `ranks_on_node` ranks share
// `cores` cores: an even share, at least 1.
int CpuUpdateThreadBudget(int cores, int ranks_on_node);

class Engine {
 public:
  // A model of memwall layers: `model(micro_batch)` builds it (and, for
  // stage "auto" and the optimal recomputation budget, fresh copies to
  // dry-run). Errors: kInvalidArgument naming the option or config key;
  // kResourceExhausted when nothing fits (stage "auto") or the model
  // states do not fit the device (with the memory reports under oom_dir);
  // kUnavailable / kUnimplemented for a backend this machine or build
  // lacks.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        const Config& config, ModelFactory model);
  // A caller-owned model, registered group by group in this order (every
  // rank passes the same groups and values). Stage "auto" and a
  // recomputation planner need the engine's own layers: kInvalidArgument.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        const Config& config,
                                                        std::vector<ParameterGroup> groups);
  ~Engine();

  // The config in force: "auto" resolved, never kAutoStage.
  const Config& config() const { return config_; }
  // The auto strategy's choice ("stage 2, recomputation none, ..."), or
  // empty when the config named its stage.
  const std::string& auto_choice() const { return auto_choice_; }
  // Threads per rank of the offloaded optimizer's CPU update (see
  // BudgetCpuUpdate): the config's cpu_threads once budgeted, else
  // MEMWALL_CPU_THREADS or 1.
  int cpu_update_threads() const;

  MpiCommunicator& world() { return *world_; }
  Communicator& communicator() { return *comm_; }
  Device& device() { return *device_; }
  MemoryProfiler& profiler() { return *profiler_; }
  // The model states of either kind of model (engine/model_states.h).
  ModelStates& states() { return trainer_ != nullptr ? trainer_->states() : *owned_states_; }
  // Layer models only (null otherwise).
  Trainer* trainer() { return trainer_.get(); }
  // Layer models: one micro-batch's input and target shapes.
  const std::vector<int64_t>& input_shape() const { return input_; }
  const std::vector<int64_t>& target_shape() const { return target_; }
  // Layer models: the recomputation plan followed (planner "none" without).
  const RecomputationPlan& recomputation_plan() const { return plan_; }

  // Layer models: one optimizer step over gradient_accumulation_steps
  // micro-batches (Trainer::TrainStep). Errors pass through Explain().
  absl::StatusOr<Trainer::StepReport> TrainStep(absl::Span<const Batch> micro_batches);
  // Caller-owned models: the optimizer step after the caller's forward and
  // backward (ShardedOptimizer::Step). Errors pass through Explain(). Ranks
  // whose hyperparameter groups differ get kInvalidArgument naming the
  // group, with nothing updated and the step's gradients dropped
  // (AbortStep): each would otherwise update its shard with its own values.
  // Collective.
  absl::StatusOr<StepResult> Step();
  // Training steps taken (skipped ones included): the data position.
  int64_t steps() const;

  // Training checkpoints (engine/checkpoint.h), of either kind of model;
  // loading also restores steps() (and passes over damaged checkpoints to
  // the newest intact one, saying so). Saving into a directory this engine
  // does not hold yet opens it first (OpenSaveDirectory: locked, and
  // refused if it holds another run's checkpoints, unless this engine
  // loaded from it or saved there before), so no caller can prune or
  // overwrite another run's checkpoints. `keep` < 1 is refused before
  // anything is written (kInvalidArgument).
  absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int keep);
  absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path);
  // Checks `dir` before the first step and holds it for this engine's
  // lifetime (engine/checkpoint.h SaveDirectory): writable on every rank,
  // no other run saving there, and no other run's checkpoints in it unless
  // `resuming_from_it`.
  absl::Status OpenSaveDirectory(const std::string& dir, bool resuming_from_it);

  // `status` unchanged unless it is out of memory; then with where in the
  // step it happened (the profiler's open phases), what the auto strategy
  // would run instead (layer models), and the reports of this moment
  // written under oom_dir.
  absl::Status Explain(absl::Status status);

 private:
  Engine() = default;
  // The MPI world and the communicator; then (config_ resolved) the
  // device and its profiler.
  absl::Status StartRanks(const EngineOptions& options);
  // Every rank must run the same config, seed, model, data and schedule: compared
  // once at the start through CRC-32s (`model_crc` stands for the model;
  // for caller-owned ones, `caller_owned`, it covers their parameters'
  // names, shapes and values), and the error names what differs. One
  // agreement round over MPI.
  absl::Status AgreeOnRun(const EngineOptions& options, uint32_t model_crc, bool caller_owned);
  // Caller-owned models, before each step: every rank's hyperparameter
  // groups must hold the same values (a caller sets them on each rank);
  // kInvalidArgument naming the first group that differs and this rank's
  // values. One MPI agreement round, and a few more to find the group.
  absl::Status AgreeOnHyperparameters();
  absl::Status StartDevice(const EngineOptions& options);
  absl::Status ResolveAuto(const EngineOptions& options);
  // On cuda with the optimizer offloaded and neither cpu_threads nor
  // MEMWALL_CPU_THREADS given, sets cpu_threads to this process's cores
  // shared evenly by the ranks on this machine (CpuUpdateThreadBudget):
  // the GPU computes, so the cores are the update's (DeepSpeed's CPU Adam
  // likewise takes them all). On host the CPU is the device too and the
  // update keeps its one thread beside backward. Collective on the world.
  absl::Status BudgetCpuUpdate(const EngineOptions& options);
  absl::Status BuildTrainer(const EngineOptions& options);
  // The dry-run options of this run's model, world and device.
  DryRunOptions DryRunOptionsFor() const;

  EngineOptions options_;
  Config config_;
  std::string auto_choice_;
  ModelFactory model_;
  std::vector<int64_t> input_, target_;
  RecomputationPlan plan_;
  int64_t caller_steps_ = 0;  // caller-owned models

  // Declared in the order they are built: destroyed model first, ranks last.
  std::unique_ptr<MpiCommunicator> owned_world_;
  MpiCommunicator* world_ = nullptr;
  std::unique_ptr<Communicator> owned_comm_;  // simulated or NCCL
  Communicator* comm_ = nullptr;
  std::unique_ptr<Device> device_;
  std::unique_ptr<MemoryProfiler> profiler_;
  std::unique_ptr<ShardedOptimizer> owned_optimizer_;  // caller-owned models
  std::unique_ptr<Trainer> trainer_;
  ShardedOptimizer* optimizer_ = nullptr;
  std::optional<ModelStates> owned_states_;  // caller-owned models: of owned_optimizer_
  std::optional<Device::StreamGuard> compute_stream_;  // optimizer_'s stream, current
  std::unique_ptr<SaveDirectory> save_directory_;
  // The checkpoint path last loaded, and the directories saved into: the
  // directories whose checkpoints are this run's own.
  std::string loaded_from_;
  std::vector<std::string> saved_into_;
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_ENGINE_H_
