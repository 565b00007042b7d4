#include "cli/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpointing/planner.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

#if MEMWALL_HAS_CUDA
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace memwall {

const char kDefaultTrainConfig[] = R"({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 50000}
})";

absl::StatusOr<Config> LoadConfigOrDefault(const std::string& path) {
  return path.empty() ? ParseConfig(kDefaultTrainConfig) : LoadConfig(path);
}

absl::StatusOr<Ranks> StartRanks(Backend backend, int simulate_ranks, absl::Duration timeout) {
  Ranks ranks;
  CommunicatorOptions options;
  options.timeout = timeout;
  MW_ASSIGN_OR_RETURN(ranks.world, MpiCommunicator::Create(options));
  ranks.comm = ranks.world.get();
  if (backend == Backend::kMeta) {
    if (ranks.world->world_size() != 1) {
      return absl::InvalidArgumentError(
          "--backend meta: run one process and set --simulate_ranks to the world it plays");
    }
    MW_ASSIGN_OR_RETURN(ranks.owned, SimulatedCommunicator::Create(0, simulate_ranks));
    ranks.comm = ranks.owned.get();
  }
  return ranks;
}

absl::StatusOr<std::unique_ptr<Device>> UseDevice(Ranks& ranks, Backend backend,
                                                  int64_t capacity_bytes, int64_t pinned_bytes) {
  const int rank = ranks.world->rank();
  DeviceOptions options{backend, rank, capacity_bytes};
  options.pinned_capacity_bytes = pinned_bytes;
  if (backend != Backend::kCuda) return CreateDevice(options);
#if MEMWALL_HAS_CUDA
  const int gpus = CudaDeviceCount();
  if (gpus < 1) {
    return absl::UnavailableError("--backend cuda: no usable GPU on this machine");
  }
  options.ordinal = rank % gpus;
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(options));
  CommunicatorOptions nccl_options;
  nccl_options.timeout = ranks.world->timeout();
  MW_ASSIGN_OR_RETURN(ranks.owned, NcclCommunicator::Create(*ranks.world, *device, nccl_options));
  ranks.comm = ranks.owned.get();
  return device;
#else
  return absl::UnimplementedError(
      "--backend cuda: this build has no CUDA (it was built with --config=nocuda)");
#endif
}

absl::StatusOr<Model> MakeModel(const std::string& spec, int64_t batch, int64_t seq,
                                int64_t image) {
  Model m;
  const std::vector<std::string> zoo = ZooModels();
  if (std::find(zoo.begin(), zoo.end(), spec) != zoo.end()) {
    const bool cnn = spec.rfind("res", 0) == 0;
    const int64_t length = seq > 0 ? seq : (spec == "llama-7b" ? 2048 : 4096);
    MW_ASSIGN_OR_RETURN(m.layers, MakeZooModel(spec, length));
    if (cnn) {
      if (image < 32) {
        return absl::InvalidArgumentError(absl::StrCat("--image: expected >= 32, got ", image));
      }
      m.input = {batch, 3, image, image};
      m.target = {batch, 1000};
      m.loss = std::make_unique<MseLoss>();
    } else {
      m.input = {batch, length};
      m.target = {batch * length};
      m.loss = std::make_unique<CrossEntropyLoss>();
    }
    return m;
  }
  MW_ASSIGN_OR_RETURN(GptConfig gpt, ParseGptModel(spec));
  if (seq > 0) gpt.seq = seq;
  MW_ASSIGN_OR_RETURN(m.layers, MakeGpt(gpt));
  m.input = {batch, gpt.seq};
  m.target = {batch * gpt.seq};
  m.loss = std::make_unique<CrossEntropyLoss>();
  return m;
}

int64_t PinnedBytes(int64_t flag, int64_t capacity, const Config& config) {
  if (flag > 0) return flag;
  if (config.zero.offload_optimizer_ratio > 0) return int64_t{64} << 30;
  return config.activation_checkpointing.offload ? capacity : 0;
}

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

absl::StatusOr<AllocatorStats> DryRunStep(std::vector<std::unique_ptr<Layer>> layers,
                                          std::unique_ptr<LossFunction> loss, const Config& config,
                                          int rank, int world_size,
                                          const std::vector<int64_t>& input,
                                          const std::vector<int64_t>& target, int64_t capacity,
                                          const Plan* plan) {
  DeviceOptions options{Backend::kMeta, 0, capacity};
  options.pinned_capacity_bytes = int64_t{1} << 60;  // for offloading configs
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> meta, CreateDevice(options));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedCommunicator> comm,
                      SimulatedCommunicator::Create(rank, world_size));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(std::move(layers), std::move(loss), config, *meta, *comm,
                                      /*seed=*/1));
  MW_ASSIGN_OR_RETURN(Chain chain, trainer->ChainFor(input));
  MW_RETURN_IF_ERROR(
      trainer->SetRecomputationPlan(plan != nullptr ? *plan : FullRecomputation(chain), chain));
  MW_ASSIGN_OR_RETURN(std::vector<Batch> batches,
                      EmptyBatches(*meta, config.gradient_accumulation_steps, input, target));
  MW_RETURN_IF_ERROR(trainer->TrainStep(batches).status());
  return meta->allocator().stats();
}

absl::StatusOr<Plan> ApplyRecomputation(
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
  MW_ASSIGN_OR_RETURN(Plan plan, MakePlan(chain, planner, options));
  MW_RETURN_IF_ERROR(trainer.SetRecomputationPlan(plan, chain));
  return plan;
}

}  // namespace memwall
