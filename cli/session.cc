#include "cli/session.h"

#include "runtime/simulated_communicator.h"
#include "runtime/status.h"

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

absl::StatusOr<Ranks> StartRanks(Backend backend, int simulate_ranks) {
  Ranks ranks;
  MW_ASSIGN_OR_RETURN(ranks.world, MpiCommunicator::Create());
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
                                                  int64_t capacity_bytes) {
  const int rank = ranks.world->rank();
  if (backend != Backend::kCuda) return CreateDevice({backend, rank, capacity_bytes});
#if MEMWALL_HAS_CUDA
  const int gpus = CudaDeviceCount();
  if (gpus < 1) {
    return absl::UnavailableError("--backend cuda: no usable GPU on this machine");
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      CreateDevice({backend, rank % gpus, capacity_bytes}));
  MW_ASSIGN_OR_RETURN(ranks.owned, NcclCommunicator::Create(*ranks.world, *device));
  ranks.comm = ranks.owned.get();
  return device;
#else
  return absl::UnimplementedError(
      "--backend cuda: this build has no CUDA (it was built with --config=nocuda)");
#endif
}

}  // namespace memwall
