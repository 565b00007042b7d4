// What the sharded optimizer is configured with. engine/config.h fills these
// from the DeepSpeed-style JSON keys (see there for names and defaults).
#ifndef MEMWALL_SHARDING_OPTIONS_H_
#define MEMWALL_SHARDING_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "offload/aio_config.h"
#include "runtime/dtype.h"

namespace memwall {

enum class OptimizerType : uint8_t { kAdam, kSgd };

// The settings of the update rule that may differ between parameters and
// change between steps (torch's param_groups: a no-decay group for biases
// and norms, a learning-rate schedule). Whether Adam is AdamW, and whether
// SGD keeps a momentum buffer, stay the optimizer's (OptimizerConfig).
struct Hyperparameters {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // SGD momentum (0: plain SGD; the config's 0 means no momentum buffer).
  float momentum = 0.0f;
};

// The config's optimizer: its hyperparameters are every parameter's until
// a caller sets a group's own (ShardedOptimizer::SetHyperparameters).
struct OptimizerConfig : Hyperparameters {
  OptimizerType type = OptimizerType::kAdam;
  // Adam: decoupled weight decay (AdamW); DeepSpeed's default for "Adam".
  bool adamw = true;
};

// Dynamic loss scaling for fp16 (DeepSpeed's semantics): start at
// 2^initial_scale_power; after `hysteresis` overflowing steps halve the scale
// (not below min_loss_scale); after loss_scale_window clean steps double it.
struct LossScaleConfig {
  // A fixed loss scale; 0 means dynamic scaling.
  float static_scale = 0.0f;
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  float min_loss_scale = 1.0f;
};

// A learning-rate schedule (DeepSpeed's `scheduler` types), applied by the
// optimizer at every step to every hyperparameter group
// (sharding/lr_schedule.h has the formulas).
struct LrSchedule {
  enum class Type : uint8_t { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
  Type type = Type::kNone;
  // Warm-up over warmup_num_steps steps, logarithmic (DeepSpeed's default)
  // or linear.
  int64_t warmup_num_steps = 1000;
  bool warmup_linear = false;
  // WarmupLR, WarmupDecayLR: the learning rate itself, from min to max.
  float warmup_min_lr = 0.0f;
  float warmup_max_lr = 1e-3f;
  // WarmupDecayLR (to 0), WarmupCosineLR (to cos_min_ratio): the last step.
  int64_t total_num_steps = 0;
  // WarmupCosineLR: ratios of each group's own learning rate.
  float warmup_min_ratio = 0.0f;
  float cos_min_ratio = 1e-4f;
};

// zero_optimization.stage "auto": the engine's auto strategy picks the
// stage (engine/auto_strategy.h) before anything is built; the sharded
// optimizer itself refuses it.
constexpr int kAutoStage = -1;

struct ZeroConfig {
  int stage = 0;  // 0..3, or kAutoStage before the engine resolves it
  // Elements per flat group: the unit of reduction, of sharding, and (stage
  // 3) of gathering.
  int64_t reduce_bucket_size = 500'000'000;
  // Accepted for DeepSpeed compatibility; gathers use the groups above.
  int64_t allgather_bucket_size = 500'000'000;
  // Run collectives on a communication stream of their own, overlapping
  // compute (see sharded_optimizer.h).
  bool overlap_comm = false;
  // Stage 3 with overlap: elements prefetched ahead of the group in use.
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  // Stage 3: prefetching stops while gathered groups hold this many elements.
  int64_t stage3_max_live_parameters = 1'000'000'000;
  // Stage 3: a layer that can (Layer::UseGroups) gathers each set of
  // parameters one operation uses (a weight and its bias) right before the
  // operation and releases it right after, reducing its gradients there in
  // backward, instead of holding all its parameters while it runs; the
  // trainer then groups those parameters by use (engine/layer.h).
  bool stage3_gather_on_use = false;
  // ZeRO++ qwZ (stage 3): parameter all-gathers move block-quantized int8
  // levels and an f32 scale per quantization_block_size elements instead of
  // the parameters (sharding/parameter_gatherer.h); saves stay exact.
  bool quantized_weights = false;
  int64_t quantization_block_size = 2048;
  // ZeRO++ hpZ (stage 3): above 1, each block of this many consecutive
  // ranks (a node, typically) keeps a secondary partition of the gathered
  // parameters, 1/size each, from a group's first gather in a step to the
  // step's end; later gathers in the step (backward, recomputation, other
  // micro-batches) all-gather inside the block only.
  int64_t hpz_partition_size = 1;
  // ZeRO++ qgZ (stage 3): gradients reduce-scatter inside each node in
  // the reduction dtype, then across nodes as block-quantized int8 partial
  // sums by all-to-all, each rank summing the nodes' dequantized parts of
  // its shard (sharding/gradient_reducer.h). Needs the nodes (the
  // communicator's topology) to be consecutive blocks of equal size.
  bool quantized_gradients = false;
  // Hybrid sharding (DeepSpeed's MiCS, FSDP2's HSDP; stages 1-3): above 0,
  // the states are sharded inside each block of this many consecutive
  // ranks (a node, typically) and replicated across the blocks. Gradients
  // reduce-scatter inside the block, then every shard is all-reduced with
  // its replicas (the ranks equal to it modulo the size); stage 3 gathers
  // inside the block. Must divide the ranks; -1 (DeepSpeed's default):
  // shard across all of them.
  int64_t mics_shard_size = -1;
  // ZeRO-Offload (stages 1-3): this fraction of each shard keeps its f32
  // master weights and optimizer states in the device's pinned host pool
  // and is updated on the CPU; the rest stays on the device (DeepSpeed's
  // ZeRO-Offload++ "ratio"). 0 = no offload, 1 = all of it.
  float offload_optimizer_ratio = 0.0f;
  // With offload: keep the offloaded optimizer states in a file in this
  // directory (a fast local disk, the NVMe tier) instead of the pinned
  // pool; empty = the pinned pool.
  std::string offload_nvme_path;
  // The NVMe tier: pinned buffers an update streams the state through
  // (DeepSpeed's offload_optimizer.buffer_count); each holds a chunk of
  // aio.block_size x queue_depth x thread_count bytes of state.
  int offload_buffer_count = 4;
  // Offload at stages 2-3: each group's CPU update starts as soon as its
  // final gradients have reached the host, on a thread of its own while
  // backward goes on, and Step() only checks and commits it (see
  // sharded_optimizer.h, Note [Overlapped update]). The pinned tier then
  // keeps a spare copy of the offloaded states (12 bytes per Adam element);
  // the NVMe tier's is on disk already.
  bool offload_overlap_step = false;
  // Threads of a rank's CPU update (0: MEMWALL_CPU_THREADS, else 1; the
  // Engine budgets 0 on cuda as the cores over the ranks there); with
  // offload_bind_cores, rank r's update thread and its helpers run on
  // cores [r * t, (r + 1) * t) modulo the cores there are (DeepSpeed's
  // --bind_cores_to_rank), t the update's threads (offload_cpu_threads, or
  // what 0 means).
  int offload_cpu_threads = 0;
  bool offload_bind_cores = false;
  // Parameter paging (stage 3, with the whole optimizer offloaded): the
  // rank's parameter shards live in the pinned pool too and are paged in
  // to the device only to be gathered (DeepSpeed's offload_param: cpu).
  bool offload_param = false;
  // Parameter paging from NVMe (offload_param.device "nvme", with the
  // optimizer states on NVMe too): the shards of the groups past the first
  // offload_param_max_in_cpu elements (in group order) live in a file in
  // this directory; a gather reads the shard into one of
  // offload_param_buffer_count pinned buffers of up to
  // offload_param_buffer_size elements (a shard must fit one) and pages it
  // in from there. Empty: the pinned pool holds every shard.
  std::string offload_param_nvme_path;
  int offload_param_buffer_count = 5;
  int64_t offload_param_buffer_size = 100'000'000;
  int64_t offload_param_max_in_cpu = 1'000'000'000;
};

// The combinations of ZeRO settings the sharded optimizer cannot run, and
// the offload fractions outside [0, 1]: one check for every caller, the
// config parser (engine/config.cc) and ShardedOptimizer::Create (callers
// that fill the options themselves). kInvalidArgument naming the config's
// JSON key. The rules that depend on the stage wait while it is "auto"
// (kAutoStage): Create checks them again once the engine has resolved it.
absl::Status CheckZeroConfig(const ZeroConfig& zero);

// The stage with what changes its communication, as memwall plan and
// memwall train name it: "ZeRO stage 3 sharded in groups of 4 GPUs
// (hybrid) with ZeRO++: int8 weight gathers (qwZ, blocks of 2048), later
// gathers in groups of 8 GPUs (hpZ), int8 gradients across nodes (qgZ)";
// `unit` names a rank ("GPU", "rank").
std::string DescribeZero(const ZeroConfig& zero, absl::string_view unit);

struct ShardingOptions {
  ZeroConfig zero;
  OptimizerConfig optimizer;
  bool fp16 = false;
  bool bf16 = false;
  LossScaleConfig loss_scale;
  // Clip the global gradient norm to this; 0 = off.
  float gradient_clipping = 0.0f;
  int gradient_accumulation_steps = 1;
  LrSchedule schedule;
  // The dtype gradients are reduced in across ranks.
  DType reduce_dtype = DType::kF32;
  // The NVMe tier's asynchronous I/O (DeepSpeed's "aio" block).
  AioConfig aio;

  // The dtype of the parameters and gradients the model sees: f16, bf16 or
  // f32. Mixed precision (f16/bf16) keeps f32 master weights.
  DType param_dtype() const {
    return fp16 ? DType::kF16 : (bf16 ? DType::kBF16 : DType::kF32);
  }
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_OPTIONS_H_
