#include "cli/session.h"

#include "runtime/simulated_communicator.h"
#include "runtime/status.h"

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
    MW_ASSIGN_OR_RETURN(ranks.simulated, SimulatedCommunicator::Create(0, simulate_ranks));
    ranks.comm = ranks.simulated.get();
  }
  return ranks;
}

}  // namespace memwall
