#include "engine/dry_run.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpointing/planner.h"
#include "engine/chain.h"
#include "offload/nvme_store.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

absl::StatusOr<std::vector<Batch>> EmptyBatches(Device& device, int count,
                                                const std::vector<int64_t>& input,
                                                const std::vector<int64_t>& target) {
  std::vector<Batch> batches;
  for (int u = 0; u < count; ++u) {
    Batch b;
    MW_ASSIGN_OR_RETURN(b.input, Tensor::Empty(device, DType::kF32, input, MemoryCategory::kOther,
                                               "data.input"));
    MW_ASSIGN_OR_RETURN(b.target, Tensor::Empty(device, DType::kF32, target,
                                                MemoryCategory::kOther, "data.target"));
    batches.push_back(std::move(b));
  }
  return batches;
}

int64_t NodeSize(const DryRunOptions& options, const Config& config) {
  return options.ranks_per_node > 0   ? options.ranks_per_node
         : config.ranks_per_node > 0 ? config.ranks_per_node
                                     : options.gpus;
}

absl::StatusOr<AllocatorStats> DryRunStep(Model model, const Config& config, int rank,
                                          int world_size, int64_t capacity,
                                          const RecomputationPlan* plan) {
  DeviceOptions options{Backend::kMeta, 0, capacity};
  options.pinned_capacity_bytes = int64_t{1} << 60;  // for offloading configs
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> meta, CreateDevice(options));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedCommunicator> comm,
                      SimulatedCommunicator::Create(rank, world_size));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(std::move(model.layers), std::move(model.loss), config,
                                      *meta, *comm, /*seed=*/1));
  MW_ASSIGN_OR_RETURN(Chain chain, trainer->ChainFor(model.input));
  MW_RETURN_IF_ERROR(
      trainer->SetRecomputationPlan(plan != nullptr ? *plan : FullRecomputation(chain), chain));
  MW_ASSIGN_OR_RETURN(std::vector<Batch> batches, EmptyBatches(*meta, config.gradient_accumulation_steps,
                                                               model.input, model.target));
  MW_RETURN_IF_ERROR(trainer->TrainStep(batches).status());
  return meta->allocator().stats();
}

absl::StatusOr<RecomputationPlan> ApplyRecomputation(
    Trainer& trainer, const RecomputeConfig& config, const std::vector<int64_t>& input,
    int64_t capacity, const std::function<absl::StatusOr<AllocatorStats>()>& dry_run) {
  MW_ASSIGN_OR_RETURN(Chain chain, trainer.ChainFor(input));
  chain.offload_flops_per_byte = config.offload_flops_per_byte;
  std::string planner = config.planner;
  if (config.number_checkpoints > 0) {
    const int64_t n = static_cast<int64_t>(chain.layers.size());
    planner = absl::StrCat("uniform:", (n + config.number_checkpoints - 1) / config.number_checkpoints);
  }
  PlannerOptions options;
  options.budget = config.budget_bytes;
  options.resolution = config.resolution;
  options.allow_selective = config.selective;
  options.allow_offload = config.offload;
  if (planner == "optimal" && options.budget == 0) {
    MW_ASSIGN_OR_RETURN(const AllocatorStats stats, dry_run());
    int64_t rest = 0;
    for (MemoryCategory c : kAllMemoryCategories) {
      if (c == MemoryCategory::kActivation || c == MemoryCategory::kCheckpointedActivation) continue;
      rest += stats.by_category[static_cast<int>(c)].peak;
    }
    options.budget = capacity - capacity / 20 - rest;
    if (options.budget <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "activation_checkpointing: no room for activations: the device holds ",
          FormatBytes(capacity), " and the rest of a step needs ", FormatBytes(rest),
          " plus a 5% margin"));
    }
  }
  MW_ASSIGN_OR_RETURN(RecomputationPlan plan, MakePlan(chain, planner, options));
  MW_RETURN_IF_ERROR(trainer.SetRecomputationPlan(plan, chain));
  return plan;
}

namespace {

// Bytes of the activations and workspaces the allocator has handed out.
int64_t TransientBytes(const AllocatorStats& s) {
  int64_t bytes = 0;
  for (MemoryCategory c : {MemoryCategory::kActivation, MemoryCategory::kCheckpointedActivation,
                           MemoryCategory::kWorkspace}) {
    bytes += s.by_category[static_cast<int>(c)].allocated;
  }
  return bytes;
}

// The config's recomputation plan on `trainer`, with optimal's budget
// derived from the device memory the dry run is for; when no plan fits
// that budget, the least activation memory instead, with `note` saying why.
absl::StatusOr<RecomputationPlan> PlanRecomputation(const DryRunOptions& options,
                                                    const Config& config, int64_t batch,
                                                    Trainer& trainer,
                                                    const std::vector<int64_t>& input,
                                                    std::string& note) {
  const int world = static_cast<int>(options.gpus);
  absl::StatusOr<RecomputationPlan> applied = ApplyRecomputation(
      trainer, config.activation_checkpointing, input,
      options.device_bytes - options.runtime_allowance,
      [&]() -> absl::StatusOr<AllocatorStats> {
        MW_ASSIGN_OR_RETURN(Model copy, options.model(batch));
        return DryRunStep(std::move(copy), config, 0, world);
      });
  if (!applied.ok() && applied.status().code() == absl::StatusCode::kResourceExhausted) {
    note = std::string(applied.status().message());
    MW_ASSIGN_OR_RETURN(const Chain chain, trainer.ChainFor(input));
    PlannerOptions least;
    least.allow_selective = config.activation_checkpointing.selective;
    applied = MinimumPeakPlan(chain, least);
    applied->planner = "least-peak";
    MW_RETURN_IF_ERROR(trainer.SetRecomputationPlan(*applied, chain));
  }
  return applied;
}

// Sets r.device_reserved_peak, device_needed, fits and fits_text from the
// measured step. Unbounded, the allocator keeps freed segments cached; on a
// full device it releases them and retries. So when the unbounded peak
// overflows, the step runs again at the real capacity: if it completes,
// the plan fits with what it reserved there.
absl::Status JudgeFit(const DryRunOptions& options, const Config& config, int64_t batch,
                      DryRunResult& r) {
  const int64_t usable = options.device_bytes - options.runtime_allowance;
  r.device_needed = r.device_reserved_peak + options.runtime_allowance;
  if (r.device_needed > options.device_bytes && usable > 0) {
    MW_ASSIGN_OR_RETURN(Model copy, options.model(batch));
    const absl::StatusOr<AllocatorStats> capped =
        DryRunStep(std::move(copy), config, 0, static_cast<int>(options.gpus), usable,
                   &r.recompute);
    if (capped.ok()) {
      r.device_reserved_peak = capped->reserved.peak;
      r.device_needed = r.device_reserved_peak + options.runtime_allowance;
    } else if (capped.status().code() != absl::StatusCode::kResourceExhausted) {
      return capped.status();
    }
  }
  std::vector<std::string> overflow;
  if (r.device_needed > options.device_bytes) {
    overflow.push_back(
        absl::StrCat("device memory by ", FormatBytes(r.device_needed - options.device_bytes)));
  }
  if (r.host_peak > options.host_bytes) {
    overflow.push_back(absl::StrCat("host memory by ", FormatBytes(r.host_peak - options.host_bytes)));
  }
  if (r.nvme_used > options.nvme_bytes) {
    overflow.push_back(absl::StrCat("NVMe by ", FormatBytes(r.nvme_used - options.nvme_bytes)));
  }
  r.fits = overflow.empty();
  r.fits_text = r.fits ? "yes" : absl::StrCat("no (", absl::StrJoin(overflow, ", "), ")");
  return absl::OkStatus();
}

// Host traffic per step, from the layout: offloaded gradients down (each
// micro-batch's reduction, in the reduction dtype, where the whole shard
// streams to the host; with hybrid sharding the earlier micro-batches' sum
// back up for the replicas' all-reduce) and parameters up, paged shards in
// for each gather (forward and backward), offloaded activations out and
// back.
void AddHostTraffic(const Config& config, const ShardedOptimizer& opt, DryRunResult& r) {
  const int64_t size = static_cast<int64_t>(DTypeSize(config.param_dtype()));
  const int64_t reduce_size = static_cast<int64_t>(DTypeSize(config.reduce_dtype));
  const int64_t accumulation = config.gradient_accumulation_steps;
  const bool hybrid = config.zero.mics_shard_size > 0;
  for (const FlatGroup& g : opt.layout().groups) {
    const int64_t k = opt.host_numel(g);
    if (g.trainable && r.offloaded_elements == 0) r.tail_offloaded_elements = k;
    r.offloaded_elements += k;
    r.pcie_bytes += k * size;  // the refreshed parameters
    if (!g.trainable || !opt.streams_gradients(g)) {
      r.pcie_bytes += k * size;
    } else {
      r.pcie_bytes += accumulation * k * reduce_size;
      if (hybrid && accumulation > 1) r.pcie_bytes += k * size;
    }
    if (config.zero.offload_param) r.pcie_bytes += 2 * accumulation * g.shard_numel * size;
  }
  r.pcie_bytes += 2 * r.recompute.offloaded_bytes * accumulation;
}

absl::StatusOr<DryRunResult> DryRunOnce(const DryRunOptions& options, const Config& config) {
  if (options.gpus < 1 || options.gpus > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus: expected 1..1048576, got ", options.gpus));
  }
  if (options.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--batch: expected >= 0, got ", options.batch));
  }
  DryRunResult r;
  r.batch = options.batch > 0 ? options.batch : config.train_micro_batch_size_per_gpu;
  std::optional<ScopedProgressStage> stage;
  stage.emplace(options.progress, "building the model");
  MW_ASSIGN_OR_RETURN(Model model, options.model(r.batch));
  // Meta devices with room for anything: the dry run measures, then compares.
  const int64_t unbounded = int64_t{1} << 60;
  DeviceOptions device_options{Backend::kMeta, 0, unbounded};
  device_options.pinned_capacity_bytes = unbounded;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(device_options));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedCommunicator> comm,
                      SimulatedCommunicator::Create(0, static_cast<int>(options.gpus)));
  MW_RETURN_IF_ERROR(comm->SetRanksPerNode(
      static_cast<int>(std::min(NodeSize(options, config), options.gpus))));
  MemoryProfiler profiler(device->allocator());
  for (const auto& layer : model.layers) {
    for (const ParameterDecl& d : layer->Parameters()) r.parameters += NumElements(d.shape);
  }
  const size_t layers = model.layers.size();
  stage.emplace(options.progress, "laying out the model states");
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(std::move(model.layers), std::move(model.loss), config,
                                      *device, *comm, /*seed=*/1));
  trainer->set_profiler(&profiler);
  stage.emplace(options.progress, "planning recomputation");
  MW_ASSIGN_OR_RETURN(r.recompute, PlanRecomputation(options, config, r.batch, *trainer,
                                                     model.input, r.recompute_note));
  // `step` reads `profiler`: declared after it, it lets go of it first.
  std::optional<ScopedProgressStage> step;
  stage.reset();
  step.emplace(options.progress, absl::StrCat("dry-run step of ", layers, " layers"), &profiler);
  MW_ASSIGN_OR_RETURN(std::vector<Batch> batches,
                      EmptyBatches(*device, config.gradient_accumulation_steps, model.input,
                                   model.target));
  // What the step itself launches and writes, for the step-time model:
  // kernels, and the bytes of every activation and workspace it allocates.
  const int64_t launches_before = device->launches();
  const int64_t transient_before = TransientBytes(device->allocator().stats());
  // The NVMe files (optimizer states, parameters): what the step moves,
  // counted by the stores as a real run's move it.
  const std::array<const NvmeStore*, 2> stores = {trainer->optimizer().nvme_store(),
                                                  trainer->optimizer().param_store()};
  const auto moved = [&] {
    int64_t bytes = 0;
    for (const NvmeStore* s : stores) {
      if (s != nullptr) bytes += s->bytes_read() + s->bytes_written();
    }
    return bytes;
  };
  const int64_t moved_before = moved();
  MW_RETURN_IF_ERROR(trainer->TrainStep(batches).status());
  r.nvme_bytes_per_step = moved() - moved_before;
  const AllocatorStats dev = device->allocator().stats();
  r.kernel_launches = device->launches() - launches_before;
  r.transient_bytes = TransientBytes(dev) - transient_before;
  r.device_requested_peak = dev.requested.peak;
  for (int c = 0; c < kNumMemoryCategories; ++c) r.category_peaks[c] = dev.by_category[c].peak;
  r.device_reserved_peak = dev.reserved.peak;
  r.peak = profiler.peak();
  r.host_peak = device->pinned_allocator()->stats().reserved.peak;
  for (const NvmeStore* s : stores) r.nvme_used += s != nullptr ? s->size() : 0;
  for (int c = 0; c < kNumCollectives; ++c) {
    r.collectives[c] = comm->stats(static_cast<Collective>(c));
    r.comm_bytes += r.collectives[c].bytes;
  }
  r.link_bytes = comm->total_link_bytes();
  r.world = options.gpus;
  r.nodes = comm->nodes();
  MW_ASSIGN_OR_RETURN(const Chain chain, trainer->ChainFor(model.input));
  for (const ChainLayer& l : chain.layers) r.forward_flops += l.forward_flops;
  r.forward_flops *= config.gradient_accumulation_steps;
  r.extra_flops = r.recompute.extra_flops * config.gradient_accumulation_steps;
  AddHostTraffic(config, trainer->optimizer(), r);
  MW_RETURN_IF_ERROR(JudgeFit(options, config, r.batch, r));
  return r;
}

}  // namespace

absl::StatusOr<DryRunResult> DryRun(const DryRunOptions& options, const Config& config) {
  if (!options.model) return absl::InvalidArgumentError("dry run: no model given");
  MW_ASSIGN_OR_RETURN(DryRunResult r, DryRunOnce(options, config));
  // optimal's derived budget leaves 5% for the allocator's rounding and
  // fragmentation; when the measured step still overflows the device,
  // tighten the activation budget by the overflow and measure again.
  if (config.activation_checkpointing.planner != "optimal" ||
      config.activation_checkpointing.budget_bytes != 0) {
    return r;
  }
  Config tighter = config;
  for (int attempt = 0; attempt < 4 && !r.fits; ++attempt) {
    const int64_t over = r.device_needed - options.device_bytes;
    const int64_t budget = r.recompute.predicted_peak - over;
    if (over <= 0 || budget <= 0) break;  // not the device, or nothing left to cut
    tighter.activation_checkpointing.budget_bytes = budget;
    absl::StatusOr<DryRunResult> next = DryRunOnce(options, tighter);
    if (!next.ok()) break;
    r = std::move(next).value();
  }
  return r;
}

}  // namespace memwall
