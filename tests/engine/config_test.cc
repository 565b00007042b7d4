// DeepSpeed-style config parsing: values, defaults, and an error naming the
// key path for every kind of bad input.
#include "engine/config.h"

#include <cstdio>
#include <fstream>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

std::string Error(const std::string& json) {
  auto config = ParseConfig(json);
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST_CASE("a DeepSpeed config parses into memwall's", "[config]") {
  auto config = ParseConfig(R"({
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "communication_data_type": "bf16",
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95],
                  "eps": 1e-6, "weight_decay": 0.1}},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7, "allgather_bucket_size": 2e8,
                          "overlap_comm": true, "stage3_prefetch_bucket_size": 1000000,
                          "stage3_max_live_parameters": 3e8}
  })");
  REQUIRE(config.ok());
  CHECK(config->train_micro_batch_size_per_gpu == 4);
  CHECK(config->gradient_accumulation_steps == 2);
  CHECK(config->gradient_clipping == 1.0f);
  CHECK(config->reduce_dtype == DType::kBF16);
  CHECK(config->optimizer.type == OptimizerType::kAdam);
  CHECK(config->optimizer.adamw);
  CHECK(config->optimizer.lr == 3e-4f);
  CHECK(config->optimizer.beta1 == 0.8f);
  CHECK(config->optimizer.beta2 == 0.95f);
  CHECK(config->optimizer.eps == 1e-6f);
  CHECK(config->optimizer.weight_decay == 0.1f);
  CHECK(config->bf16);
  CHECK(config->param_dtype() == DType::kBF16);
  CHECK(config->zero.stage == 3);
  CHECK(config->zero.reduce_bucket_size == 50'000'000);
  CHECK(config->zero.allgather_bucket_size == 200'000'000);
  CHECK(config->zero.overlap_comm);
  CHECK(config->zero.stage3_prefetch_bucket_size == 1'000'000);
  CHECK(config->zero.stage3_max_live_parameters == 300'000'000);
}

TEST_CASE("defaults follow DeepSpeed", "[config]") {
  auto config = ParseConfig("{}");
  REQUIRE(config.ok());
  CHECK(config->zero.stage == 0);
  CHECK(config->param_dtype() == DType::kF32);
  CHECK(config->reduce_dtype == DType::kF32);
  CHECK(config->optimizer.adamw);  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false
  CHECK(config->loss_scale.initial_scale_power == 16);
  CHECK(config->loss_scale.hysteresis == 2);
  auto fp16 = ParseConfig(R"({"fp16": {"enabled": true, "loss_scale_window": 100, "hysteresis": 1,
                                       "min_loss_scale": 0.5, "initial_scale_power": 8},
                              "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  REQUIRE(fp16.ok());
  CHECK(fp16->param_dtype() == DType::kF16);
  CHECK(fp16->loss_scale.loss_scale_window == 100);
  CHECK(fp16->loss_scale.min_loss_scale == 0.5f);
  CHECK_FALSE(fp16->optimizer.adamw);
  auto sgd = ParseConfig(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})");
  REQUIRE(sgd.ok());
  CHECK(sgd->optimizer.type == OptimizerType::kSgd);
  CHECK(sgd->optimizer.momentum == 0.9f);
}

TEST_CASE("bad configs name the key path and what was expected", "[config]") {
  CHECK(Error(R"({"zero_optimization": {"stage": 4}})") ==
        "zero_optimization.stage: expected an integer 0..3, got 4");
  // A loss scale whose reciprocal overflows f32 is refused when read, not
  // at the first step.
  CHECK(Error(R"({"fp16": {"enabled": true, "loss_scale": 1e-45}})") ==
        "fp16.loss_scale: expected 0 (dynamic) or a number >= 1.17549435e-38 (whose reciprocal "
        "is a finite f32), got 1e-45");
  CHECK(Error(R"({"fp16": {"enabled": true, "min_loss_scale": 1e-40}})") ==
        "fp16.min_loss_scale: expected a number >= 1.17549435e-38 (whose reciprocal is a finite "
        "f32), got 1e-40");
  CHECK(ParseConfig(R"({"fp16": {"enabled": true, "loss_scale": 1.2e-38}})").ok());
  CHECK(Error(R"({"zero_optimization": {"stage": "best"}})") ==
        "zero_optimization.stage: expected an integer 0..3 or \"auto\", got \"best\"");
  auto automatic = ParseConfig(R"({"zero_optimization": {"stage": "auto"}})");
  REQUIRE(automatic.ok());
  CHECK(automatic->zero.stage == kAutoStage);
  CHECK(Error(R"({"zero_optimization": {"stage": 1.5}})") ==
        "zero_optimization.stage: expected an integer 0..3, got 1.5");
  CHECK_THAT(Error(R"({"zero_optimization": {"stgae": 1}})"),
             Catch::StartsWith("zero_optimization.stgae: unknown key (known here: "));
  CHECK_THAT(Error(R"({"train_batch_sise": 8})"), Catch::StartsWith("train_batch_sise: unknown key"));
  CHECK(Error(R"({"fp16": {"enabled": "yes"}})") == "fp16.enabled: expected a boolean, got \"yes\"");
  CHECK(Error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})") ==
        "fp16.enabled and bf16.enabled: expected at most one of them, got both true");
  CHECK(Error(R"({"optimizer": {"type": "Lamb"}})") ==
        "optimizer.type: expected one of \"Adam\", \"AdamW\", \"SGD\", got \"Lamb\"");
  CHECK(Error(R"({"optimizer": {"params": {"betas": [0.9]}}})") ==
        "optimizer.params.betas: expected [beta1, beta2] with each in [0, 1), got [0.9]");
  CHECK(Error(R"({"optimizer": {"params": {"eps": 0}}})") ==
        "optimizer.params.eps: expected a number > 0, got 0");
  CHECK(Error(R"({"optimizer": {"params": {"lr": -1}}})") ==
        "optimizer.params.lr: expected a number >= 0, got -1");
  CHECK_THAT(Error(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})"),
             Catch::StartsWith("optimizer.params.betas: unknown key"));
  CHECK(Error(R"({"gradient_accumulation_steps": 0})") ==
        "gradient_accumulation_steps: expected an integer 1..2147483647, got 0");
  CHECK(Error(R"({"communication_data_type": "fp8"})") ==
        "communication_data_type: expected one of \"fp32\", \"fp16\", \"bf16\", got \"fp8\"");
  CHECK(Error(R"({"zero_optimization": 3})") ==
        "zero_optimization: expected an object, got 3");
  CHECK(Error("[1, 2]") == "config: expected an object, got [1,2]");
  CHECK_THAT(Error("{\"fp16\": {"), Catch::StartsWith("config: not valid JSON: "));
  // Found by fuzzing (tests/fuzz/corpus/config/crash-4c67119): a number
  // beyond double's range threw out of the parser.
  CHECK_THAT(Error("{\"lr\": 1e999}"),
             Catch::StartsWith("config: not valid JSON: [json.exception.out_of_range.406] number "
                               "overflow parsing '1e999'"));
}

TEST_CASE("activation_checkpointing: DeepSpeed's keys and memwall's planner", "[config]") {
  auto config = ParseConfig(R"({"activation_checkpointing": {
    "planner": "optimal", "budget_bytes": 8589934592, "resolution": 0, "selective": false,
    "partition_activations": false, "cpu_checkpointing": false,
    "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": false,
    "profile": true}})");
  REQUIRE(config.ok());
  const RecomputeConfig& r = config->activation_checkpointing;
  CHECK(r.planner == "optimal");
  CHECK(r.budget_bytes == 8589934592);
  CHECK(r.resolution == 0);
  CHECK_FALSE(r.selective);
  CHECK(r.number_checkpoints == 0);
  // DeepSpeed's own three are read and named as not applied.
  CHECK(config->not_applied ==
        std::vector<std::string>{"activation_checkpointing.contiguous_memory_optimization",
                                 "activation_checkpointing.synchronize_checkpoint_boundary",
                                 "activation_checkpointing.profile"});
  auto defaults = ParseConfig("{}");
  REQUIRE(defaults.ok());
  CHECK(defaults->activation_checkpointing.planner == "none");
  CHECK(defaults->activation_checkpointing.resolution == 4096);
  CHECK(defaults->activation_checkpointing.selective);
  auto uniform = ParseConfig(R"({"activation_checkpointing": {"planner": "uniform:3"}})");
  REQUIRE(uniform.ok());
  CHECK(uniform->activation_checkpointing.planner == "uniform:3");
  auto counted = ParseConfig(R"({"activation_checkpointing": {"number_checkpoints": 4}})");
  REQUIRE(counted.ok());
  CHECK(counted->activation_checkpointing.number_checkpoints == 4);

  CHECK(Error(R"({"activation_checkpointing": {"planner": "uniform:0"}})") ==
        "activation_checkpointing.planner: expected one of \"none\", \"full\", \"uniform:K\" "
        "(K >= 1), \"sqrt\", \"selective\", \"optimal\", got \"uniform:0\"");
  CHECK(Error(R"({"activation_checkpointing": {"budget_bytes": -1}})") ==
        "activation_checkpointing.budget_bytes: expected an integer >= 0, got -1");
  auto offload = ParseConfig(
      R"({"activation_checkpointing": {"cpu_checkpointing": true, "offload_flops_per_byte": 4e4}})");
  REQUIRE(offload.ok());
  CHECK(offload->activation_checkpointing.offload);
  CHECK(offload->activation_checkpointing.offload_flops_per_byte == 4e4f);
  CHECK_FALSE(defaults->activation_checkpointing.offload);
  CHECK(Error(R"({"activation_checkpointing": {"offload_flops_per_byte": 0}})") ==
        "activation_checkpointing.offload_flops_per_byte: expected a number > 0, got 0");
  CHECK(Error(R"({"activation_checkpointing": {"partition_activations": true}})") ==
        "activation_checkpointing.partition_activations: expected false (memwall has no tensor "
        "parallelism to partition activations across), got true");
  CHECK(Error(R"({"activation_checkpointing": {"planner": "sqrt", "number_checkpoints": 2}})") ==
        "activation_checkpointing.number_checkpoints: expected no planner with it (it asks for "
        "uniform segments), got planner \"sqrt\"");
  CHECK_THAT(Error(R"({"activation_checkpointing": {"checkpoint_in_cpu": true}})"),
             Catch::StartsWith("activation_checkpointing.checkpoint_in_cpu: unknown key"));
}

TEST_CASE("ZeRO-Offload keys: optimizer offload with a ratio; paging and NVMe refused by name",
          "[config]") {
  auto config = ParseConfig(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true, "ratio": 0.25}}})");
  REQUIRE(config.ok());
  CHECK(config->zero.offload_optimizer_ratio == 0.25f);
  auto whole = ParseConfig(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}})");
  REQUIRE(whole.ok());
  CHECK(whole->zero.offload_optimizer_ratio == 1.0f);
  auto off = ParseConfig(R"({"zero_optimization": {"offload_optimizer": {"device": "none"}}})");
  REQUIRE(off.ok());
  CHECK(off->zero.offload_optimizer_ratio == 0.0f);
  auto nvme = ParseConfig(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  REQUIRE(nvme.ok());
  CHECK(nvme->zero.offload_optimizer_ratio == 1.0f);
  CHECK(nvme->zero.offload_nvme_path == "/local_nvme");
  CHECK(config->zero.offload_nvme_path.empty());
  CHECK(Error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})") ==
        "zero_optimization.offload_optimizer.nvme_path: expected a directory with device \"nvme\", "
        "got none");
  CHECK(Error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}})") ==
        "zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", \"nvme\", "
        "got \"disk\"");
  auto paging = ParseConfig(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  REQUIRE(paging.ok());
  CHECK(paging->zero.offload_param);
  CHECK_FALSE(whole->zero.offload_param);
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})") ==
        "zero_optimization.offload_param: expected stage 3 and offload_optimizer on \"cpu\" with "
        "ratio 1 with it, got stage 3 and ratio 0");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})") ==
        "zero_optimization.offload_param.nvme_path: expected a directory with device \"nvme\", "
        "got none");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "nvme", "nvme_path": "/x"}}})") ==
        "zero_optimization.offload_param: expected offload_optimizer on \"nvme\" with device "
        "\"nvme\" (a step writes both tiers' files before committing either, so a failed write "
        "leaves both as they were)");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}})") ==
        "zero_optimization.offload_param.device: expected one of \"none\", \"cpu\", \"nvme\", "
        "got \"disk\"");
}

TEST_CASE("a Hugging Face DeepSpeed config: its knobs named as not applied, train_batch_size "
          "kept, what memwall cannot do refused", "[config]") {
  // transformers' documented zero3 layout, its "auto" values filled.
  const Config c = ParseConfig(R"({
    "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                              "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                          "offload_param": {"device": "cpu", "pin_memory": true},
                          "overlap_comm": true, "contiguous_gradients": true,
                          "sub_group_size": 1e9, "reduce_bucket_size": 4096,
                          "stage3_prefetch_bucket_size": 3686,
                          "stage3_param_persistence_threshold": 640,
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, "steps_per_print": 2000,
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "wall_clock_breakdown": false
  })").value();
  CHECK(c.not_applied ==
        std::vector<std::string>{"zero_optimization.sub_group_size",
                                 "zero_optimization.stage3_param_persistence_threshold",
                                 "zero_optimization.stage3_max_reuse_distance", "steps_per_print",
                                 "wall_clock_breakdown"});
  CHECK(c.train_batch_size == 16);
  CHECK(c.zero.stage == 3);
  CHECK(c.zero.reduce_bucket_size == 4096);
  CHECK(ParseConfig(ConfigToJson(c)).value().train_batch_size == 16);
  CHECK(ParseConfig("{}").value().not_applied.empty());
  CHECK_THAT(ConfigToJson(ParseConfig("{}").value()), !Catch::Contains("train_batch_size"));
  CHECK(Error(R"({"zero_optimization": {"contiguous_gradients": false}})") ==
        "zero_optimization.contiguous_gradients: expected true (memwall's gradients always lie "
        "in contiguous flat buckets), got false");
  CHECK(Error(R"({"zero_optimization": {"reduce_scatter": 0}})") ==
        "zero_optimization.reduce_scatter: expected true (memwall reduces sharded gradients "
        "with reduce-scatter), got 0");
  CHECK(Error(R"({"train_batch_size": 0})") ==
        "train_batch_size: expected an integer >= 1, got 0");
}

TEST_CASE("ZeRO++ quantized weights and the topology: keys, round trip, refusals", "[config]") {
  const Config c = ParseConfig(R"({"zero_optimization": {"stage": 3,
      "zero_quantized_weights": true, "zero_quantization_block_size": 512},
      "ranks_per_node": 8})").value();
  CHECK(c.zero.quantized_weights);
  CHECK(c.zero.quantization_block_size == 512);
  CHECK(c.ranks_per_node == 8);
  const Config back = ParseConfig(ConfigToJson(c)).value();
  CHECK(back.zero.quantized_weights);
  CHECK(back.zero.quantization_block_size == 512);
  CHECK(back.ranks_per_node == 8);
  const Config none = ParseConfig("{}").value();
  CHECK_FALSE(none.zero.quantized_weights);
  CHECK(none.zero.quantization_block_size == 2048);
  CHECK(none.ranks_per_node == 0);
  CHECK(Error(R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})") ==
        "zero_optimization.zero_quantized_weights: expected stage 3 with it (it quantizes stage "
        "3's parameter gathers), got stage 2");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true,
      "zero_quantization_block_size": 0}})") ==
        "zero_optimization.zero_quantization_block_size: expected an integer 1..2147483647, got 0");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "zero_quantization_block_size": 256}})") ==
        "zero_optimization.zero_quantization_block_size: sizes the blocks of "
        "zero_quantized_weights or zero_quantized_gradients, and neither is true");
  CHECK(Error(R"({"ranks_per_node": 0})") ==
        "ranks_per_node: expected an integer 1..2147483647, got 0");
  const Config hpz =
      ParseConfig(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})").value();
  CHECK(hpz.zero.hpz_partition_size == 8);
  CHECK(ParseConfig(ConfigToJson(hpz)).value().zero.hpz_partition_size == 8);
  CHECK(none.zero.hpz_partition_size == 1);
  const Config qgz =
      ParseConfig(R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})")
          .value();
  CHECK(qgz.zero.quantized_gradients);
  CHECK(ParseConfig(ConfigToJson(qgz)).value().zero.quantized_gradients);
  CHECK_FALSE(none.zero.quantized_gradients);
  CHECK(Error(R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})") ==
        "zero_optimization.zero_quantized_gradients: expected stage 3 with it (it quantizes "
        "stage 3's gradient reduce-scatters across nodes), got stage 2");
  CHECK(Error(R"({"zero_optimization": {"stage": 1, "zero_hpz_partition_size": 8}})") ==
        "zero_optimization.zero_hpz_partition_size: expected 1 below stage 3 (it partitions "
        "stage 3's gathered parameters), got 8 at stage 1");
}

TEST_CASE("mics_shard_size: DeepSpeed's key, round trip, refusals", "[config]") {
  const Config c =
      ParseConfig(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})").value();
  CHECK(c.zero.mics_shard_size == 8);
  CHECK(ParseConfig(ConfigToJson(c)).value().zero.mics_shard_size == 8);
  CHECK(ParseConfig("{}").value().zero.mics_shard_size == -1);
  CHECK_THAT(ConfigToJson(ParseConfig("{}").value()), !Catch::Contains("mics"));
  CHECK(ParseConfig(R"({"zero_optimization": {"stage": 1, "mics_shard_size": -1}})")
            .value()
            .zero.mics_shard_size == -1);
  CHECK(Error(R"({"zero_optimization": {"stage": 0, "mics_shard_size": 8}})") ==
        "zero_optimization.mics_shard_size: expected stage 1, 2 or 3 with it (it shards the "
        "states inside groups of ranks), got stage 0");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 0}})") ==
        "zero_optimization.mics_shard_size: expected -1 (shard across all ranks) or the ranks of "
        "a shard group, >= 1, got 0");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "mics_shard_size": -2}})") ==
        "zero_optimization.mics_shard_size: expected an integer -1..2147483647, got -2");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8,
      "zero_hpz_partition_size": 8}})") ==
        "zero_optimization.mics_shard_size: not with zero_hpz_partition_size (a shard group "
        "gathers inside itself already: make it the node)");
  CHECK(Error(R"({"zero_optimization": {"stage": "auto", "mics_shard_size": 8,
      "zero_quantized_gradients": true}})") ==
        "zero_optimization.mics_shard_size: not with zero_quantized_gradients (hybrid sharding "
        "reduce-scatters inside the shard group and all-reduces across the groups)");
}

TEST_CASE("stage3_gather_on_use: key, round trip, refusal", "[config]") {
  const Config c =
      ParseConfig(R"({"zero_optimization": {"stage": 3, "stage3_gather_on_use": true}})").value();
  CHECK(c.zero.stage3_gather_on_use);
  CHECK(ParseConfig(ConfigToJson(c)).value().zero.stage3_gather_on_use);
  CHECK_FALSE(ParseConfig("{}").value().zero.stage3_gather_on_use);
  CHECK_THAT(ConfigToJson(ParseConfig("{}").value()), !Catch::Contains("gather_on_use"));
  CHECK(Error(R"({"zero_optimization": {"stage": 2, "stage3_gather_on_use": true}})") ==
        "zero_optimization.stage3_gather_on_use: expected stage 3 with it, got stage 2");
  CHECK(Error(R"({"zero_optimization": {"stage": 3, "stage3_gather_on_use": 1}})") ==
        "zero_optimization.stage3_gather_on_use: expected a boolean, got 1");
}

TEST_CASE("parameters on NVMe: DeepSpeed's offload_param keys, round trip, refusals", "[config]") {
  const std::string base = R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/opt"},
      "offload_param": {"device": "nvme", "nvme_path": "/params")";
  const Config defaults = ParseConfig(base + "}}}").value();
  CHECK(defaults.zero.offload_param);
  CHECK(defaults.zero.offload_param_nvme_path == "/params");
  CHECK(defaults.zero.offload_param_buffer_count == 5);  // DeepSpeed's defaults
  CHECK(defaults.zero.offload_param_buffer_size == 100'000'000);
  CHECK(defaults.zero.offload_param_max_in_cpu == 1'000'000'000);
  const Config c =
      ParseConfig(base + R"(, "buffer_count": 3, "buffer_size": 4096, "max_in_cpu": 0}}})").value();
  CHECK(c.zero.offload_param_buffer_count == 3);
  CHECK(c.zero.offload_param_buffer_size == 4096);
  CHECK(c.zero.offload_param_max_in_cpu == 0);
  const Config back = ParseConfig(ConfigToJson(c)).value();
  CHECK(back.zero.offload_param);
  CHECK(back.zero.offload_param_nvme_path == "/params");
  CHECK(back.zero.offload_param_buffer_count == 3);
  CHECK(back.zero.offload_param_buffer_size == 4096);
  CHECK(back.zero.offload_param_max_in_cpu == 0);
  // On "cpu" the path is DeepSpeed's to ignore, as for the optimizer.
  const Config cpu = ParseConfig(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "cpu", "nvme_path": "/params"}}})")
                         .value();
  CHECK(cpu.zero.offload_param);
  CHECK(cpu.zero.offload_param_nvme_path.empty());
  CHECK(Error(base + R"(, "buffer_count": 0}}})") ==
        "zero_optimization.offload_param.buffer_count: expected an integer 1..1024, got 0");
  CHECK(Error(base + R"(, "max_in_cpu": -1}}})") ==
        "zero_optimization.offload_param.max_in_cpu: expected an integer >= 0, got -1");
  CHECK(Error(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/opt", "overlap_step": true},
      "offload_param": {"device": "nvme", "nvme_path": "/params"}}})") ==
        "zero_optimization.offload_optimizer.overlap_step: not supported with offload_param on "
        "\"nvme\" (the update thread would write the parameters' file while backward reads it)");
  CHECK(Error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})") ==
        "zero_optimization.offload_optimizer: expected stage 1, 2 or 3 with it, got stage 0");
  CHECK(Error(R"({"zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "cpu", "ratio": 2}}})") ==
        "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got 2");
}

TEST_CASE("the overlapped CPU update and its thread budget: keys, round trip, refusals",
          "[config]") {
  const Config c = ParseConfig(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "overlap_step": true, "cpu_threads": 6,
                            "bind_cores": true}}})")
                       .value();
  CHECK(c.zero.offload_overlap_step);
  CHECK(c.zero.offload_cpu_threads == 6);
  CHECK(c.zero.offload_bind_cores);
  const Config back = ParseConfig(ConfigToJson(c)).value();
  CHECK(back.zero.offload_overlap_step);
  CHECK(back.zero.offload_cpu_threads == 6);
  CHECK(back.zero.offload_bind_cores);
  const Config plain = ParseConfig(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu"}}})")
                           .value();
  CHECK_FALSE(plain.zero.offload_overlap_step);
  CHECK(plain.zero.offload_cpu_threads == 0);
  CHECK_FALSE(plain.zero.offload_bind_cores);
  CHECK(Error(R"({"zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "cpu", "overlap_step": true}}})") ==
        "zero_optimization.offload_optimizer.overlap_step: expected stage 2 or 3 with it (the "
        "update starts as gradients are reduced in backward), got stage 1");
  const Config nvme = ParseConfig(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
      {"device": "nvme", "nvme_path": "/local_nvme", "overlap_step": true, "buffer_count": 6}}})")
                          .value();
  CHECK(nvme.zero.offload_overlap_step);
  CHECK(nvme.zero.offload_buffer_count == 6);
  CHECK(ParseConfig(ConfigToJson(nvme)).value().zero.offload_buffer_count == 6);
  CHECK(Error(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "buffer_count": 0}}})") ==
        "zero_optimization.offload_optimizer.buffer_count: expected an integer 1..1024, got 0");
  // Binding without a thread count binds the threads in force (the
  // engine's budget on cuda, MEMWALL_CPU_THREADS or 1 otherwise).
  const Config bound = ParseConfig(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "bind_cores": true}}})")
                           .value();
  CHECK(bound.zero.offload_bind_cores);
  CHECK(bound.zero.offload_cpu_threads == 0);
  CHECK(Error(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "cpu_threads": -1}}})") ==
        "zero_optimization.offload_optimizer.cpu_threads: expected an integer 0..4096, got -1");
}

TEST_CASE("DeepSpeed's aio block: keys, defaults, round trip, refusals", "[config]") {
  const Config defaults = ParseConfig("{}").value();
  CHECK(defaults.aio.block_size == 1048576);
  CHECK(defaults.aio.queue_depth == 8);
  CHECK(defaults.aio.thread_count == 1);
  CHECK_FALSE(defaults.aio.single_submit);
  CHECK(defaults.aio.overlap_events);
  CHECK_THAT(ConfigToJson(defaults), !Catch::Contains("\"aio\""));  // defaults go unsaid
  const Config c = ParseConfig(R"({"aio": {"block_size": 262144, "queue_depth": 32,
      "thread_count": 2, "single_submit": true, "overlap_events": false}})")
                       .value();
  const Config back = ParseConfig(ConfigToJson(c)).value();
  CHECK(back.aio.block_size == 262144);
  CHECK(back.aio.queue_depth == 32);
  CHECK(back.aio.thread_count == 2);
  CHECK(back.aio.single_submit);
  CHECK_FALSE(back.aio.overlap_events);
  CHECK(Error(R"({"aio": {"block_size": 1000}})") ==
        "aio.block_size: expected an integer 4096..1073741824, got 1000");
  CHECK(Error(R"({"aio": {"block_size": 5000}})") ==
        "aio.block_size: expected a multiple of 4096 bytes, got 5000");
  CHECK(Error(R"({"aio": {"queue_depth": 0}})") ==
        "aio.queue_depth: expected an integer 1..1024, got 0");
  CHECK_THAT(Error(R"({"aio": {"intra_op_parallelism": 2}})"),
             Catch::StartsWith("aio.intra_op_parallelism: unknown key"));
}

TEST_CASE("config files: errors name the file", "[config]") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/memwall_config_test.json";
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 2}})";
  }
  auto good = LoadConfig(path);
  REQUIRE(good.ok());
  CHECK(good->zero.stage == 2);
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": -1}})";
  }
  auto bad = LoadConfig(path);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) ==
        "config file " + path + ": zero_optimization.stage: expected an integer 0..3, got -1");
  auto missing = LoadConfig(path + ".nope");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()) ==
        "config file " + path + ".nope: cannot be opened");
  std::remove(path.c_str());
}

TEST_CASE("ConfigToJson writes every key, and parses back to the same config", "[config]") {
  const Config c = ParseConfig(R"({
    "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.7, "communication_data_type": "bf16",
    "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                             "weight_decay": 0.1, "adam_w_mode": false}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 0.25},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1234567, "overlap_comm": true,
                          "allgather_bucket_size": 7654321,
                          "stage3_prefetch_bucket_size": 4e6, "stage3_max_live_parameters": 9e8,
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/scratch",
                                                "ratio": 0.3}},
    "activation_checkpointing": {"number_checkpoints": 4, "budget_bytes": 1000,
                                 "resolution": 64, "selective": false, "offload": true,
                                 "offload_flops_per_byte": 100}
  })").value();
  const std::string json = ConfigToJson(c);
  const Config back = ParseConfig(json).value();
  CHECK(ConfigToJson(back) == json);
  CHECK(back.train_micro_batch_size_per_gpu == 3);
  CHECK(back.gradient_accumulation_steps == 4);
  CHECK(back.gradient_clipping == 0.7f);
  CHECK(back.reduce_dtype == DType::kBF16);
  CHECK(back.optimizer.lr == 3e-4f);
  CHECK(back.optimizer.beta1 == 0.8f);
  CHECK(back.optimizer.beta2 == 0.95f);
  CHECK(back.optimizer.eps == 1e-6f);
  CHECK(back.optimizer.weight_decay == 0.1f);
  CHECK_FALSE(back.optimizer.adamw);
  CHECK(back.fp16);
  CHECK(back.loss_scale.initial_scale_power == 12);
  CHECK(back.loss_scale.loss_scale_window == 500);
  CHECK(back.loss_scale.hysteresis == 3);
  CHECK(back.loss_scale.min_loss_scale == 0.25f);
  CHECK(back.zero.stage == 3);
  CHECK(back.zero.reduce_bucket_size == 1234567);
  CHECK(back.zero.allgather_bucket_size == 7654321);
  CHECK(back.zero.overlap_comm);
  CHECK(back.zero.stage3_prefetch_bucket_size == 4000000);
  CHECK(back.zero.stage3_max_live_parameters == 900000000);
  CHECK(back.zero.offload_optimizer_ratio == 0.3f);
  CHECK(back.zero.offload_nvme_path == "/scratch");
  CHECK(back.activation_checkpointing.number_checkpoints == 4);
  CHECK(back.activation_checkpointing.budget_bytes == 1000);
  CHECK(back.activation_checkpointing.resolution == 64);
  CHECK_FALSE(back.activation_checkpointing.selective);
  CHECK(back.activation_checkpointing.offload);
  CHECK(back.activation_checkpointing.offload_flops_per_byte == 100.0f);
  // The shortest decimals that read back to the same floats.
  CHECK_THAT(json, Catch::Contains("\"lr\": 0.0003") && Catch::Contains("\"ratio\": 0.3"));

  Config automatic;
  automatic.zero.stage = kAutoStage;
  automatic.optimizer.type = OptimizerType::kSgd;
  automatic.optimizer.momentum = 0.9f;
  automatic.zero.offload_optimizer_ratio = 1.0f;
  const Config sgd = ParseConfig(ConfigToJson(automatic)).value();
  CHECK(sgd.zero.stage == kAutoStage);
  CHECK(sgd.optimizer.type == OptimizerType::kSgd);
  CHECK(sgd.optimizer.momentum == 0.9f);
  CHECK(sgd.zero.offload_optimizer_ratio == 1.0f);
  CHECK(sgd.zero.offload_nvme_path.empty());
}

TEST_CASE("scheduler: DeepSpeed's warm-up schedules, round-tripped, bad ones named",
          "[config][scheduler]") {
  const Config cosine = ParseConfig(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 5000, "warmup_num_steps": 100, "warmup_type": "linear",
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}}})").value();
  CHECK(cosine.schedule.type == LrSchedule::Type::kWarmupCosineLR);
  CHECK(cosine.schedule.total_num_steps == 5000);
  CHECK(cosine.schedule.warmup_num_steps == 100);
  CHECK(cosine.schedule.warmup_linear);
  CHECK(cosine.schedule.warmup_min_ratio == 0.1f);
  CHECK(cosine.schedule.cos_min_ratio == 0.01f);
  const Config warmup = ParseConfig(R"({"scheduler": {"type": "WarmupLR"}})").value();
  CHECK(warmup.schedule.type == LrSchedule::Type::kWarmupLR);
  CHECK(warmup.schedule.warmup_num_steps == 1000);  // DeepSpeed's defaults
  CHECK_FALSE(warmup.schedule.warmup_linear);
  CHECK(warmup.schedule.warmup_max_lr == 1e-3f);
  for (const Config& c : {cosine, warmup}) {
    const std::string json = ConfigToJson(c);
    CHECK(ConfigToJson(ParseConfig(json).value()) == json);
  }
  CHECK_THAT(ConfigToJson(cosine), Catch::Contains("\"type\": \"WarmupCosineLR\""));
  CHECK(ConfigToJson(Config()).find("scheduler") == std::string::npos);

  CHECK(Error(R"({"scheduler": {"type": "OneCycle"}})") ==
        "scheduler.type: expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
        "got \"OneCycle\"");
  CHECK(Error(R"({"scheduler": {"params": {}}})") ==
        "scheduler.type: expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
        "got nothing");
  CHECK(Error(R"({"scheduler": {"type": "WarmupDecayLR"}})") ==
        "scheduler.params.total_num_steps: required by WarmupDecayLR; expected an integer >= 1");
  CHECK(Error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})") ==
        "scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"cubic\"");
  CHECK_THAT(Error(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})"),
             Catch::StartsWith("scheduler.params.cos_min_ratio: unknown key"));
}

TEST_CASE("repeated keys, deep nesting and huge files are refused by name", "[config]") {
  auto twice = ParseConfig(R"({"zero_optimization": {"stage": 1, "overlap_comm": true, "stage": 3}})");
  CHECK(twice.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(twice.status().message()) ==
        "zero_optimization.stage: the key appears twice; expected each key once");
  auto top = ParseConfig(R"({"gradient_clipping": 1, "gradient_clipping": 0})");
  CHECK(std::string(top.status().message()) ==
        "gradient_clipping: the key appears twice; expected each key once");
  // The same key in two objects is two keys.
  CHECK(ParseConfig(R"({"fp16": {"enabled": false}, "bf16": {"enabled": true}})").ok());
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto nested = ParseConfig(deep);
  CHECK(nested.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(nested.status().message()) ==
        "config: nested deeper than 32 levels; expected a DeepSpeed-style config");
  auto zeros = LoadConfig("/dev/zero");
  CHECK(zeros.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(zeros.status().message()) ==
        "config file /dev/zero: larger than 16.00 MiB; expected a config");
}

TEST_CASE("integers are read exactly, up to INT64_MAX and no further", "[config]") {
  auto most = ParseConfig(R"({"train_micro_batch_size_per_gpu": 9223372036854775807})");
  REQUIRE(most.ok());
  CHECK(most->train_micro_batch_size_per_gpu == INT64_MAX);
  auto beyond = ParseConfig(R"({"train_micro_batch_size_per_gpu": 9223372036854775808})");
  CHECK(std::string(beyond.status().message()) ==
        "train_micro_batch_size_per_gpu: expected an integer >= 1, got 9223372036854775808");
  auto rounded = ParseConfig(R"({"train_micro_batch_size_per_gpu": 9.3e18})");
  CHECK(std::string(rounded.status().message()) ==
        "train_micro_batch_size_per_gpu: expected an integer >= 1, got 9.3e+18");
  CHECK(ParseConfig(R"({"zero_optimization": {"reduce_bucket_size": 5e8}})")->zero.reduce_bucket_size ==
        500000000);
}

}  // namespace
}  // namespace memwall
