#include "cli/demo.h"

#include <cstdio>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// A table row: the name, then one figure per rank.
void PrintRow(absl::string_view name, const SelfCheckReport& report,
              const std::function<int64_t(const SelfCheckBooks&)>& field) {
  std::string row = absl::StrFormat("  %-24s", name);
  for (const SelfCheckBooks& b : report.ranks)
    absl::StrAppendFormat(&row, " %12s", FormatBytes(field(b)));
  std::printf("%s\n", row.c_str());
}

}  // namespace

absl::Status RunDemo(const SelfCheckOptions& options) {
  MW_ASSIGN_OR_RETURN(const SelfCheckReport report, RunSelfCheck(options));
  if (report.rank != 0) return absl::OkStatus();
  const bool meta = options.backend == Backend::kMeta;
  const int world = report.world_size;
  std::printf(
      "memwall demo: %d rank%s%s, %s backend with %s per rank, %lld parameters (%lld per "
      "shard)\n",
      world, world == 1 ? "" : "s", meta && world > 1 ? " (simulated: rank 0's books)" : "",
      std::string(BackendName(options.backend)).c_str(),
      FormatBytes(options.capacity_bytes).c_str(), static_cast<long long>(options.parameters),
      static_cast<long long>(report.shard_numel));
  std::printf(
      "step: memwall's engine, ZeRO stage 1, bf16 parameters and gradients, f32 master "
      "weights and AdamW on each rank's shard (CPU kernels: %s)\n",
      meta ? "none on meta" : report.isa.c_str());
  if (meta) {
    std::printf("check: skipped on meta (no bytes exist; sizes and traffic are real)\n");
  } else {
    std::printf(
        "check: %lld of %lld gathered parameters differ from the single-process update on "
        "some rank\n",
        static_cast<long long>(report.mismatches), static_cast<long long>(options.parameters));
  }
  std::printf("\npeak device memory by category (requested bytes, from memwall's allocator)\n");
  std::string header = absl::StrFormat("  %-24s", "category");
  for (size_t q = 0; q < report.ranks.size(); ++q) {
    absl::StrAppendFormat(&header, " %12s", absl::StrCat("rank ", q));
  }
  std::printf("%s\n", header.c_str());
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    bool any = false;
    for (const SelfCheckBooks& b : report.ranks) any = any || b.peak_by_category[c] != 0;
    if (!any) continue;
    PrintRow(MemoryCategoryName(kAllMemoryCategories[c]), report,
             [c](const SelfCheckBooks& b) { return b.peak_by_category[c]; });
  }
  PrintRow("peak (all categories)", report,
           [](const SelfCheckBooks& b) { return b.peak_requested; });
  PrintRow("peak reserved", report, [](const SelfCheckBooks& b) { return b.peak_reserved; });
  std::printf("\ncommunication per rank: ReduceScatter %s, AllGather %s\n",
              FormatBytes(report.ranks[0].reduce_scatter_bytes).c_str(),
              FormatBytes(report.ranks[0].all_gather_bytes).c_str());
  if (report.mismatches != 0) {
    return absl::InternalError(absl::StrCat("demo: ", report.mismatches,
                                            " gathered parameters differ from the reference"));
  }
  return absl::OkStatus();
}

}  // namespace memwall
