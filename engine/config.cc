#include "engine/config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/json_reader.h"
#include "runtime/status.h"
#include "runtime/text_file.h"

namespace memwall {
namespace {

using Json = nlohmann::json;

// Objects and arrays nested deeper than this are refused (the deepest key
// memwall reads is at level 3).
constexpr int kMaxConfigDepth = 32;
// Config files larger than this are refused before parsing (bytes; a
// DeepSpeed config is a few KiB).
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

absl::Status ReadOptimizer(const Json& value, OptimizerConfig& out) {
  MW_ASSIGN_OR_RETURN(JsonReader reader, JsonReader::Open(value, "optimizer"));
  std::string type = "Adam";
  MW_RETURN_IF_ERROR(reader.Choice("type", {"Adam", "AdamW", "SGD"}, type));
  out.type = type == "SGD" ? OptimizerType::kSgd : OptimizerType::kAdam;
  if (const Json* params = reader.Find("params")) {
    MW_ASSIGN_OR_RETURN(JsonReader p, JsonReader::Open(*params, "optimizer.params"));
    MW_RETURN_IF_ERROR(p.Float("lr", 0, 1e30, false, "a number >= 0", out.lr));
    MW_RETURN_IF_ERROR(p.Float("eps", 0, 1e30, true, "a number > 0", out.eps));
    MW_RETURN_IF_ERROR(
        p.Float("weight_decay", 0, 1e30, false, "a number >= 0", out.weight_decay));
    if (type == "SGD") {
      MW_RETURN_IF_ERROR(
          p.Float("momentum", 0, 0.9999999, false, "a number in [0, 1)", out.momentum));
    } else {
      if (const Json* betas = p.Find("betas")) {
        const bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() &&
                        (*betas)[1].is_number() && (*betas)[0].get<double>() >= 0 &&
                        (*betas)[0].get<double>() < 1 && (*betas)[1].get<double>() >= 0 &&
                        (*betas)[1].get<double>() < 1;
        if (!ok) return p.Error("betas", "[beta1, beta2] with each in [0, 1)", *betas);
        out.beta1 = (*betas)[0].get<float>();
        out.beta2 = (*betas)[1].get<float>();
      }
      out.adamw = true;
      if (type == "Adam") MW_RETURN_IF_ERROR(p.Bool("adam_w_mode", out.adamw));
    }
    MW_RETURN_IF_ERROR(p.Finish());
  }
  return reader.Finish();
}

absl::Status ReadScheduler(const Json& value, LrSchedule& out) {
  using Type = LrSchedule::Type;
  MW_ASSIGN_OR_RETURN(JsonReader reader, JsonReader::Open(value, "scheduler"));
  std::string type;
  MW_RETURN_IF_ERROR(
      reader.Choice("type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}, type));
  if (type.empty()) {
    return absl::InvalidArgumentError(
        "scheduler.type: expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
        "got nothing");
  }
  out.type = type == "WarmupLR"         ? Type::kWarmupLR
             : type == "WarmupDecayLR" ? Type::kWarmupDecayLR
                                       : Type::kWarmupCosineLR;
  const Json empty = Json::object();
  const Json* params = reader.Find("params");
  MW_ASSIGN_OR_RETURN(JsonReader p,
                      JsonReader::Open(params != nullptr ? *params : empty, "scheduler.params"));
  MW_RETURN_IF_ERROR(p.Int("warmup_num_steps", 0, INT64_MAX, out.warmup_num_steps));
  std::string warmup = "log";
  MW_RETURN_IF_ERROR(p.Choice("warmup_type", {"log", "linear"}, warmup));
  out.warmup_linear = warmup == "linear";
  if (out.type == Type::kWarmupCosineLR) {
    MW_RETURN_IF_ERROR(p.Float("warmup_min_ratio", 0, 1, false, "a number in [0, 1]",
                               out.warmup_min_ratio));
    MW_RETURN_IF_ERROR(
        p.Float("cos_min_ratio", 0, 1, false, "a number in [0, 1]", out.cos_min_ratio));
  } else {
    MW_RETURN_IF_ERROR(p.Float("warmup_min_lr", 0, 1e30, false, "a number >= 0", out.warmup_min_lr));
    MW_RETURN_IF_ERROR(p.Float("warmup_max_lr", 0, 1e30, false, "a number >= 0", out.warmup_max_lr));
  }
  if (out.type != Type::kWarmupLR) {
    if (p.Find("total_num_steps") == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scheduler.params.total_num_steps: required by ", type, "; expected an integer >= 1"));
    }
    MW_RETURN_IF_ERROR(p.Int("total_num_steps", 1, INT64_MAX, out.total_num_steps));
  }
  MW_RETURN_IF_ERROR(p.Finish());
  return reader.Finish();
}

absl::Status ReadFp16(const Json& value, Config& out) {
  MW_ASSIGN_OR_RETURN(JsonReader r, JsonReader::Open(value, "fp16"));
  MW_RETURN_IF_ERROR(r.Bool("enabled", out.fp16));
  LossScaleConfig& s = out.loss_scale;
  MW_RETURN_IF_ERROR(r.Float("loss_scale", 0, 1e30, false, "a number >= 0 (0: dynamic)",
                             s.static_scale));
  MW_RETURN_IF_ERROR(r.Int32("initial_scale_power", 0, 64, s.initial_scale_power));
  MW_RETURN_IF_ERROR(r.Int32("loss_scale_window", 1, INT32_MAX, s.loss_scale_window));
  MW_RETURN_IF_ERROR(r.Int32("hysteresis", 1, INT32_MAX, s.hysteresis));
  MW_RETURN_IF_ERROR(
      r.Float("min_loss_scale", 0, 1e30, true, "a number > 0", s.min_loss_scale));
  // A scale whose reciprocal is not a finite f32 cannot be divided out of
  // the gradients: every step would overflow.
  for (const auto& [key, value, zero_ok] :
       {std::tuple<const char*, float, bool>{"loss_scale", s.static_scale, true},
        {"min_loss_scale", s.min_loss_scale, false}}) {
    if (!(zero_ok && value == 0) && value < std::numeric_limits<float>::min()) {
      return r.Error(key,
                     absl::StrCat(zero_ok ? "0 (dynamic) or " : "",
                                  "a number >= 1.17549435e-38 (whose reciprocal is a finite f32)"),
                     *r.Find(key));
    }
  }
  return r.Finish();
}

// A DeepSpeed setting memwall has no counterpart for (Config::not_applied):
// with `always` null, a knob of DeepSpeed's own, read and listed; else the
// value memwall always runs as, and why.
struct DeepSpeedOnly {
  const char* key;
  const char* always;
};

absl::Status ReadDeepSpeedOnly(JsonReader& r, std::initializer_list<DeepSpeedOnly> settings,
                               std::vector<std::string>& not_applied) {
  for (const DeepSpeedOnly& s : settings) {
    const Json* v = r.Find(s.key);
    if (v == nullptr) continue;
    if (s.always == nullptr) {
      not_applied.push_back(r.Path(s.key));
    } else if (!v->is_boolean() || !v->get<bool>()) {
      return r.Error(s.key, absl::StrCat("true (", s.always, ")"), *v);
    }
  }
  return absl::OkStatus();
}

absl::Status ReadZero(const Json& value, ZeroConfig& out, std::vector<std::string>& not_applied) {
  MW_ASSIGN_OR_RETURN(JsonReader r, JsonReader::Open(value, "zero_optimization"));
  const Json* stage = r.Find("stage");
  if (stage != nullptr && stage->is_string()) {
    if (stage->get<std::string>() != "auto") {
      return r.Error("stage", "an integer 0..3 or \"auto\"", *stage);
    }
    out.stage = kAutoStage;
  } else {
    MW_RETURN_IF_ERROR(r.Int32("stage", 0, 3, out.stage));
  }
  MW_RETURN_IF_ERROR(r.Int("reduce_bucket_size", 1, INT64_MAX, out.reduce_bucket_size));
  MW_RETURN_IF_ERROR(r.Int("allgather_bucket_size", 1, INT64_MAX, out.allgather_bucket_size));
  MW_RETURN_IF_ERROR(r.Bool("overlap_comm", out.overlap_comm));
  MW_RETURN_IF_ERROR(
      r.Int("stage3_prefetch_bucket_size", 0, INT64_MAX, out.stage3_prefetch_bucket_size));
  MW_RETURN_IF_ERROR(
      r.Int("stage3_max_live_parameters", 0, INT64_MAX, out.stage3_max_live_parameters));
  MW_RETURN_IF_ERROR(r.Bool("stage3_gather_on_use", out.stage3_gather_on_use));
  MW_RETURN_IF_ERROR(r.Bool("zero_quantized_weights", out.quantized_weights));
  const bool block_given = r.Find("zero_quantization_block_size") != nullptr;
  MW_RETURN_IF_ERROR(
      r.Int("zero_quantization_block_size", 1, INT32_MAX, out.quantization_block_size));
  MW_RETURN_IF_ERROR(r.Int("zero_hpz_partition_size", 1, INT32_MAX, out.hpz_partition_size));
  MW_RETURN_IF_ERROR(r.Bool("zero_quantized_gradients", out.quantized_gradients));
  MW_RETURN_IF_ERROR(r.Int("mics_shard_size", -1, INT32_MAX, out.mics_shard_size));
  if (const Json* v = r.Find("offload_optimizer")) {
    MW_ASSIGN_OR_RETURN(JsonReader o,
                        JsonReader::Open(*v, "zero_optimization.offload_optimizer"));
    std::string device = "none";
    MW_RETURN_IF_ERROR(o.Choice("device", {"none", "cpu", "nvme"}, device));
    float ratio = 1.0f;
    MW_RETURN_IF_ERROR(o.Float("ratio", 0, 1, false, "a number in [0, 1]", ratio));
    out.offload_optimizer_ratio = device == "none" ? 0.0f : ratio;
    if (const Json* path = o.Find("nvme_path")) {
      if (!path->is_string() || path->get<std::string>().empty()) {
        return o.Error("nvme_path", "a directory path", *path);
      }
      out.offload_nvme_path = path->get<std::string>();
    }
    if (device == "nvme" && out.offload_nvme_path.empty()) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_optimizer.nvme_path: expected a directory with device "
          "\"nvme\", got none");
    }
    if (device != "nvme") out.offload_nvme_path.clear();
    bool pin = true;
    MW_RETURN_IF_ERROR(o.Bool("pin_memory", pin));  // memwall always pins
    MW_RETURN_IF_ERROR(o.Int32("buffer_count", 1, 1024, out.offload_buffer_count));
    MW_RETURN_IF_ERROR(o.Bool("overlap_step", out.offload_overlap_step));
    int64_t threads = 0;
    MW_RETURN_IF_ERROR(o.Int("cpu_threads", 0, 4096, threads));
    out.offload_cpu_threads = static_cast<int>(threads);
    MW_RETURN_IF_ERROR(o.Bool("bind_cores", out.offload_bind_cores));
    MW_RETURN_IF_ERROR(o.Finish());
  }
  if (const Json* v = r.Find("offload_param")) {
    MW_ASSIGN_OR_RETURN(JsonReader o, JsonReader::Open(*v, "zero_optimization.offload_param"));
    std::string device = "none";
    MW_RETURN_IF_ERROR(o.Choice("device", {"none", "cpu", "nvme"}, device));
    out.offload_param = device != "none";
    if (const Json* path = o.Find("nvme_path")) {
      if (!path->is_string() || path->get<std::string>().empty()) {
        return o.Error("nvme_path", "a directory path", *path);
      }
      if (device == "nvme") out.offload_param_nvme_path = path->get<std::string>();
    }
    if (device == "nvme" && out.offload_param_nvme_path.empty()) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_param.nvme_path: expected a directory with device "
          "\"nvme\", got none");
    }
    bool pin = true;
    MW_RETURN_IF_ERROR(o.Bool("pin_memory", pin));
    MW_RETURN_IF_ERROR(o.Int32("buffer_count", 1, 1024, out.offload_param_buffer_count));
    MW_RETURN_IF_ERROR(o.Int("buffer_size", 1, INT64_MAX, out.offload_param_buffer_size));
    MW_RETURN_IF_ERROR(o.Int("max_in_cpu", 0, INT64_MAX, out.offload_param_max_in_cpu));
    MW_RETURN_IF_ERROR(o.Finish());
  }
  MW_RETURN_IF_ERROR(ReadDeepSpeedOnly(
      r,
      {{"sub_group_size", nullptr},
       {"stage3_param_persistence_threshold", nullptr},
       {"stage3_max_reuse_distance", nullptr},
       {"contiguous_gradients", "memwall's gradients always lie in contiguous flat buckets"},
       {"allgather_partitions", "memwall gathers parameters with all-gather"},
       {"reduce_scatter", "memwall reduces sharded gradients with reduce-scatter"},
       {"stage3_gather_16bit_weights_on_model_save",
        "memwall's saves gather the weights or keep the master weights whole"}},
      not_applied));
  MW_RETURN_IF_ERROR(CheckZeroConfig(out));
  // A config asking for stage 3's gathers at another stage says something
  // it does not mean (the trainer gathers nothing on use below stage 3).
  if (out.stage3_gather_on_use && out.stage != 3 && out.stage != kAutoStage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.stage3_gather_on_use: expected stage 3 with it, got stage ", out.stage));
  }
  if (out.hpz_partition_size > 1 && out.stage != 3 && out.stage != kAutoStage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.zero_hpz_partition_size: expected 1 below stage 3 (it partitions "
        "stage 3's gathered parameters), got ", out.hpz_partition_size, " at stage ", out.stage));
  }
  if (out.quantized_gradients && out.stage != 3 && out.stage != kAutoStage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.zero_quantized_gradients: expected stage 3 with it (it quantizes "
        "stage 3's gradient reduce-scatters across nodes), got stage ", out.stage));
  }
  if (block_given && !out.quantized_weights && !out.quantized_gradients) {
    return absl::InvalidArgumentError(
        "zero_optimization.zero_quantization_block_size: sizes the blocks of "
        "zero_quantized_weights or zero_quantized_gradients, and neither is true");
  }
  if (out.quantized_weights && out.stage != 3 && out.stage != kAutoStage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.zero_quantized_weights: expected stage 3 with it (it quantizes "
        "stage 3's parameter gathers), got stage ", out.stage));
  }
  return r.Finish();
}

absl::Status ReadAio(const Json& value, AioConfig& out) {
  MW_ASSIGN_OR_RETURN(JsonReader r, JsonReader::Open(value, "aio"));
  MW_RETURN_IF_ERROR(r.Int("block_size", 4096, int64_t{1} << 30, out.block_size));
  if (out.block_size % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aio.block_size: expected a multiple of 4096 bytes, got ", out.block_size));
  }
  MW_RETURN_IF_ERROR(r.Int32("queue_depth", 1, 1024, out.queue_depth));
  MW_RETURN_IF_ERROR(r.Int32("thread_count", 1, 64, out.thread_count));
  MW_RETURN_IF_ERROR(r.Bool("single_submit", out.single_submit));
  MW_RETURN_IF_ERROR(r.Bool("overlap_events", out.overlap_events));
  return r.Finish();
}

absl::Status ReadRecompute(const Json& value, RecomputeConfig& out,
                           std::vector<std::string>& not_applied) {
  MW_ASSIGN_OR_RETURN(JsonReader r, JsonReader::Open(value, "activation_checkpointing"));
  if (const Json* v = r.Find("planner")) {
    const std::string expected =
        "one of \"none\", \"full\", \"uniform:K\" (K >= 1), \"sqrt\", \"selective\", "
        "\"optimal\"";
    if (!v->is_string()) return r.Error("planner", expected, *v);
    const std::string name = v->get<std::string>();
    int k = 0;
    const bool uniform = absl::StartsWith(name, "uniform:") &&
                         absl::SimpleAtoi(absl::string_view(name).substr(8), &k) && k >= 1;
    if (!uniform && name != "none" && name != "full" && name != "sqrt" && name != "selective" &&
        name != "optimal") {
      return r.Error("planner", expected, *v);
    }
    out.planner = name;
  }
  MW_RETURN_IF_ERROR(r.Int("budget_bytes", 0, INT64_MAX, out.budget_bytes));
  MW_RETURN_IF_ERROR(r.Int32("resolution", 0, 1000000, out.resolution));
  MW_RETURN_IF_ERROR(r.Bool("selective", out.selective));
  MW_RETURN_IF_ERROR(r.Int("number_checkpoints", 1, INT64_MAX, out.number_checkpoints));
  if (out.number_checkpoints > 0 && r.Find("planner") != nullptr) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.number_checkpoints: expected no planner with it (it asks for "
        "uniform segments), got planner \"" + out.planner + "\"");
  }
  bool partition = false, cpu = false, ignored = false;
  MW_RETURN_IF_ERROR(r.Bool("partition_activations", partition));
  if (partition) {
    return r.Error("partition_activations",
                   "false (memwall has no tensor parallelism to partition activations across)",
                   true);
  }
  MW_RETURN_IF_ERROR(r.Bool("offload", out.offload));
  MW_RETURN_IF_ERROR(r.Bool("cpu_checkpointing", cpu));
  if (cpu) out.offload = true;
  MW_RETURN_IF_ERROR(r.Float("offload_flops_per_byte", 0, 1e30, true, "a number > 0",
                             out.offload_flops_per_byte));
  // DeepSpeed's own (its buffers, its synchronisation, its timers).
  for (const char* key : {"contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                          "profile"}) {
    MW_RETURN_IF_ERROR(r.Bool(key, ignored));
    if (r.Find(key) != nullptr) not_applied.push_back(r.Path(key));
  }
  return r.Finish();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view json_text) {
  Json root;
  // JSON lets a key repeat and nlohmann keeps the last value; a config
  // whose "stage" appears twice means two things, so it is refused. The
  // callback sees each object's keys in order: one set of keys seen per
  // open object, and the path of keys that leads to it.
  std::vector<std::set<std::string>> seen;
  std::vector<std::string> path;
  std::string duplicate;
  bool too_deep = false;
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    // Nothing deeper is kept: no config needs it, and destroying a value
    // nested 100,000 deep would recurse off the stack.
    if (depth > kMaxConfigDepth) {
      too_deep = true;
      return false;
    }
    switch (event) {
      case Json::parse_event_t::object_start:
        seen.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        seen.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        path.resize(std::max(depth - 1, 0));
        path.push_back(key);
        if (!seen.empty() && !seen.back().insert(key).second && duplicate.empty()) {
          duplicate = absl::StrJoin(path, ".");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    root = Json::parse(json_text.begin(), json_text.end(), check);
  } catch (const Json::exception& e) {  // parse errors, and numbers out of range
    return absl::InvalidArgumentError(absl::StrCat("config: not valid JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: nested deeper than ", kMaxConfigDepth, " levels; expected a DeepSpeed-style config"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(duplicate, ": the key appears twice; expected each key once"));
  }
  MW_ASSIGN_OR_RETURN(JsonReader r, JsonReader::Open(root, ""));
  Config config;
  MW_RETURN_IF_ERROR(r.Int("train_micro_batch_size_per_gpu", 1, INT64_MAX,
                           config.train_micro_batch_size_per_gpu));
  MW_RETURN_IF_ERROR(
      r.Int32("gradient_accumulation_steps", 1, INT32_MAX, config.gradient_accumulation_steps));
  MW_RETURN_IF_ERROR(r.Float("gradient_clipping", 0, 1e30, false, "a number >= 0 (0: off)",
                             config.gradient_clipping));
  std::string comm = "fp32";
  MW_RETURN_IF_ERROR(r.Choice("communication_data_type", {"fp32", "fp16", "bf16"}, comm));
  config.reduce_dtype = comm == "fp16" ? DType::kF16 : (comm == "bf16" ? DType::kBF16 : DType::kF32);
  if (const Json* v = r.Find("optimizer")) MW_RETURN_IF_ERROR(ReadOptimizer(*v, config.optimizer));
  if (const Json* v = r.Find("scheduler")) MW_RETURN_IF_ERROR(ReadScheduler(*v, config.schedule));
  if (const Json* v = r.Find("fp16")) MW_RETURN_IF_ERROR(ReadFp16(*v, config));
  if (const Json* v = r.Find("bf16")) {
    MW_ASSIGN_OR_RETURN(JsonReader b, JsonReader::Open(*v, "bf16"));
    MW_RETURN_IF_ERROR(b.Bool("enabled", config.bf16));
    MW_RETURN_IF_ERROR(b.Finish());
  }
  if (const Json* v = r.Find("zero_optimization")) {
    MW_RETURN_IF_ERROR(ReadZero(*v, config.zero, config.not_applied));
  }
  if (const Json* v = r.Find("activation_checkpointing")) {
    MW_RETURN_IF_ERROR(ReadRecompute(*v, config.activation_checkpointing, config.not_applied));
  }
  if (const Json* v = r.Find("aio")) MW_RETURN_IF_ERROR(ReadAio(*v, config.aio));
  MW_RETURN_IF_ERROR(r.Int("train_batch_size", 1, INT64_MAX, config.train_batch_size));
  MW_RETURN_IF_ERROR(r.Int("ranks_per_node", 1, INT32_MAX, config.ranks_per_node));
  MW_RETURN_IF_ERROR(ReadDeepSpeedOnly(r,
                                       {{"steps_per_print", nullptr},
                                        {"wall_clock_breakdown", nullptr},
                                        {"zero_allow_untested_optimizer", nullptr}},
                                       config.not_applied));
  MW_RETURN_IF_ERROR(r.Finish());
  if (config.fp16 && config.bf16) {
    return absl::InvalidArgumentError(
        "fp16.enabled and bf16.enabled: expected at most one of them, got both true");
  }
  return config;
}

absl::Status CheckTrainBatchSize(const Config& config, int64_t ranks) {
  const int64_t global =
      config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * ranks;
  if (config.train_batch_size == 0 || config.train_batch_size == global) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "train_batch_size: expected train_micro_batch_size_per_gpu x gradient_accumulation_steps "
      "x ranks = ",
      config.train_micro_batch_size_per_gpu, " x ", config.gradient_accumulation_steps, " x ",
      ranks, " = ", global, ", got ", config.train_batch_size));
}

namespace {

// A float as the shortest decimal that reads back to the same float (0.001,
// not 0.0010000000474974513), so a written config parses to the same values.
double Decimal(float x) {
  for (int digits = 6; digits < 9; ++digits) {
    const double d = std::strtod(absl::StrFormat("%.*g", digits, x).c_str(), nullptr);
    if (static_cast<float>(d) == x) return d;
  }
  return x;
}

const char* DTypeKey(DType dtype) {
  return dtype == DType::kF16 ? "fp16" : dtype == DType::kBF16 ? "bf16" : "fp32";
}

}  // namespace

std::string ConfigToJson(const Config& c) {
  Json j;
  j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  if (c.train_batch_size > 0) j["train_batch_size"] = c.train_batch_size;
  if (c.ranks_per_node > 0) j["ranks_per_node"] = c.ranks_per_node;
  j["gradient_clipping"] = Decimal(c.gradient_clipping);
  j["communication_data_type"] = DTypeKey(c.reduce_dtype);
  const OptimizerConfig& o = c.optimizer;
  Json params = {{"lr", Decimal(o.lr)}, {"eps", Decimal(o.eps)},
                 {"weight_decay", Decimal(o.weight_decay)}};
  if (o.type == OptimizerType::kSgd) {
    params["momentum"] = Decimal(o.momentum);
  } else {
    params["betas"] = {Decimal(o.beta1), Decimal(o.beta2)};
    if (!o.adamw) params["adam_w_mode"] = false;
  }
  j["optimizer"] = {
      {"type", o.type == OptimizerType::kSgd ? "SGD" : (o.adamw ? "AdamW" : "Adam")},
      {"params", params}};
  const LrSchedule& schedule = c.schedule;
  if (schedule.type != LrSchedule::Type::kNone) {
    using Type = LrSchedule::Type;
    Json p = {{"warmup_num_steps", schedule.warmup_num_steps},
              {"warmup_type", schedule.warmup_linear ? "linear" : "log"}};
    if (schedule.type == Type::kWarmupCosineLR) {
      p["warmup_min_ratio"] = Decimal(schedule.warmup_min_ratio);
      p["cos_min_ratio"] = Decimal(schedule.cos_min_ratio);
    } else {
      p["warmup_min_lr"] = Decimal(schedule.warmup_min_lr);
      p["warmup_max_lr"] = Decimal(schedule.warmup_max_lr);
    }
    if (schedule.type != Type::kWarmupLR) p["total_num_steps"] = schedule.total_num_steps;
    j["scheduler"] = {{"type", schedule.type == Type::kWarmupLR        ? "WarmupLR"
                               : schedule.type == Type::kWarmupDecayLR ? "WarmupDecayLR"
                                                                       : "WarmupCosineLR"},
                      {"params", p}};
  }
  const LossScaleConfig& s = c.loss_scale;
  j["fp16"] = {{"enabled", c.fp16},
               {"loss_scale", Decimal(s.static_scale)},
               {"initial_scale_power", s.initial_scale_power},
               {"loss_scale_window", s.loss_scale_window},
               {"hysteresis", s.hysteresis},
               {"min_loss_scale", Decimal(s.min_loss_scale)}};
  j["bf16"] = {{"enabled", c.bf16}};
  const ZeroConfig& z = c.zero;
  Json zero = {{"stage", z.stage == kAutoStage ? Json("auto") : Json(z.stage)},
               {"reduce_bucket_size", z.reduce_bucket_size},
               {"allgather_bucket_size", z.allgather_bucket_size},
               {"overlap_comm", z.overlap_comm},
               {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
               {"stage3_max_live_parameters", z.stage3_max_live_parameters}};
  if (z.stage3_gather_on_use) zero["stage3_gather_on_use"] = true;
  if (z.quantized_weights) zero["zero_quantized_weights"] = true;
  if (z.hpz_partition_size > 1) zero["zero_hpz_partition_size"] = z.hpz_partition_size;
  if (z.quantized_gradients) zero["zero_quantized_gradients"] = true;
  if (z.mics_shard_size > 0) zero["mics_shard_size"] = z.mics_shard_size;
  if (z.quantization_block_size != ZeroConfig().quantization_block_size) {
    zero["zero_quantization_block_size"] = z.quantization_block_size;
  }
  if (z.offload_optimizer_ratio > 0) {
    zero["offload_optimizer"] = {{"device", z.offload_nvme_path.empty() ? "cpu" : "nvme"},
                                 {"ratio", Decimal(z.offload_optimizer_ratio)}};
    if (!z.offload_nvme_path.empty()) zero["offload_optimizer"]["nvme_path"] = z.offload_nvme_path;
    if (z.offload_buffer_count != ZeroConfig().offload_buffer_count) {
      zero["offload_optimizer"]["buffer_count"] = z.offload_buffer_count;
    }
    if (z.offload_overlap_step) zero["offload_optimizer"]["overlap_step"] = true;
    if (z.offload_cpu_threads > 0) zero["offload_optimizer"]["cpu_threads"] = z.offload_cpu_threads;
    if (z.offload_bind_cores) zero["offload_optimizer"]["bind_cores"] = true;
  }
  if (z.offload_param && z.offload_param_nvme_path.empty()) {
    zero["offload_param"] = {{"device", "cpu"}};
  } else if (z.offload_param) {
    const ZeroConfig defaults;
    zero["offload_param"] = {{"device", "nvme"}, {"nvme_path", z.offload_param_nvme_path}};
    if (z.offload_param_buffer_count != defaults.offload_param_buffer_count) {
      zero["offload_param"]["buffer_count"] = z.offload_param_buffer_count;
    }
    if (z.offload_param_buffer_size != defaults.offload_param_buffer_size) {
      zero["offload_param"]["buffer_size"] = z.offload_param_buffer_size;
    }
    if (z.offload_param_max_in_cpu != defaults.offload_param_max_in_cpu) {
      zero["offload_param"]["max_in_cpu"] = z.offload_param_max_in_cpu;
    }
  }
  j["zero_optimization"] = zero;
  const AioConfig aio_defaults;
  const AioConfig& aio = c.aio;
  if (aio.block_size != aio_defaults.block_size || aio.queue_depth != aio_defaults.queue_depth ||
      aio.thread_count != aio_defaults.thread_count ||
      aio.single_submit != aio_defaults.single_submit ||
      aio.overlap_events != aio_defaults.overlap_events) {
    j["aio"] = {{"block_size", aio.block_size},
                {"queue_depth", aio.queue_depth},
                {"thread_count", aio.thread_count},
                {"single_submit", aio.single_submit},
                {"overlap_events", aio.overlap_events}};
  }
  const RecomputeConfig& r = c.activation_checkpointing;
  // number_checkpoints and planner exclude each other: number_checkpoints
  // stands for its uniform planner.
  Json recompute = {{"budget_bytes", r.budget_bytes},
                    {"resolution", r.resolution},
                    {"selective", r.selective},
                    {"offload", r.offload},
                    {"offload_flops_per_byte", Decimal(r.offload_flops_per_byte)}};
  if (r.number_checkpoints > 0) {
    recompute["number_checkpoints"] = r.number_checkpoints;
  } else {
    recompute["planner"] = r.planner;
  }
  j["activation_checkpointing"] = recompute;
  return j.dump(2);
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  MW_ASSIGN_OR_RETURN(const std::string text, ReadTextFile("config file", path, kMaxConfigBytes, "a config"));
  absl::StatusOr<Config> config = ParseConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("config file ", path, ": ", config.status().message()));
  }
  return config;
}

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

}  // namespace memwall
