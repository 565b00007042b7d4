#include "engine/auto_strategy.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "offload/aio_tune.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr double kMfu = 0.4;  // sustained share of peak dense FLOP/s
constexpr double kHbmEfficiency = 0.8;  // sustained share of peak HBM bandwidth
constexpr double kGpuLaunchSeconds = 5e-6;  // a CUDA launch from an eager host loop

}  // namespace

std::vector<std::string> HardwarePresets() {
  return {"v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "this-machine"};
}

namespace {

// Seconds `fn` takes, best of `repeats`.
template <typename Fn>
double Best(int repeats, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count());
  }
  return best;
}

absl::StatusOr<Hardware> MeasureThisMachine() {
  Hardware hw;
  hw.name = "this-machine";
  hw.device_is_cpu = true;
  const int n = 768;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  const double gemm = Best(5, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
  });
  hw.flops = 2.0 * n * n * n / gemm;
  const size_t bytes = size_t{64} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double copy = Best(3, [&] { std::memcpy(to.data(), from.data(), bytes); });
  // Ranks posed as nodes (MEMWALL_RANKS_PER_NODE) share this memory too.
  hw.pcie_bps = hw.interconnect_bps = hw.inter_node_bps = bytes / copy;
  hw.memory_bps = 2.0 * bytes / copy;  // a copy reads and writes each byte
  // One host-backend kernel on one element: dispatch, not arithmetic.
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                      CreateDevice({Backend::kHost, 0, int64_t{8} << 20}));
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream());
  MW_ASSIGN_OR_RETURN(DeviceBuffer one, device->Allocate(4, MemoryCategory::kOther, "probe"));
  const int launches = 2000;
  absl::Status launched = absl::OkStatus();
  const double all = Best(3, [&] {
    for (int i = 0; i < launches && launched.ok(); ++i) {
      launched = kernels::Scale(*device, *stream, one.data(), DType::kF32, 1, 1.0f);
    }
  });
  MW_RETURN_IF_ERROR(launched);
  hw.launch_seconds = all / launches;
  hw.collective_latency = 5e-6;  // shared-memory MPI between ranks on one machine
  const size_t elements = size_t{1} << 22;
  std::vector<float> p(elements, 0.5f), g(elements, 0.01f), m(elements, 0.0f), v(elements, 0.0f);
  kernels::AdamParams adam;
  const kernels::AdamConstants constants = kernels::MakeAdamConstants(adam);
  const double update = Best(3, [&] {
    kernels::cpu::ParallelAdam(kernels::cpu::Kernels(), constants, p.data(), g.data(), DType::kF32,
                               m.data(), v.data(), nullptr, DType::kF32, elements,
                               kernels::cpu::CpuThreads());
  });
  hw.cpu_adam_bps = 28.0 * elements / update;
  // The NVMe tier as a step streams it (offload/aio_tune.h): DeepSpeed's
  // default aio settings, 8 MiB chunks through 4 buffers, each read, then
  // written back; the model's NVMe term divides the bytes read and written.
  const char* tmp = std::getenv("TMPDIR");
  MW_ASSIGN_OR_RETURN(const AioThroughput disk,
                      MeasureAio(tmp ? tmp : "/tmp", AioConfig(), 4, bytes, 1));
  hw.nvme_bps = 2.0 * disk.update_mbps * 1e6;
  return hw;
}

}  // namespace

absl::StatusOr<Hardware> HardwarePreset(const std::string& name) {
  if (name == "this-machine") return MeasureThisMachine();
  // Peak dense fp16/bf16 tensor FLOP/s; peak HBM bandwidth (vendor data
  // sheets: V100 SXM2 900 GB/s, A100 1555/2039, H100 SXM 3350, H200 4800);
  // NVLink per-GPU bandwidth (one direction); each GPU's share of the
  // node's network (DGX-1 4 x 100 Gb/s for 8 GPUs, DGX A100 8 x 200, DGX
  // H100/H200 8 x 400); PCIe 3/4/5 x16 effective; CPU Adam at 40 GB/s (this
  // machine's 2-thread figure, benchmarks/RESULTS.md); one NVMe drive per GPU.
  struct Row {
    const char* name;
    double device_gib, tflops, hbm_gbs, nvlink_gbs, network_gbit, pcie_gbs, nvme_gbs;
  };
  static const Row kRows[] = {
      {"v100-32gb", 32, 125, 900, 150, 50, 12, 2},
      {"a100-40gb", 40, 312, 1555, 300, 200, 25, 3},
      {"a100-80gb", 80, 312, 2039, 300, 200, 25, 3},
      {"h100-80gb", 80, 989, 3350, 450, 400, 50, 6},
      {"h200", 141, 989, 4800, 450, 400, 50, 6},
  };
  for (const Row& r : kRows) {
    if (name != r.name) continue;
    Hardware hw;
    hw.name = r.name;
    hw.device_bytes = static_cast<int64_t>(r.device_gib * double(kGiB));
    hw.flops = r.tflops * 1e12 * kMfu;
    hw.memory_bps = r.hbm_gbs * 1e9 * kHbmEfficiency;
    hw.launch_seconds = kGpuLaunchSeconds;
    hw.interconnect_bps = r.nvlink_gbs * 1e9;
    hw.inter_node_bps = r.network_gbit * 1e9 / 8;
    hw.gpus_per_node = 8;
    hw.pcie_bps = r.pcie_gbs * 1e9;
    hw.cpu_adam_bps = 40e9;
    hw.nvme_bps = r.nvme_gbs * 1e9;
    hw.collective_latency = 20e-6;  // NCCL's small-message floor over NVLink
    return hw;
  }
  return absl::NotFoundError(absl::StrCat("hardware '", name, "': expected one of ",
                                          absl::StrJoin(HardwarePresets(), ", ")));
}

std::string PresetForMemory(int64_t device_bytes) {
  const double gib = double(device_bytes) / kGiB;
  return gib <= 32 ? "v100-32gb" : gib <= 40 ? "a100-40gb" : gib <= 80 ? "h100-80gb" : "h200";
}

StepTime PredictStep(const DryRunResult& plan, const Config& config, const Hardware& hw) {
  StepTime t;
  t.flops = (3.0 * plan.forward_flops + plan.extra_flops) / hw.flops;
  t.memory = 2.0 * plan.transient_bytes / hw.memory_bps;
  t.launches = plan.kernel_launches * hw.launch_seconds;
  int64_t calls = 0;
  for (const CollectiveStats& s : plan.collectives) calls += s.calls;
  // One rank's collectives cross no link (its reductions and gathers are
  // local: in place, or one copy on the device).
  if (plan.world > 1) {
    const double world = double(plan.world);
    t.across_nodes = plan.link_bytes.inter_node / world / hw.inter_node_bps;
    t.communication = plan.link_bytes.intra_node / world / hw.interconnect_bps + t.across_nodes +
                      calls * hw.collective_latency;
  }
  t.host_link = plan.pcie_bytes / hw.pcie_bps;
  t.cpu_update = 28.0 * plan.offloaded_elements / hw.cpu_adam_bps;
  t.nvme = plan.nvme_bytes_per_step / hw.nvme_bps;
  const double compute = t.flops + t.memory + t.launches;
  const double overlapped = config.zero.overlap_comm ? std::max(compute, t.communication)
                                                     : compute + t.communication;
  if (config.zero.offload_overlap_step && config.zero.stage >= 2 && !hw.device_is_cpu) {
    // The group reduced last finishes backward: its update cannot hide.
    const double tail = 28.0 * plan.tail_offloaded_elements / hw.cpu_adam_bps;
    t.cpu_update_hidden = std::min(t.cpu_update - tail, compute * 2.0 / 3.0);
  }
  t.total = overlapped + t.host_link + t.cpu_update - t.cpu_update_hidden + t.nvme;
  return t;
}

std::string StepTime::ToString() const {
  return absl::StrFormat(
      "%.4f s (FLOPs %.4f s, memory traffic %.4f s, kernel launches %.4f s, communication "
      "%.4f s%s, host link %.4f s, CPU update %.4f s%s, NVMe %.4f s)",
      total, flops, memory, launches, communication,
      across_nodes > 0 ? absl::StrFormat(" (%.4f s across nodes)", across_nodes) : "", host_link,
      cpu_update,
      cpu_update_hidden > 0 ? absl::StrFormat(" (%.4f s under backward)", cpu_update_hidden) : "",
      nvme);
}

double PredictStepSeconds(const DryRunResult& plan, const Config& config, const Hardware& hw) {
  return PredictStep(plan, config, hw).total;
}

absl::StatusOr<AutoResult> AutoStrategy(const DryRunOptions& options, const Config& base,
                                        const Hardware& hw, bool vary_micro_batch) {
  struct Choice {
    int stage;
    float ratio;
    bool paging;
    bool nvme;
    const char* planner;
    int64_t bucket;
    bool overlap_step = false;  // the CPU update overlapped with backward
    // Stage 3 with NVMe: the parameters (and gradients) there too, the
    // block weights gathered on use.
    bool nvme_params = false;
    bool quantized_weights = false;  // ZeRO++ qwZ (stage 3, several GPUs)
    int64_t hpz = 1;                 // ZeRO++ hpZ's block: a node (stage 3, several nodes)
    bool quantized_gradients = false;  // ZeRO++ qgZ (stage 3, several nodes)
    int64_t shard = -1;  // hybrid sharding's group: a node (stages 2-3, several nodes)
  };
  std::vector<Choice> choices;
  const int64_t node = NodeSize(options, base);
  for (int64_t bucket : {int64_t{5'000'000}, int64_t{50'000'000}}) {
    for (const char* planner : {"none", "optimal"}) {
      for (int stage = 0; stage <= 3; ++stage) {
        choices.push_back({stage, 0.0f, false, false, planner, bucket});
        if (stage == 0) continue;
        choices.push_back({stage, 0.5f, false, false, planner, bucket});
        choices.push_back({stage, 1.0f, false, false, planner, bucket});
        if (stage == 3) choices.push_back({stage, 1.0f, true, false, planner, bucket});
        if (stage == 3 && options.gpus > 1) {
          for (float ratio : {0.0f, 0.5f, 1.0f}) {
            choices.push_back({stage, ratio, false, false, planner, bucket, false, false, true});
          }
        }
        // Across nodes: the secondary partition inside each node, exact
        // and with quantized gathers.
        if (stage == 3 && node > 1 && node < options.gpus && options.gpus % node == 0) {
          for (bool quantized : {false, true}) {
            for (float ratio : {0.0f, 1.0f}) {
              choices.push_back(
                  {stage, ratio, false, false, planner, bucket, false, false, quantized, node});
            }
          }
          // Quantized gradients alone, and all of ZeRO++.
          for (float ratio : {0.0f, 1.0f}) {
            choices.push_back(
                {stage, ratio, false, false, planner, bucket, false, false, false, 1, true});
            choices.push_back(
                {stage, ratio, false, false, planner, bucket, false, false, true, node, true});
          }
        }
        // Across nodes: hybrid sharding, the states sharded in each node
        // and replicated across nodes.
        if (stage >= 2 && node > 1 && node < options.gpus && options.gpus % node == 0) {
          for (float ratio : {0.0f, 1.0f}) {
            Choice hybrid{stage, ratio, false, false, planner, bucket};
            hybrid.shard = node;
            choices.push_back(hybrid);
          }
        }
        if (stage >= 2) {  // the same, the update under backward (more pinned memory)
          choices.push_back({stage, 1.0f, false, false, planner, bucket, true});
          if (stage == 3) choices.push_back({stage, 1.0f, true, false, planner, bucket, true});
        }
        if (options.nvme_bytes > 0) choices.push_back({stage, 1.0f, false, true, planner, bucket});
        if (options.nvme_bytes > 0 && stage == 3) {
          choices.push_back({stage, 1.0f, true, true, planner, bucket, false, true});
        }
      }
    }
  }
  // The global batch per GPU (micro-batch x accumulation) is kept; each of
  // its divisors is a micro-batch to try when it has more than one.
  const int64_t micro = options.batch > 0 ? options.batch : base.train_micro_batch_size_per_gpu;
  const int64_t global = micro * base.gradient_accumulation_steps;
  std::vector<int64_t> micro_batches;
  for (int64_t m = 1; vary_micro_batch && m <= global; ++m) {
    if (global % m == 0) micro_batches.push_back(m);
  }
  const bool search = micro_batches.size() > 1;
  if (!search) micro_batches = {micro};
  AutoResult result;
  for (int64_t m : micro_batches) {
    DryRunOptions at = options;
    at.batch = m;
    for (const Choice& c : choices) {
      Candidate cand;
      cand.config = base;
      Config& config = cand.config;
      config.train_micro_batch_size_per_gpu = m;
      config.gradient_accumulation_steps = static_cast<int>(global / m);
      config.zero.stage = c.stage;
      config.zero.overlap_comm = c.stage > 0;
      config.zero.reduce_bucket_size = c.bucket;
      config.zero.stage3_prefetch_bucket_size = c.bucket;
      config.zero.offload_optimizer_ratio = c.ratio;
      config.zero.offload_param = c.paging;
      config.zero.offload_overlap_step = c.overlap_step;
      config.zero.offload_nvme_path = c.nvme ? "/local_nvme" : "";
      config.zero.offload_param_nvme_path = c.nvme_params ? "/local_nvme" : "";
      config.zero.offload_param_max_in_cpu =
          c.nvme_params ? 0 : ZeroConfig().offload_param_max_in_cpu;
      config.zero.offload_param_buffer_size =
          c.nvme_params ? INT64_MAX : ZeroConfig().offload_param_buffer_size;
      config.zero.stage3_gather_on_use = c.nvme_params;
      config.zero.quantized_weights = c.quantized_weights;
      config.zero.hpz_partition_size = c.hpz;
      config.zero.quantized_gradients = c.quantized_gradients;
      config.zero.mics_shard_size = c.shard;
      cand.changes_results = c.quantized_weights || c.quantized_gradients;
      config.activation_checkpointing = RecomputeConfig();
      config.activation_checkpointing.planner = c.planner;
      cand.name = absl::StrCat(
          "stage ", c.stage, c.ratio == 0 ? "" : absl::StrCat(", optimizer offload ", c.ratio),
          c.paging ? ", parameter paging" : "",
          c.nvme_params ? " and gradients on NVMe, gathered on use"
          : c.nvme      ? " (NVMe)"
                        : "",
          c.overlap_step ? ", update overlapped" : "",
          c.quantized_weights ? ", quantized weight gathers (qwZ)" : "",
          c.hpz > 1 ? absl::StrCat(", secondary partition in ", c.hpz, " GPUs (hpZ)") : "",
          c.quantized_gradients ? ", quantized gradients (qgZ)" : "",
          c.shard > 0 ? absl::StrCat(", sharded in groups of ", c.shard, " GPUs (hybrid)") : "",
          ", recomputation ",
          c.planner, ", buckets ",
          c.bucket / 1e6, "M", search ? absl::StrCat(", micro-batch ", m, " x ", global / m) : "");
      if (options.progress != nullptr) {
        options.progress->SetTask(absl::StrCat(
            "candidate ", result.candidates.size() + 1, " of ",
            micro_batches.size() * choices.size(), " (", cand.name, ")"));
      }
      MW_ASSIGN_OR_RETURN(cand.plan, DryRun(at, config));
      // Parameters on NVMe, gathered on use: a block operator too large
      // for the device alone may fit in tiles (the fewest that fit; each
      // tile is gathered, computed and released in turn).
      if (c.nvme_params && !cand.plan.fits && options.tiled_model) {
        for (int64_t tiles : {2, 4, 8, 16}) {
          absl::StatusOr<ModelFactory> tiled = options.tiled_model(tiles);
          if (!tiled.ok()) continue;  // the model's widths do not divide
          DryRunOptions with = at;
          with.model = *std::move(tiled);
          MW_ASSIGN_OR_RETURN(cand.plan, DryRun(with, config));
          cand.tiles = tiles;
          if (cand.plan.fits) break;
        }
        if (cand.tiles > 1) absl::StrAppend(&cand.name, ", ", cand.tiles, " tiles");
      }
      cand.step_seconds = PredictStepSeconds(cand.plan, config, hw);
      result.candidates.push_back(std::move(cand));
      const Candidate& added = result.candidates.back();
      // A candidate that changes the results (quantized communication) is
      // chosen only where the config opted in to it.
      const bool allowed =
          (!added.config.zero.quantized_weights || base.zero.quantized_weights) &&
          (!added.config.zero.quantized_gradients || base.zero.quantized_gradients);
      if (added.plan.fits && allowed &&
          (result.best < 0 || added.step_seconds < result.candidates[result.best].step_seconds)) {
        result.best = static_cast<int>(result.candidates.size()) - 1;
      }
    }
  }
  if (options.progress != nullptr) options.progress->SetTask("");
  return result;
}

std::string OutOfMemoryAdvice(const DryRunOptions& options, const Config& config) {
  const absl::StatusOr<Hardware> hw = HardwarePreset(PresetForMemory(options.device_bytes));
  if (!hw.ok()) return "";
  const absl::StatusOr<AutoResult> found = AutoStrategy(options, config, *hw);
  if (!found.ok()) return "";
  if (found->best >= 0) {
    const Candidate& best = found->candidates[found->best];
    return absl::StrCat(" The auto strategy fits it with ", best.name, " (",
                        FormatBytes(best.plan.device_needed), " of ",
                        FormatBytes(options.device_bytes), ")");
  }
  // Nothing fits this micro-batch: smaller ones, with the accumulation
  // that keeps the global batch (and so the training), largest first (the
  // fewest passes). One search per divisor until one fits.
  const int64_t micro = options.batch > 0 ? options.batch : config.train_micro_batch_size_per_gpu;
  const int64_t global = micro * config.gradient_accumulation_steps;
  for (int64_t m = micro - 1; m >= 1; --m) {
    if (global % m != 0 || global / m > std::numeric_limits<int>::max()) continue;
    DryRunOptions at = options;
    at.batch = m;
    Config smaller = config;
    smaller.train_micro_batch_size_per_gpu = m;
    smaller.gradient_accumulation_steps = static_cast<int>(global / m);
    const absl::StatusOr<AutoResult> fits = AutoStrategy(at, smaller, *hw);
    if (!fits.ok() || fits->best < 0) continue;
    const Candidate& best = fits->candidates[fits->best];
    return absl::StrCat(" The auto strategy fits it at micro-batch ", m, " x ", global / m,
                        " accumulation steps (the same ", global, " samples a step) with ",
                        best.name, " (", FormatBytes(best.plan.device_needed), " of ",
                        FormatBytes(options.device_bytes), ")");
  }
  return absl::StrCat(" No configuration memwall can run fits ", FormatBytes(options.device_bytes),
                      " per device, at any micro-batch that divides the ", global,
                      " samples a step");
}

}  // namespace memwall
