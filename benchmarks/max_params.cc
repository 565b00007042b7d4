// The largest GPT-family model one 32 GB GPU can train, by strategy: a
// binary search over the shape rule's sizes (models/gpt.h
// GptShapeForParameters: hidden a multiple of 128, layers = heads =
// hidden / 128, vocabulary 50257), seq 1024, at micro-batch 1 and 8, each
// candidate dry-run as one whole step on meta by `memwall plan`'s engine
// (engine/dry_run.h DryRun: device memory counted with allocator rounding and
// a 1 GiB CUDA runtime allowance; pinned host memory and NVMe as the step
// uses them).
//
//   bazel run //benchmarks:max_params [-- TEXT]   (only the rows whose name holds TEXT)
//
// Beside each row: how close micro-batch 1 comes to the physical bound the
// row's memory allows for model states alone (see Bound()), what stops the
// next size up (the plan's "fits: no (...)" reason), and the published
// figure where one exists.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/config.h"
#include "engine/dry_run.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

struct Row {
  std::string name;
  int gpus;
  int stage;
  float offload;  // optimizer offload ratio
  bool paging;
  bool nvme;
  std::string planner;
  bool activation_offload;
  int64_t host_bytes;  // per GPU
  std::string published;
  bool nvme_params = false;              // the parameter shards on NVMe too
  int64_t nvme_bytes = 4 * 1024 * kGiB;  // per GPU, with nvme
};

// Tiled as `memwall plan --auto` tiles (models/spec.h WithTiles): the
// blocks' weights and the tied embedding and LM head in `tiles` tiles.
std::string Spec(int64_t hidden, int64_t tiles = 1) {
  const std::string spec = absl::StrCat("gpt:layers=", hidden / 128, ",hidden=", hidden,
                                        ",heads=", hidden / 128, ",seq=1024");
  return tiles > 1 ? WithTiles(spec, tiles).value() : spec;
}

// The tile counts a row with parameters on NVMe tries (memory-centric
// tiling: the fewest that fit).
constexpr int64_t kTiles[] = {1, 2, 4, 8, 16};

int64_t Parameters(int64_t hidden) {
  GptConfig c = GptShapeForParameters(1e9);
  c.hidden = hidden;
  c.heads = c.layers = hidden / 128;
  c.seq = 1024;
  return GptParameterCount(c);
}

absl::StatusOr<DryRunResult> Try(const Row& row, int64_t batch, int64_t hidden, int64_t tiles = 1) {
  Config config;
  config.bf16 = true;
  config.optimizer.adamw = true;
  config.train_micro_batch_size_per_gpu = batch;
  config.zero.stage = row.stage;
  config.zero.overlap_comm = row.stage > 0;
  config.zero.reduce_bucket_size = 50'000'000;
  config.zero.stage3_prefetch_bucket_size = 50'000'000;
  config.zero.offload_optimizer_ratio = row.offload;
  config.zero.offload_param = row.paging;
  config.zero.offload_nvme_path = row.nvme ? "/local_nvme" : "";
  if (row.nvme_params) {
    config.zero.offload_param_nvme_path = "/local_nvme";
    config.zero.offload_param_max_in_cpu = 0;
    config.zero.offload_param_buffer_size = INT64_MAX;  // a page buffer holds any shard
    // Each block weight gathered for its operation, not the whole block.
    config.zero.stage3_gather_on_use = true;
  }
  config.activation_checkpointing.planner = row.planner;
  config.activation_checkpointing.offload = row.activation_offload;
  DryRunOptions options;
  options.model = SpecModel(Spec(hidden, tiles));
  options.gpus = row.gpus;
  options.device_bytes = 32 * kGiB;
  options.host_bytes = row.host_bytes;
  options.nvme_bytes = row.nvme ? row.nvme_bytes : 0;
  options.batch = batch;
  return DryRun(options, config);
}

// The fewest tiles with which `hidden` fits (rows with parameters on NVMe
// try kTiles; the others untiled); 0 if none.
int64_t TilesThatFit(const Row& row, int64_t batch, int64_t hidden) {
  for (int64_t tiles : kTiles) {
    if (tiles > 1 && !row.nvme_params) break;
    const absl::StatusOr<DryRunResult> r = Try(row, batch, hidden, tiles);
    if (r.ok() && r->fits) return tiles;
  }
  return 0;
}

bool Fits(const Row& row, int64_t batch, int64_t hidden) {
  return TilesThatFit(row, batch, hidden) > 0;
}

// The most hidden (a multiple of 128) that fits, by bisection; 0 if none.
int64_t Largest(const Row& row, int64_t batch) {
  int64_t lo = 0, hi = 1024;  // in units of 128: hidden up to 131072
  if (!Fits(row, batch, 128)) return 0;
  lo = 1;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (Fits(row, batch, 128 * mid) ? lo : hi) = mid;
  }
  return 128 * lo;
}

// What stops the next size up: its plan's "no (...)" reason (with the
// most tiles the row tries).
std::string Binds(const Row& row, int64_t batch, int64_t hidden) {
  const int64_t tiles = row.nvme_params ? kTiles[std::size(kTiles) - 1] : 1;
  const absl::StatusOr<DryRunResult> r = Try(row, batch, hidden + 128, tiles);
  if (!r.ok()) return std::string(r.status().message());
  std::string why = r->fits_text;
  if (absl::StartsWith(why, "no (") && absl::EndsWith(why, ")")) why = why.substr(4, why.size() - 5);
  return why;
}

// What the row's memory allows for model states alone, in parameters: 16
// bytes per parameter (bf16 weights and gradients, f32 master weights and
// Adam moments) split between device, host and disk as the strategy keeps
// them. With the optimizer offloaded at stages 2-3 gradients stream to the
// host (2 bytes there, none on the device); paging moves the bf16 weights
// there too; the NVMe tier keeps the 12 bytes of states twice on disk, and
// with parameters on NVMe their 2 bytes twice as well and the gradients' 2
// once, leaving the host only buffers (no bound).
double Bound(const Row& row) {
  const double device = 32.0 * kGiB, host = double(row.host_bytes), n = row.gpus;
  if (row.nvme) {
    const double disk = double(row.nvme_bytes);
    if (row.nvme_params) return disk / 30.0 * n;
    return std::min(disk / 24.0, host / 4.0) * n;
  }
  if (row.paging) return host / 16.0 * n;
  if (row.offload > 0) {
    const double weights = row.stage == 3 ? 2.0 / n : 2.0;  // device bytes per parameter
    return std::min(device / weights, host / 14.0 * n);
  }
  const double per_device = row.stage == 0   ? 16.0
                            : row.stage == 1 ? 4.0 + 12.0 / n
                            : row.stage == 2 ? 2.0 + 14.0 / n
                                             : 16.0 / n;
  return device / per_device;
}

int Main(const std::string& only) {
  const int64_t tb15 = int64_t{1536} * kGiB;
  std::vector<Row> rows = {
      {"stage 0 (plain data parallel)", 1, 0, 0, false, false, "none", false, 0,
       "1.4B (PyTorch DDP with activations); 2B (16P, states only)"},
      {"stage 0 + optimal recomputation", 1, 0, 0, false, false, "optimal", false, 0, ""},
  };
  for (int n : {1, 8, 64, 1024}) {
    for (int stage = 1; stage <= 3; ++stage) {
      std::string published;
      if (n == 64) published = stage == 1 ? "7.6B" : stage == 2 ? "14.4B" : "128B";
      rows.push_back({absl::StrCat("stage ", stage, ", N=", n), n, stage, 0, false, false, "none",
                      false, 0, published.empty() ? "" : published + " (ZeRO paper, states)"});
    }
    rows.push_back({absl::StrCat("stage 3 + optimal recomputation, N=", n), n, 3, 0, false, false,
                    "optimal", false, 0, ""});
  }
  rows.push_back({"stage 2 + optimizer offload, 1 GPU", 1, 2, 1.0f, false, false, "none", false,
                  tb15, "13B (ZeRO-Offload, one V100)"});
  rows.push_back({"stage 2 + optimizer offload + optimal recomputation, 1 GPU", 1, 2, 1.0f, false,
                  false, "optimal", false, tb15, ""});
  rows.push_back({"stage 3 + optimizer offload + parameter paging, 1 GPU", 1, 3, 1.0f, true, false,
                  "none", false, tb15, ""});
  rows.push_back({"... + optimal recomputation, 1 GPU", 1, 3, 1.0f, true, false, "optimal", false,
                  tb15, "40B+ (ZeRO-3 Offload, 1.5 TB host)"});
  rows.push_back({"... + activation offload, 1 GPU", 1, 3, 1.0f, true, false, "optimal", true,
                  tb15, ""});
  rows.push_back({"stage 3 + NVMe optimizer + paging + recomputation, 1 GPU", 1, 3, 1.0f, true,
                  true, "optimal", false, tb15, ""});
  rows.push_back({"stage 3 + NVMe optimizer + paging + recomputation, 16 GPUs", 16, 3, 1.0f, true,
                  true, "optimal", false, tb15, "1T (ZeRO-Infinity, one 16-GPU node)"});
  // ZeRO-Infinity's node: 16 GPUs sharing 1.5 TB of host memory and about
  // 28 TB of NVMe; here 30 TB, per GPU the node's share.
  const int64_t tb30 = int64_t{30} * 1024 * kGiB;
  rows.push_back(
      {"stage 3 + NVMe optimizer + NVMe parameters, gathered on use, + recomputation, 1 GPU", 1, 3,
       1.0f, true, true, "optimal", false, tb15, "goal 1T (ZeRO-Infinity's node-scale model)", true,
       tb30});
  rows.push_back({"... 16 GPUs, one node's 1.5 TB host and 30 TB NVMe", 16, 3, 1.0f, true, true,
                  "optimal", false, tb15 / 16, "1T (ZeRO-Infinity, one 16-GPU node)", true,
                  tb30 / 16});
  rows.push_back({"... 512 GPUs, 32 such nodes", 512, 3, 1.0f, true, true, "optimal", false,
                  tb15 / 16, "32T (ZeRO-Infinity paper, 512 GPUs)", true, tb30 / 16});
  // As ZeRO-Infinity ran it: activation checkpoints in host memory too.
  rows.push_back({"... 512 GPUs, + activation checkpoints in host memory", 512, 3, 1.0f, true, true,
                  "optimal", true, tb15 / 16, "32T (ZeRO-Infinity paper, 512 GPUs)", true,
                  tb30 / 16});
  std::printf(
      "max_params: the largest GPT (shape rule, seq 1024) one 32 GB GPU trains, bf16 AdamW;\n"
      "host memory per GPU 1.5 TB where offloading, NVMe 4 TB per GPU unless the row says\n"
      "otherwise; dry runs on meta\n\n");
  std::printf("%-60s %10s %10s %8s  %-40s %s\n", "strategy", "mb 1", "mb 8", "of bound",
              "next size up (mb 1) fails on", "published");
  for (const Row& row : rows) {
    if (!absl::StrContains(row.name, only)) continue;
    const int64_t h1 = Largest(row, 1), h8 = Largest(row, 8);
    const double p1 = h1 > 0 ? double(Parameters(h1)) : 0.0;
    const double p8 = h8 > 0 ? double(Parameters(h8)) : 0.0;
    std::string name = row.name;
    if (row.nvme_params && h1 > 0) {
      absl::StrAppend(&name, " [tiles ", TilesThatFit(row, 1, h1), "]");
    }
    std::printf("%-60s %9.2fB %9.2fB %7.0f%%  %-40s %s\n", name.c_str(), p1 / 1e9, p8 / 1e9,
                100.0 * p1 / Bound(row), Binds(row, 1, h1).c_str(), row.published.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc > 1 ? argv[1] : ""); }
