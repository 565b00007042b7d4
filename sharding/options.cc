#include "sharding/options.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memwall {

std::string DescribeZero(const ZeroConfig& zero, absl::string_view unit) {
  auto ranks = [unit](int64_t n) { return absl::StrCat(n, " ", unit, n == 1 ? "" : "s"); };
  std::string described = absl::StrCat("ZeRO stage ", zero.stage);
  if (zero.mics_shard_size > 0) {
    absl::StrAppend(&described, " sharded in groups of ", ranks(zero.mics_shard_size),
                    " (hybrid)");
  }
  std::vector<std::string> zeropp;
  if (zero.quantized_weights) {
    zeropp.push_back(absl::StrCat("int8 weight gathers (qwZ, blocks of ",
                                  zero.quantization_block_size, ")"));
  }
  if (zero.hpz_partition_size > 1) {
    zeropp.push_back(
        absl::StrCat("later gathers in groups of ", ranks(zero.hpz_partition_size), " (hpZ)"));
  }
  if (zero.quantized_gradients) zeropp.push_back("int8 gradients across nodes (qgZ)");
  if (!zeropp.empty()) absl::StrAppend(&described, " with ZeRO++: ", absl::StrJoin(zeropp, ", "));
  return described;
}

absl::Status CheckZeroConfig(const ZeroConfig& z) {
  const float ratio = z.offload_optimizer_ratio;
  if (!(ratio >= 0.0f && ratio <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got ", ratio));
  }
  if (!z.offload_param_nvme_path.empty()) {
    if (!z.offload_param) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_param.nvme_path: expected offload_param with it");
    }
    if (z.offload_nvme_path.empty()) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_param: expected offload_optimizer on \"nvme\" with device "
          "\"nvme\" (a step writes both tiers' files before committing either, so a failed "
          "write leaves both as they were)");
    }
    if (z.offload_overlap_step) {
      return absl::InvalidArgumentError(
          "zero_optimization.offload_optimizer.overlap_step: not supported with "
          "offload_param on \"nvme\" (the update thread would write the parameters' file "
          "while backward reads it)");
    }
  }
  if (z.offload_param_buffer_count < 1 || z.offload_param_buffer_size < 1 ||
      z.offload_param_max_in_cpu < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_param: expected buffer_count >= 1, buffer_size >= 1 and "
        "max_in_cpu >= 0, got ",
        z.offload_param_buffer_count, ", ", z.offload_param_buffer_size, " and ",
        z.offload_param_max_in_cpu));
  }
  if (z.mics_shard_size == 0 || z.mics_shard_size < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.mics_shard_size: expected -1 (shard across all ranks) or the ranks "
        "of a shard group, >= 1, got ", z.mics_shard_size));
  }
  const bool hybrid = z.mics_shard_size > 0;
  if (hybrid && z.hpz_partition_size > 1) {
    return absl::InvalidArgumentError(
        "zero_optimization.mics_shard_size: not with zero_hpz_partition_size (a shard group "
        "gathers inside itself already: make it the node)");
  }
  if (hybrid && z.quantized_gradients) {
    return absl::InvalidArgumentError(
        "zero_optimization.mics_shard_size: not with zero_quantized_gradients (hybrid "
        "sharding reduce-scatters inside the shard group and all-reduces across the groups)");
  }
  if (z.stage == kAutoStage) return absl::OkStatus();
  if (hybrid && z.stage == 0) {
    return absl::InvalidArgumentError(
        "zero_optimization.mics_shard_size: expected stage 1, 2 or 3 with it (it shards the "
        "states inside groups of ranks), got stage 0");
  }
  if (z.offload_overlap_step && (z.stage == 0 || z.stage == 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.overlap_step: expected stage 2 or 3 with it (the "
        "update starts as gradients are reduced in backward), got stage ", z.stage));
  }
  if (ratio > 0 && z.stage == 0) {
    return absl::InvalidArgumentError(
        "zero_optimization.offload_optimizer: expected stage 1, 2 or 3 with it, got stage 0");
  }
  if (z.offload_param && (z.stage != 3 || ratio != 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_param: expected stage 3 and offload_optimizer on \"cpu\" with "
        "ratio 1 with it, got stage ", z.stage, " and ratio ", ratio));
  }
  return absl::OkStatus();
}

}  // namespace memwall
