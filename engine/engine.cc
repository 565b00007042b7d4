#include "engine/engine.h"

#include <sched.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/auto_strategy.h"
#include "engine/checkpoint.h"
#include "kernels/cpu/parallel.h"
#include "profiler/report.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

#if MEMWALL_HAS_CUDA
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace memwall {

namespace {

uint32_t Crc(const void* data, size_t bytes, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}
uint32_t Crc(const std::string& text) { return Crc(text.data(), text.size()); }

// The phases open when a step failed: the unwinding closed them innermost
// first, so the last records, read backwards from the outermost, are the
// path ("step 0 > micro-batch 0 > forward > block5"); empty outside a step.
std::string PhaseAtFailure(const MemoryProfiler& profiler) {
  const std::vector<PhaseRecord> phases = profiler.phases();
  std::vector<std::string> path;
  int depth = 0;
  for (auto it = phases.rbegin(); it != phases.rend() && it->depth == depth; ++it, ++depth) {
    path.push_back(it->name);
  }
  return absl::StrJoin(path, " > ");
}

}  // namespace

int64_t PinnedBytes(int64_t flag, int64_t capacity, const Config& config) {
  if (flag > 0) return flag;
  if (config.zero.offload_optimizer_ratio > 0) return kOffloadPinnedBytes;
  return config.activation_checkpointing.offload ? capacity : 0;
}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       const Config& config, ModelFactory model) {
  if (!model) return absl::InvalidArgumentError("Engine: no model given");
  if (options.caller_stream.has_value()) {
    return absl::InvalidArgumentError(
        "caller_stream: a model of memwall layers computes on the engine's own streams; only a "
        "caller-owned model names the stream it computes on");
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  engine->config_ = config;
  engine->model_ = std::move(model);
  MW_RETURN_IF_ERROR(engine->StartRanks(options));
  MW_RETURN_IF_ERROR(engine->AgreeOnRun(options, Crc(options.model_description), false));
  MW_RETURN_IF_ERROR(engine->ResolveAuto(options));
  MW_RETURN_IF_ERROR(engine->StartDevice(options));
  MW_RETURN_IF_ERROR(engine->BudgetCpuUpdate(options));
  MW_RETURN_IF_ERROR(engine->BuildTrainer(options));
  return engine;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       const Config& config,
                                                       std::vector<ParameterGroup> groups) {
  if (config.zero.stage == kAutoStage) {
    return absl::InvalidArgumentError(
        "zero_optimization.stage: \"auto\" dry-runs whole training steps, which needs a model "
        "of memwall layers; a caller-owned model names its stage (0..3)");
  }
  if (config.activation_checkpointing.planner != "none" ||
      config.activation_checkpointing.number_checkpoints > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_checkpointing: a caller-owned model runs its own forward and backward, so "
        "memwall cannot recompute it; expected planner \"none\", got \"",
        config.activation_checkpointing.planner, "\""));
  }
  if (groups.empty()) return absl::InvalidArgumentError("Engine: no parameter groups given");
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  engine->config_ = config;
  MW_RETURN_IF_ERROR(engine->StartRanks(options));
  uint32_t model_crc = Crc(options.model_description);
  for (const ParameterGroup& group : groups) {
    model_crc = Crc(group.name.data(), group.name.size(), model_crc);
    for (const ShardedOptimizer::ParameterInit& p : group.parameters) {
      model_crc = Crc(p.name.data(), p.name.size(), model_crc);
      model_crc = Crc(p.shape.data(), p.shape.size() * sizeof(int64_t), model_crc);
      model_crc = Crc(p.values.data(), p.values.size() * sizeof(float), model_crc);
    }
  }
  MW_RETURN_IF_ERROR(engine->AgreeOnRun(options, model_crc, true));
  MW_RETURN_IF_ERROR(engine->StartDevice(options));
  MW_RETURN_IF_ERROR(engine->BudgetCpuUpdate(options));
  Engine& e = *engine;
  std::unique_ptr<Stream> caller_stream;
  if (options.caller_stream.has_value()) {
    MW_ASSIGN_OR_RETURN(caller_stream, e.device_->WrapStream(*options.caller_stream));
  }
  MW_ASSIGN_OR_RETURN(e.owned_optimizer_, ShardedOptimizer::Create(e.config_, *e.device_, *e.comm_,
                                                                   std::move(caller_stream)));
  e.optimizer_ = e.owned_optimizer_.get();
  e.owned_states_.emplace(*e.optimizer_);
  e.compute_stream_.emplace(*e.device_, e.optimizer_->stream());
  for (ParameterGroup& group : groups) {
    MW_RETURN_IF_ERROR(
        e.optimizer_->AddParameterGroup(std::move(group.name), std::move(group.parameters)));
  }
  MW_RETURN_IF_ERROR(e.Explain(e.optimizer_->Finalize()));
  e.optimizer_->set_profiler(e.profiler_.get());
  return engine;
}

absl::Status Engine::StartRanks(const EngineOptions& options) {
  if (options.device_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory: expected > 0 bytes, got ", options.device_bytes));
  }
  world_ = options.world;
  if (world_ == nullptr) {
    CommunicatorOptions world_options;
    world_options.timeout = options.collective_timeout;
    MW_ASSIGN_OR_RETURN(owned_world_, MpiCommunicator::Create(world_options));
    world_ = owned_world_.get();
  }
  comm_ = world_;
  const Backend backend = options.backend;
  if (backend == Backend::kMeta) {
    if (world_->world_size() != 1) {
      return absl::InvalidArgumentError(
          "--backend meta: run one process and set --simulate_ranks to the world it plays");
    }
    MW_ASSIGN_OR_RETURN(owned_comm_, SimulatedCommunicator::Create(0, options.simulate_ranks));
    comm_ = owned_comm_.get();
    // The world it plays is posed as MPI's would be.
    MW_ASSIGN_OR_RETURN(const int posed, RanksPerNodeFromEnvironment());
    if (posed > 0) MW_RETURN_IF_ERROR(comm_->SetRanksPerNode(posed));
  }
  if (config_.ranks_per_node > 0) {
    MW_RETURN_IF_ERROR(world_->SetRanksPerNode(static_cast<int>(config_.ranks_per_node)));
    MW_RETURN_IF_ERROR(comm_->SetRanksPerNode(static_cast<int>(config_.ranks_per_node)));
  }
  return CheckTrainBatchSize(config_, comm_->world_size());
}

absl::Status Engine::StartDevice(const EngineOptions& options) {
  const Backend backend = options.backend;
  DeviceOptions device{backend, world_->rank(), options.device_bytes};
  device.pinned_capacity_bytes = PinnedBytes(options.pinned_bytes, options.device_bytes, config_);
  if (backend == Backend::kCuda) {
#if MEMWALL_HAS_CUDA
    if (options.device_ordinal >= 0) {
      device.ordinal = options.device_ordinal;
    } else {
      MW_ASSIGN_OR_RETURN(device.ordinal, CudaOrdinalForRank(world_->rank()));
    }
    MW_ASSIGN_OR_RETURN(device_, CreateDevice(device));
    CommunicatorOptions nccl_options;
    nccl_options.timeout = world_->timeout();
    MW_ASSIGN_OR_RETURN(owned_comm_, NcclCommunicator::Create(*world_, *device_, nccl_options));
    comm_ = owned_comm_.get();
#else
    return absl::UnimplementedError(
        "--backend cuda: this build has no CUDA (it was built with --config=nocuda)");
#endif
  } else {
    MW_ASSIGN_OR_RETURN(device_, CreateDevice(device));
  }
  profiler_ = std::make_unique<MemoryProfiler>(device_->allocator());
  return absl::OkStatus();
}

int CpuUpdateThreadBudget(int cores, int ranks_on_node) {
  return std::max(1, cores / std::max(1, ranks_on_node));
}

int Engine::cpu_update_threads() const {
  return kernels::cpu::CpuThreadsOr(config_.zero.offload_cpu_threads);
}

absl::Status Engine::BudgetCpuUpdate(const EngineOptions& options) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = ::sched_getaffinity(0, sizeof(set), &set) == 0
                        ? CPU_COUNT(&set)
                        : static_cast<int>(std::thread::hardware_concurrency());
  // The update is bound by memory bandwidth: threads past the cores only
  // share them, and each costs a stack (thousands fail to start under a
  // memory limit, which the OpenMP runtime reports by aborting).
  if (options.backend != Backend::kMeta && config_.zero.offload_cpu_threads > cores) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.cpu_threads: expected at most this process's ",
        cores, " cores (0: the cores shared by the ranks on the machine), got ",
        config_.zero.offload_cpu_threads));
  }
  if (options.backend != Backend::kCuda || config_.zero.offload_optimizer_ratio <= 0 ||
      config_.zero.offload_cpu_threads > 0 || kernels::cpu::CpuThreadsFromEnvironment()) {
    return absl::OkStatus();
  }
  MW_ASSIGN_OR_RETURN(const int ranks, world_->RanksOnThisNode());
  config_.zero.offload_cpu_threads = CpuUpdateThreadBudget(cores, ranks);
  return absl::OkStatus();
}

absl::Status Engine::AgreeOnRun(const EngineOptions& options, uint32_t model_crc,
                                bool caller_owned) {
  if (world_->world_size() == 1) return absl::OkStatus();
  // A caller's model is its parameters: seeding its framework alike on
  // every rank is what makes them agree.
  const char* const kWhat[] = {
      "config", "seed",
      caller_owned ? "model (its parameters' names, shapes or initial values)" : "model", "data",
      "schedule"};
  const std::array<int64_t, 5> mine = {
      Crc(ConfigToJson(config_)), Crc(absl::StrCat(options.seed)), model_crc,
      Crc(options.data_description), Crc(options.schedule_description)};
  // This rank's value of each, where it can be shown.
  const std::string value[] = {
      "", absl::StrCat(options.seed),
      caller_owned ? "" : absl::StrCat("'", options.model_description, "'"),
      options.data_description.empty() ? "" : absl::StrCat("'", options.data_description, "'"),
      options.schedule_description.empty() ? ""
                                           : absl::StrCat("'", options.schedule_description, "'")};
  std::vector<int64_t> min, max;
  MW_RETURN_IF_ERROR(world_->MinMaxOverRanks({mine.begin(), mine.end()}, min, max));
  std::vector<std::string> differ, shown;
  for (int i = 0; i < 5; ++i) {
    if (min[i] == max[i]) continue;
    differ.push_back(kWhat[i]);
    if (!value[i].empty()) {
      shown.push_back(absl::StrCat(i == 2 ? "model" : kWhat[i], " ", value[i]));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the ranks disagree on the run's ", absl::StrJoin(differ, ", "),
      ": every rank must start with the same config, model, seed, data and schedule",
      shown.empty() ? ""
                    : absl::StrCat(" (rank ", world_->rank(), " of ", world_->world_size(),
                                   " has ", absl::StrJoin(shown, ", "), ")")));
}

DryRunOptions Engine::DryRunOptionsFor() const {
  DryRunOptions dry;
  dry.model = model_;
  dry.gpus = comm_->world_size();  // on cuda, NCCL's world is the MPI world
  // The capacity is memwall's allocator's own: the CUDA runtime lies outside it.
  dry.device_bytes = options_.device_bytes;
  dry.runtime_allowance = 0;
  dry.host_bytes = options_.pinned_bytes > 0 ? options_.pinned_bytes : kOffloadPinnedBytes;
  dry.batch = config_.train_micro_batch_size_per_gpu;
  return dry;
}

absl::Status Engine::ResolveAuto(const EngineOptions& options) {
  if (config_.zero.stage != kAutoStage) return absl::OkStatus();
  // Every rank computes the same answer from the same inputs.
  MW_ASSIGN_OR_RETURN(const Hardware hw,
                      HardwarePreset(options.hardware.empty() ? PresetForMemory(options.device_bytes)
                                                              : options.hardware));
  MW_ASSIGN_OR_RETURN(const AutoResult found, AutoStrategy(DryRunOptionsFor(), config_, hw));
  if (found.best < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "zero_optimization.stage \"auto\": no configuration fits ",
        FormatBytes(options.device_bytes), " per device",
        options.plan_command.empty() ? ""
                                     : absl::StrCat(" (", options.plan_command,
                                                    " shows each one's needs)")));
  }
  config_ = found.candidates[found.best].config;
  auto_choice_ = found.candidates[found.best].name;
  return absl::OkStatus();
}

absl::Status Engine::BuildTrainer(const EngineOptions& options) {
  MW_ASSIGN_OR_RETURN(Model model, model_(config_.train_micro_batch_size_per_gpu));
  input_ = model.input;
  target_ = model.target;
  absl::StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(std::move(model.layers), std::move(model.loss), config_, *device_, *comm_,
                      options.seed);
  MW_RETURN_IF_ERROR(Explain(created.status()));
  trainer_ = std::move(created).value();
  optimizer_ = &trainer_->optimizer();
  compute_stream_.emplace(*device_, optimizer_->stream());
  trainer_->set_profiler(profiler_.get());
  const int rank = comm_->rank(), world = comm_->world_size();
  MW_ASSIGN_OR_RETURN(
      plan_, ApplyRecomputation(*trainer_, config_.activation_checkpointing, input_,
                                device_->allocator().capacity(),
                                [&]() -> absl::StatusOr<AllocatorStats> {
                                  MW_ASSIGN_OR_RETURN(
                                      Model copy, model_(config_.train_micro_batch_size_per_gpu));
                                  return DryRunStep(std::move(copy), config_, rank, world);
                                }));
  return absl::OkStatus();
}

absl::StatusOr<Trainer::StepReport> Engine::TrainStep(absl::Span<const Batch> micro_batches) {
  if (trainer_ == nullptr) {
    return absl::FailedPreconditionError(
        "TrainStep: this engine trains a caller-owned model; call Step() after its backward");
  }
  absl::StatusOr<Trainer::StepReport> report = trainer_->TrainStep(micro_batches);
  if (!report.ok()) return Explain(report.status());
  return report;
}

absl::StatusOr<StepResult> Engine::Step() {
  if (trainer_ != nullptr) {
    return absl::FailedPreconditionError(
        "Step: this engine drives its layers' steps; call TrainStep(micro_batches)");
  }
  if (absl::Status agreed = AgreeOnHyperparameters(); !agreed.ok()) {
    MW_RETURN_IF_ERROR(optimizer_->AbortStep());
    return agreed;
  }
  absl::StatusOr<ShardedOptimizer::StepResult> result = optimizer_->Step();
  if (!result.ok()) return Explain(result.status());
  ++caller_steps_;
  return result;
}

namespace {

// The CRC-32 of hyperparameter groups [first, last).
int64_t HyperCrc(const ShardedOptimizer& opt, int first, int last) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int g = first; g < last; ++g) {
    const Hyperparameters& h = opt.hyperparameters(g);
    const float values[] = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.momentum};
    crc = crc32(crc, reinterpret_cast<const Bytef*>(values), sizeof values);
  }
  return static_cast<int64_t>(crc);
}

}  // namespace

absl::Status Engine::AgreeOnHyperparameters() {
  if (world_->world_size() == 1) return absl::OkStatus();
  // The world's host all-reduce must not run beside the optimizer's
  // collectives still in flight (MPI matches collectives in call order).
  MW_RETURN_IF_ERROR(optimizer_->WaitForCommunication());
  const int groups = optimizer_->num_hyper_groups();  // the same on every rank: the model agreed
  std::vector<int64_t> min, max;
  MW_RETURN_IF_ERROR(world_->MinMaxOverRanks({HyperCrc(*optimizer_, 0, groups)}, min, max));
  if (min[0] == max[0]) return absl::OkStatus();
  // Which group differs: halve the range that does (a round per halving).
  int first = 0, last = groups;
  while (last - first > 1) {
    const int mid = (first + last) / 2;
    MW_RETURN_IF_ERROR(
        world_->MinMaxOverRanks({HyperCrc(*optimizer_, first, mid)}, min, max));
    if (min[0] != max[0]) {
      last = mid;
    } else {
      first = mid;
    }
  }
  const Hyperparameters& h = optimizer_->hyperparameters(first);
  return absl::InvalidArgumentError(absl::StrFormat(
      "step: the ranks' param_groups[%d] differ (rank %d of %d has lr %g, betas (%g, %g), eps %g, "
      "weight_decay %g, momentum %g); every rank must set the same hyperparameters, or each "
      "would update its shard with its own; nothing was updated",
      first, world_->rank(), world_->world_size(), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
      h.momentum));
}

int64_t Engine::steps() const {
  return trainer_ != nullptr ? trainer_->steps() : caller_steps_;
}

absl::StatusOr<std::string> Engine::SaveCheckpoint(const std::string& dir, int keep) {
  if (keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint keep: expected >= 1, got ", keep));
  }
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.save_names.save, ": expected a directory, got ''"));
  }
  if (save_directory_ == nullptr || !IsCheckpointIn(save_directory_->path(), dir)) {
    const bool own = IsCheckpointIn(loaded_from_, dir) ||
                     std::any_of(saved_into_.begin(), saved_into_.end(),
                                 [&](const std::string& d) { return IsCheckpointIn(d, dir); });
    MW_RETURN_IF_ERROR(OpenSaveDirectory(dir, own));
    if (!own) saved_into_.push_back(dir);  // it held no checkpoints: ours from now on
  }
  return memwall::SaveCheckpoint(
      *optimizer_, steps(), dir, keep, options_.model_description,
      trainer_ != nullptr ? TilesOf(*trainer_) : std::map<std::string, ParameterTile>());
}

absl::StatusOr<LoadedCheckpoint> Engine::LoadCheckpoint(const std::string& path) {
  MW_ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                      memwall::LoadCheckpoint(*optimizer_, path, options_.model_description));
  loaded_from_ = path;
  if (trainer_ != nullptr) {
    trainer_->set_steps(loaded.steps);
  } else {
    caller_steps_ = loaded.steps;
  }
  return loaded;
}

absl::Status Engine::OpenSaveDirectory(const std::string& dir, bool resuming_from_it) {
  save_directory_.reset();  // a directory held before is let go first
  MW_ASSIGN_OR_RETURN(save_directory_, SaveDirectory::Open(*optimizer_, dir, resuming_from_it,
                                                           options_.save_names));
  return absl::OkStatus();
}

absl::Status Engine::Explain(absl::Status status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  std::string advice;
  if (model_ && options_.oom_advice) {
    advice = OutOfMemoryAdvice(DryRunOptionsFor(), config_);
    if (!advice.empty() && !options_.plan_command.empty()) {
      absl::StrAppend(&advice, "; the config and full plan: ", options_.plan_command);
    }
  }
  const std::string phase = PhaseAtFailure(*profiler_);
  status = absl::Status(
      status.code(),
      absl::StrCat(status.message(), ". It happened ",
                   phase.empty() ? "while allocating the model states"
                                 : absl::StrCat("during ", phase),
                   ".", advice));
  if (options_.oom_dir.empty()) return status;
  return ReportOutOfMemory(status, *profiler_,
                           absl::StrCat(options_.oom_dir, "/rank", comm_->rank()));
}

}  // namespace memwall
