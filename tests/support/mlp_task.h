// A small regression task and optimizer-state snapshot shared by the
// checkpoint and fault-injection tests: an MLP of widths {16, 48, 48, 4}
// on y = cos(...) of x = sin(...), different rows per rank and step.
#ifndef MEMWALL_TESTS_SUPPORT_MLP_TASK_H_
#define MEMWALL_TESTS_SUPPORT_MLP_TASK_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/trainer.h"
#include "models/layers.h"
#include "sharding/sharded_optimizer.h"

namespace memwall::testing {

inline const std::vector<int64_t>& MlpTaskWidths() {
  static const std::vector<int64_t> widths = {16, 48, 48, 4};
  return widths;
}

// Eight rows of the task for `rank` at data position `position`; with
// `poison`, its first input value is that instead (an inf or nan).
inline Batch MlpTaskBatch(Device& device, int rank, int position,
                          std::optional<float> poison = std::nullopt) {
  constexpr int kIn = 16, kOut = 4, kRows = 8;
  std::vector<float> x(kRows * kIn), y(kRows * kOut);
  for (int r = 0; r < kRows; ++r) {
    const int sample = 1000 * position + 37 * rank + r;
    for (int i = 0; i < kIn; ++i) x[r * kIn + i] = std::sin(0.37f * sample + 1.1f * i);
    for (int o = 0; o < kOut; ++o) y[r * kOut + o] = std::cos(0.21f * sample + 0.9f * o);
  }
  if (poison) x[0] = *poison;
  Batch b;
  b.input = Tensor::FromHost(device, x, {kRows, kIn}, MemoryCategory::kOther, "x").value();
  b.target = Tensor::FromHost(device, y, {kRows, kOut}, MemoryCategory::kOther, "y").value();
  return b;
}

// A strategy for the task: ZeRO stage, precision, offload.
struct MlpSetup {
  std::string name;
  int stage = 0;
  bool bf16 = false;        // bf16 parameters and gradients (else f32, or fp16 below)
  float offload = 0;       // optimizer offload ratio
  bool paging = false;     // stage-3 parameter paging
  bool nvme = false;       // optimizer states in a file under $TEST_TMPDIR
  bool sgd = false;        // SGD with momentum instead of AdamW
  int accumulation = 1;    // micro-batches per step
  bool fp16 = false;       // fp16 with dynamic loss scaling from 2^8
  float clipping = 0;      // gradient_clipping (0: none)
  int64_t shard_size = -1;  // zero_optimization.mics_shard_size (-1: none)
  bool overlap_step = false;  // offload_optimizer.overlap_step (stages 2-3)
};

struct MlpRun {
  std::unique_ptr<Device> device;  // host, 64 MiB, a 64 MiB pinned pool
  std::unique_ptr<Trainer> trainer;
};

// A trainer of the task's MLP under `s` on `comm`, parameters from `seed`.
inline MlpRun StartMlpTask(const MlpSetup& s, Communicator& comm, uint64_t seed = 7) {
  DeviceOptions d{Backend::kHost, 0, int64_t{64} << 20};
  d.pinned_capacity_bytes = int64_t{64} << 20;
  MlpRun run;
  run.device = CreateDevice(d).value();
  ShardingOptions o;
  o.zero.stage = s.stage;
  o.zero.reduce_bucket_size = 700;  // a group per layer
  o.zero.overlap_comm = true;
  o.bf16 = s.bf16;
  o.fp16 = s.fp16;
  // The task's gradients overflow fp16 at DeepSpeed's 2^16; start where
  // they do not, so that every overflow is one a test made.
  o.loss_scale.initial_scale_power = 8;
  o.gradient_clipping = s.clipping;
  o.zero.offload_optimizer_ratio = s.offload;
  o.zero.offload_param = s.paging;
  if (s.nvme) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    o.zero.offload_nvme_path = tmp ? tmp : "/tmp";
  }
  o.optimizer.lr = 1e-2f;
  if (s.sgd) {
    o.optimizer.type = OptimizerType::kSgd;
    o.optimizer.momentum = 0.9f;
  }
  o.gradient_accumulation_steps = s.accumulation;
  o.zero.mics_shard_size = s.shard_size;
  o.zero.offload_overlap_step = s.overlap_step;
  run.trainer = Trainer::Create(MakeMlp(MlpTaskWidths()), std::make_unique<MseLoss>(), o,
                                *run.device, comm, seed)
                    .value();
  return run;
}

// Collective: every state of every group, gathered, in order (empty if a
// gather fails, which the caller's comparison then reports).
inline std::vector<float> AllStates(ShardedOptimizer& opt) {
  std::vector<float> all;
  for (size_t g = 0; g < opt.layout().groups.size(); ++g) {
    std::vector<float> full(opt.layout().groups[g].padded_numel);
    for (int s = 0; s < opt.num_states(); ++s) {
      if (!opt.GatherState(static_cast<int>(g), s, absl::MakeSpan(full)).ok()) return {};
      all.insert(all.end(), full.begin(), full.end());
    }
  }
  return all;
}

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_MLP_TASK_H_
