#include "engine/max_params.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/units.h"
#include "sharding/flat_layout.h"

namespace memwall {
namespace {

// A strategy of the search, and the least each budget must hold of the
// model states under it (bytes per parameter, before dividing by the
// GPUs): a strategy whose model states alone overflow a budget cannot fit,
// and is skipped without a dry run. With the optimizer offloaded (stage 3)
// the gradients stream to the host beside its states; paging moves the
// weights there too; the NVMe tier holds the optimizer's states twice
// (offload/nvme_store.h: a write fills the copy not in use), and with the
// parameters there their weights twice and their gradients once.
struct Strategy {
  std::string name;
  Config config;
  bool tiles = false;  // parameters on NVMe, gathered on use: tiling helps
  double device = 0, host = 0, nvme = 0;
};

// The strategies, fastest first, most frugal last (engine/max_params.h).
std::vector<Strategy> Strategies(const MaxParamsOptions& options) {
  const Config& base = options.base;
  const DryRunOptions& m = options.machine;
  // Per parameter: the weights and gradients in the parameter dtype, and
  // the optimizer's states (an f32 master copy beside 16-bit weights, and
  // Adam's two moments; SGD's momentum counted as none: a lower bound).
  const double weights = static_cast<double>(DTypeSize(base.param_dtype()));
  const double states = (weights < 4 ? 4.0 : 0.0) +
                        (base.optimizer.type == OptimizerType::kAdam ? 8.0 : 0.0);
  Config stage3 = base;
  stage3.zero.stage = 3;
  stage3.zero.overlap_comm = true;
  stage3.zero.reduce_bucket_size = 50'000'000;
  stage3.zero.stage3_prefetch_bucket_size = 50'000'000;
  stage3.activation_checkpointing = RecomputeConfig();
  stage3.activation_checkpointing.planner = "optimal";
  std::vector<Strategy> out = {
      {"stage 3, recomputation optimal", stage3, false, 2 * weights + states, 0, 0}};
  if (m.host_bytes > 0) {
    Config offload = stage3;
    offload.zero.offload_optimizer_ratio = 1.0f;
    out.push_back({"stage 3, optimizer offload, recomputation optimal", offload, false, weights,
                   states + weights, 0});
    Config paging = offload;
    paging.zero.offload_param = true;
    out.push_back({"stage 3, optimizer offload, parameter paging, recomputation optimal", paging,
                   false, 0, states + 2 * weights, 0});
    if (m.nvme_bytes > 0) {
      Config nvme = paging;
      nvme.zero.offload_nvme_path = "/local_nvme";
      out.push_back({"stage 3, optimizer on NVMe, parameter paging, recomputation optimal", nvme,
                     false, 0, 2 * weights, 2 * states});
      Config params = nvme;
      params.zero.offload_param_nvme_path = "/local_nvme";
      params.zero.offload_param_max_in_cpu = 0;
      params.zero.offload_param_buffer_size = INT64_MAX;  // a page buffer holds any shard
      params.zero.stage3_gather_on_use = true;
      out.push_back({"stage 3, optimizer, parameters and gradients on NVMe, gathered on use, "
                     "recomputation optimal",
                     params, true, 0, 0, 2 * states + 3 * weights});
    }
    // The most frugal: activation checkpoints in host memory too.
    Strategy frugal = out.back();
    frugal.config.activation_checkpointing.offload = true;
    frugal.name += ", activation checkpoints in host memory";
    out.push_back(std::move(frugal));
  }
  return out;
}

class Search {
 public:
  explicit Search(const MaxParamsOptions& options)
      : options_(options), strategies_(Strategies(options)) {}

  // Whether `size` fits under the most frugal strategy (most tiles); its
  // plan (a size whose model states alone overflow a budget: the
  // parameters and why, without a dry run). Each size is planned once.
  absl::StatusOr<DryRunResult> Frugal(int64_t size) {
    if (const auto it = frugal_.find(size); it != frugal_.end()) return it->second;
    MW_ASSIGN_OR_RETURN(const FamilyMember member, options_.family(size));
    const Strategy& frugal = strategies_.back();
    ModelFactory model = member.model;
    if (frugal.tiles && member.tiled) {
      for (int64_t tiles : {16, 8, 4, 2}) {  // the most the widths take
        absl::StatusOr<std::pair<std::string, ModelFactory>> tiled = member.tiled(tiles);
        if (!tiled.ok()) continue;
        model = tiled->second;
        break;
      }
    }
    MW_ASSIGN_OR_RETURN(const int64_t parameters, Parameters(member.model));
    DryRunResult plan;
    if (const std::string over = Overflow(frugal, parameters); !over.empty()) {
      plan.parameters = parameters;
      plan.fits_text = absl::StrCat("no (", over, ")");
    } else {
      MW_ASSIGN_OR_RETURN(plan, Run(model, frugal, member.spec));
    }
    frugal_[size] = plan;
    return plan;
  }

  // The fastest strategy that fits `size` (which fits the most frugal).
  absl::StatusOr<MaxParamsResult> Choose(int64_t size) {
    MW_ASSIGN_OR_RETURN(const FamilyMember member, options_.family(size));
    MW_ASSIGN_OR_RETURN(const int64_t parameters, Parameters(member.model));
    for (const Strategy& s : strategies_) {
      if (!Overflow(s, parameters).empty()) continue;
      for (int64_t tiles : {1, 2, 4, 8, 16}) {
        if (tiles > 1 && !(s.tiles && member.tiled)) break;
        MaxParamsResult result;
        result.model = member.spec;
        ModelFactory model = member.model;
        if (tiles > 1) {
          absl::StatusOr<std::pair<std::string, ModelFactory>> tiled = member.tiled(tiles);
          if (!tiled.ok()) continue;  // the widths do not divide
          result.model = tiled->first;
          model = tiled->second;
        }
        MW_ASSIGN_OR_RETURN(result.plan, Run(model, s, result.model));
        if (!result.plan.fits) continue;
        result.size = size;
        result.tiles = tiles;
        result.strategy = tiles > 1 ? absl::StrCat(s.name, ", ", tiles, " tiles") : s.name;
        result.config = s.config;
        return result;
      }
    }
    return absl::InternalError(absl::StrCat("max-params: size ", size,
                                            " fit the most frugal strategy and then none"));
  }

  int dry_runs() const { return dry_runs_; }

 private:
  absl::StatusOr<int64_t> Parameters(const ModelFactory& model) {
    MW_ASSIGN_OR_RETURN(const Model built, model(Batch()));
    int64_t n = 0;
    for (const auto& layer : built.layers) {
      for (const ParameterDecl& d : layer->Parameters()) n += NumElements(d.shape);
    }
    return n;
  }

  // Empty if each budget can hold `s`'s model states for `parameters`,
  // else which overflows: "the model states alone need at least 27.94 TiB
  // of NVMe per GPU, 27.00 TiB given".
  std::string Overflow(const Strategy& s, int64_t parameters) const {
    const DryRunOptions& m = options_.machine;
    const double per_gpu = static_cast<double>(parameters) / static_cast<double>(m.gpus);
    const std::pair<const char*, std::pair<double, int64_t>> budgets[] = {
        {"device memory", {s.device, m.device_bytes - m.runtime_allowance}},
        {"host memory", {s.host, m.host_bytes}},
        {"NVMe", {s.nvme, m.nvme_bytes}}};
    for (const auto& [what, need] : budgets) {
      const double bytes = need.first * per_gpu;
      if (bytes > static_cast<double>(need.second)) {
        return absl::StrCat("the model states alone need at least ",
                            FormatBytes(static_cast<int64_t>(bytes)), " of ", what, " per GPU, ",
                            FormatBytes(need.second), " given");
      }
    }
    return "";
  }

  int64_t Batch() const {
    return options_.machine.batch > 0 ? options_.machine.batch
                                      : options_.base.train_micro_batch_size_per_gpu;
  }

  absl::StatusOr<DryRunResult> Run(const ModelFactory& model, const Strategy& s,
                                   const std::string& spec) {
    DryRunOptions at = options_.machine;
    at.model = model;
    at.model_name = spec;
    ++dry_runs_;
    if (at.progress != nullptr) {
      at.progress->SetTask(absl::StrCat("dry run ", dry_runs_, ": ", spec, " under ", s.name));
    }
    return DryRun(at, s.config);
  }

  const MaxParamsOptions& options_;
  const std::vector<Strategy> strategies_;
  std::map<int64_t, DryRunResult> frugal_;  // by size
  int dry_runs_ = 0;
};

}  // namespace

absl::StatusOr<MaxParamsResult> MaxParams(const MaxParamsOptions& options) {
  if (!options.family) return absl::InvalidArgumentError("max-params: no model family given");
  if (options.max_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max-params: max_size: expected >= 1, got ", options.max_size));
  }
  Search search(options);
  // A size the family cannot make ends the family (max_size likewise).
  const auto fits = [&](int64_t size) -> absl::StatusOr<bool> {
    if (size > options.max_size || !options.family(size).ok()) return false;
    MW_ASSIGN_OR_RETURN(const DryRunResult plan, search.Frugal(size));
    return plan.fits;
  };
  MW_RETURN_IF_ERROR(options.family(1).status());
  MaxParamsResult result;
  int64_t lo = 0, hi = 1;  // lo fits (0: nothing yet), hi does not
  MW_ASSIGN_OR_RETURN(bool ok, fits(1));
  if (ok) {
    // Doubled while it fits, then bisected.
    lo = 1;
    hi = 2;
    while (true) {
      MW_ASSIGN_OR_RETURN(ok, fits(hi));
      if (!ok) break;
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      MW_ASSIGN_OR_RETURN(ok, fits(mid));
      (ok ? lo : hi) = mid;
    }
    MW_ASSIGN_OR_RETURN(result, search.Choose(lo));
  }
  // What stops the next size up, if the family has one.
  if (absl::StatusOr<FamilyMember> member = options.family(lo + 1);
      lo + 1 <= options.max_size && member.ok()) {
    MW_ASSIGN_OR_RETURN(const DryRunResult plan, search.Frugal(lo + 1));
    result.next_model = member->spec;
    result.next_parameters = plan.parameters;
    result.next_fails_on = plan.fits_text;
  }
  if (options.machine.progress != nullptr) options.machine.progress->SetTask("");
  result.dry_runs = search.dry_runs();
  return result;
}

}  // namespace memwall
