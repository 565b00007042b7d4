// memwall's training configuration: a JSON file whose keys follow the
// DeepSpeed config users already know.
//
// Accepted keys (everything else is rejected, naming the key path):
//   train_micro_batch_size_per_gpu   int >= 1                      (1)
//   gradient_accumulation_steps      int >= 1                      (1)
//   gradient_clipping                number >= 0; 0 = off          (0)
//   communication_data_type          "fp32" | "fp16" | "bf16"      ("fp32")
//   optimizer.type                   "Adam" | "AdamW" | "SGD"      ("Adam")
//   optimizer.params.lr              number >= 0                   (1e-3)
//   optimizer.params.betas           [b1, b2], each in [0, 1)      ([0.9, 0.999])
//   optimizer.params.eps             number > 0                    (1e-8)
//   optimizer.params.weight_decay    number >= 0                   (0)
//   optimizer.params.adam_w_mode     bool (Adam only)              (true, as DeepSpeed)
//   optimizer.params.momentum        number in [0, 1) (SGD only)   (0)
//   scheduler.type                   "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"
//                                     (DeepSpeed's; sharding/lr_schedule.h
//                                     has the formulas; none by default)
//   scheduler.params.warmup_num_steps int >= 0                     (1000)
//   scheduler.params.warmup_type     "log" | "linear"              ("log")
//   scheduler.params.warmup_min_lr, warmup_max_lr  numbers >= 0 (WarmupLR,
//                                     WarmupDecayLR)               (0, 1e-3)
//   scheduler.params.total_num_steps int >= 1, required by WarmupDecayLR
//                                     and WarmupCosineLR
//   scheduler.params.warmup_min_ratio, cos_min_ratio  in [0, 1]
//                                     (WarmupCosineLR)             (0, 1e-4)
//   fp16.enabled                     bool                          (false)
//   fp16.loss_scale                  number >= 0; 0 = dynamic      (0)
//   fp16.initial_scale_power         int 0..64: scale 2^power      (16)
//   fp16.loss_scale_window           int >= 1 clean steps to double (1000)
//   fp16.hysteresis                  int >= 1 overflows to halve   (2)
//   fp16.min_loss_scale              number > 0                    (1)
//   bf16.enabled                     bool                          (false)
//   zero_optimization.stage          int 0..3, or "auto"           (0)
//   zero_optimization.reduce_bucket_size      elements >= 1 per flat group (5e8)
//   zero_optimization.allgather_bucket_size   elements >= 1 (accepted; groups rule) (5e8)
//   zero_optimization.overlap_comm            bool: collectives overlap compute (false)
//   zero_optimization.stage3_prefetch_bucket_size  elements prefetched ahead (5e7)
//   zero_optimization.stage3_max_live_parameters   elements gathered at most (1e9)
//   zero_optimization.stage3_gather_on_use  bool: layers that can gather each
//                                     weight (and bias) for the operation
//                                     using it, not all their parameters
//                                     for the whole layer (memwall's) (false)
//   zero_optimization.zero_quantized_weights  bool: ZeRO++ qwZ, stage 3's
//                                     parameter all-gathers in block-
//                                     quantized int8, saves exact  (false)
//   zero_optimization.zero_hpz_partition_size  int >= 1: ZeRO++ hpZ, a
//                                     secondary partition of the gathered
//                                     parameters in each block of this many
//                                     ranks (a node), later gathers of a
//                                     step inside it; must divide the
//                                     ranks (1: off)                   (1)
//   zero_optimization.zero_quantized_gradients  bool: ZeRO++ qgZ, stage 3's
//                                     gradients reduced inside each node,
//                                     then across nodes in block-quantized
//                                     int8 by all-to-all          (false)
//   zero_optimization.mics_shard_size  int: hybrid sharding (MiCS, HSDP;
//                                     stages 1-3), the states sharded in
//                                     each block of this many ranks (a
//                                     node) and replicated across blocks,
//                                     gradients all-reduced across them;
//                                     must divide the ranks (-1: off) (-1)
//   zero_optimization.zero_quantization_block_size  int >= 1: elements per
//                                     quantization block (qwZ and qgZ),
//                                     one f32 scale each (memwall's) (2048)
//   zero_optimization.offload_optimizer.device     "none" | "cpu" | "nvme"
//                                     (ZeRO-Offload, stages 1-3; nvme keeps
//                                     the states in a file)          ("none")
//   zero_optimization.offload_optimizer.nvme_path  directory for "nvme"
//   zero_optimization.offload_optimizer.ratio      number in [0, 1]: the
//                                     fraction of each shard updated on
//                                     the CPU (ZeRO-Offload++)        (1)
//   zero_optimization.offload_optimizer.pin_memory bool, accepted (memwall
//                                     always uses its pinned pool)
//   zero_optimization.offload_optimizer.buffer_count  int 1..1024: pinned
//                                     buffers the NVMe tier streams the
//                                     state through (each aio.block_size x
//                                     queue_depth x thread_count)       (4)
//   zero_optimization.offload_optimizer.overlap_step  bool: stages 2-3:
//                                     the CPU update (and its NVMe I/O)
//                                     runs during backward, group by group,
//                                     exact (pinned: a spare copy of the
//                                     states)                       (false)
//   zero_optimization.offload_optimizer.cpu_threads   int 0..4096: the CPU
//                                     update's threads per rank, 0 =
//                                     MEMWALL_CPU_THREADS if set, else
//                                     on cuda the cores / the ranks on
//                                     the machine (Engine), on host 1 (0)
//   zero_optimization.offload_optimizer.bind_cores    bool: pin them to
//                                     cores [rank*t, (rank+1)*t), t the
//                                     threads in force              (false)
//   zero_optimization.offload_param.device         "none" | "cpu" | "nvme":
//                                     parameter paging (stage 3 with the
//                                     optimizer offloaded at ratio 1; "nvme"
//                                     with the optimizer on "nvme" too, not
//                                     with overlap_step)
//   zero_optimization.offload_param.nvme_path      directory of the
//                                     parameters' file (required with "nvme")
//   zero_optimization.offload_param.buffer_count   int 1..1024: pinned page
//                                     buffers                            (5)
//   zero_optimization.offload_param.buffer_size    elements per page buffer
//                                     (each NVMe shard must fit)       (1e8)
//   zero_optimization.offload_param.max_in_cpu     elements of shards kept in
//                                     pinned memory, first groups first (1e9)
//   zero_optimization.offload_param.pin_memory     bool, accepted
//   aio.block_size                    bytes per NVMe request, a multiple
//                                     of 4096                       (1048576)
//   aio.queue_depth                   int 1..1024: requests in flight per
//                                     thread                             (8)
//   aio.thread_count                  int 1..64: I/O threads             (1)
//   aio.single_submit                 bool: one request per submit   (false)
//   aio.overlap_events                bool: refill as requests end    (true)
//   activation_checkpointing.planner  "none" | "full" | "uniform:K" | "sqrt" |
//                                     "selective" | "optimal"      ("none")
//                                     (checkpointing/planner.h)
//   activation_checkpointing.budget_bytes   int >= 0; optimal's activation
//                                     budget, 0 = the device capacity less
//                                     the rest of a step (engine/dry_run.h) (0)
//   activation_checkpointing.resolution     int 0..1000000: optimal's budget
//                                     steps, 0 = exact               (4096)
//   activation_checkpointing.selective      bool: optimal may mix in
//                                     selective layers               (true)
//   activation_checkpointing.offload        bool: optimal may keep segment
//                                     inputs in pinned host memory  (false)
//   activation_checkpointing.cpu_checkpointing      bool (DeepSpeed): the
//                                     same as offload               (false)
//   activation_checkpointing.offload_flops_per_byte number > 0: a byte moved
//                                     each way, priced in FLOPs (12500: an
//                                     A100's 312 TFLOP/s over 25 GB/s PCIe)
//   activation_checkpointing.number_checkpoints  int >= 1 (DeepSpeed): with
//                                     no planner, uniform segments, this many
//   activation_checkpointing.partition_activations  false only (memwall has
//                                     no tensor parallelism)
//   activation_checkpointing.contiguous_memory_optimization,
//   activation_checkpointing.synchronize_checkpoint_boundary,
//   activation_checkpointing.profile  bool, accepted for DeepSpeed configs;
//                                     not applied (listed in not_applied)
//   train_batch_size                  int >= 1: micro-batch x accumulation x
//                                     ranks, checked by the engine  (absent)
//   ranks_per_node                    int >= 1 (memwall's): the ranks as
//                                     nodes of this many consecutive ranks,
//                                     what the link bytes count as inside
//                                     or across nodes (absent: the
//                                     environment's MEMWALL_RANKS_PER_NODE,
//                                     else the ranks that share memory)
//   DeepSpeed's own knobs, accepted and listed in Config::not_applied:
//     steps_per_print, wall_clock_breakdown, zero_allow_untested_optimizer,
//     zero_optimization.sub_group_size, .stage3_param_persistence_threshold,
//     .stage3_max_reuse_distance
//   zero_optimization.contiguous_gradients, .allgather_partitions,
//   .reduce_scatter, .stage3_gather_16bit_weights_on_model_save
//                                     true only: what memwall always does
// Sizes in elements accept JSON numbers such as 5e8 if they are whole.
// As in DeepSpeed, "Adam" applies decoupled weight decay (AdamW) unless
// adam_w_mode is false; fp16 and bf16 cannot both be enabled.
#ifndef MEMWALL_ENGINE_CONFIG_H_
#define MEMWALL_ENGINE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/dtype.h"
#include "sharding/options.h"

namespace memwall {

// activation_checkpointing: which recomputation plan to train with.
struct RecomputeConfig {
  std::string planner = "none";
  int64_t budget_bytes = 0;
  int resolution = 4096;
  bool selective = true;
  bool offload = false;
  float offload_flops_per_byte = 12500;
  int64_t number_checkpoints = 0;  // 0: not given
};

// The engine's configuration: the sharding options (sharding/options.h,
// which the JSON keys above fill) plus the engine's own keys.
struct Config : ShardingOptions {
  int64_t train_micro_batch_size_per_gpu = 1;
  // DeepSpeed's train_batch_size as given (0: absent): the micro-batch x
  // gradient_accumulation_steps x ranks, which the engine checks against
  // its world.
  int64_t train_batch_size = 0;
  // ranks_per_node as given (0: absent; runtime/communicator.h's topology).
  int64_t ranks_per_node = 0;
  RecomputeConfig activation_checkpointing;
  // The DeepSpeed settings the config gave that memwall reads but has no
  // counterpart for (DeepSpeed's own logging and tuning knobs:
  // "steps_per_print", "zero_optimization.sub_group_size", ...), by key
  // path, for callers to show: nothing is silently dropped. Settings whose
  // only meaning is what memwall always does ("contiguous_gradients":
  // true) are accepted at that value and refused at another.
  std::vector<std::string> not_applied;
};

// kInvalidArgument naming train_batch_size when the config gives one that is
// not train_micro_batch_size_per_gpu x gradient_accumulation_steps x `ranks`.
absl::Status CheckTrainBatchSize(const Config& config, int64_t ranks);

// Parses a config from JSON text. Errors are kInvalidArgument and name the
// key path and what was expected: "zero_optimization.stage: expected an
// integer 0..3, got 4".
absl::StatusOr<Config> ParseConfig(absl::string_view json_text);

// Reads and parses a config file; errors name the file as well.
absl::StatusOr<Config> LoadConfig(const std::string& path);

// The built-in default config (ZeRO stage 2 with overlap, AdamW); the same
// as configs/gpt-tiny-zero2.json.
extern const char kDefaultTrainConfig[];

// `path`'s config, or the built-in one when `path` is empty.
absl::StatusOr<Config> LoadConfigOrDefault(const std::string& path);

// The config as JSON with every key above written out (DeepSpeed's names),
// so that ParseConfig(ConfigToJson(c)) is `c` again, float for float: what
// `memwall plan --auto` prints is exactly what it planned.
std::string ConfigToJson(const Config& config);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_CONFIG_H_
