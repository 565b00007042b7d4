// The dry run checked against real steps, at the device sizes the issue
// names: for each capacity and strategy, bisect the largest model of the
// gpt-tiny family (4 layers, seq 64, vocabulary 256, hidden = 64 m, heads
// = m, micro-batch 4, bf16) that `memwall plan`'s dry run says fits, train
// one real step of it on the host backend with that device capacity, and
// compare the allocator's measured peaks with the predicted ones; then try
// one size up for real, which must run out of memory with the report.
//
//   bazel run //benchmarks:plan_validation [-- TEXT]   (only the strategies whose name holds TEXT)
//
// Exit status 1 if any row disagrees (a peak off by more than 1%, a
// largest model that fails, or a next size that trains).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/dry_run.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr int64_t kHost = int64_t{4} << 30;  // pinned pool for the offload rows

struct Strategy {
  std::string name;
  int stage;
  float offload;
  bool paging;
  std::string planner;
  // Parameters, gradients and optimizer states on NVMe (in $TEST_TMPDIR or
  // /tmp), block weights gathered on use in this many tiles (0: neither).
  int64_t nvme_tiles = 0;
};

std::string NvmeDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Spec(const Strategy& s, int64_t m) {
  return absl::StrCat("gpt-tiny:layers=4,hidden=", 64 * m, ",heads=", m,
                      s.nvme_tiles > 1 ? absl::StrCat(",tiles=", s.nvme_tiles) : "");
}

Config ConfigFor(const Strategy& s) {
  Config c;
  c.bf16 = true;
  c.train_micro_batch_size_per_gpu = 4;
  c.zero.stage = s.stage;
  c.zero.reduce_bucket_size = 1'000'000;
  c.zero.offload_optimizer_ratio = s.offload;
  c.zero.offload_param = s.paging;
  c.activation_checkpointing.planner = s.planner;
  if (s.nvme_tiles > 0) {
    c.zero.offload_nvme_path = NvmeDir();
    c.zero.offload_param_nvme_path = NvmeDir();
    c.zero.offload_param_max_in_cpu = 0;
    c.zero.stage3_gather_on_use = true;
  }
  return c;
}

absl::StatusOr<DryRunResult> Predict(const Strategy& s, int64_t m, int64_t capacity) {
  DryRunOptions o;
  o.model = SpecModel(Spec(s, m));
  o.device_bytes = capacity;
  o.host_bytes = kHost;
  if (s.nvme_tiles > 0) o.nvme_bytes = int64_t{64} << 30;
  o.runtime_allowance = 0;  // host backend: no CUDA runtime
  return DryRun(o, ConfigFor(s));
}

struct Measured {
  absl::Status status;
  int64_t requested_peak = 0, reserved_peak = 0;
};

// One real host step following the dry run's recomputation plan.
Measured RealStep(const Strategy& s, int64_t m, int64_t capacity, const RecomputationPlan& plan) {
  Measured out;
  DeviceOptions options{Backend::kHost, 0, capacity};
  options.pinned_capacity_bytes = s.offload > 0 ? kHost : 0;
  auto device = CreateDevice(options).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  const GptConfig c = ParseGptModel(Spec(s, m)).value();
  const Config config = ConfigFor(s);
  out.status = [&]() -> absl::Status {
    MW_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                        Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                        config, *device, *comm, 1));
    const int64_t b = config.train_micro_batch_size_per_gpu;
    MW_ASSIGN_OR_RETURN(const Chain chain, trainer->ChainFor({b, c.seq}));
    MW_RETURN_IF_ERROR(trainer->SetRecomputationPlan(plan, chain));
    std::vector<float> ids(b * c.seq);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 7) % c.vocab);
    Batch batch;
    MW_ASSIGN_OR_RETURN(batch.input,
                        Tensor::FromHost(*device, ids, {b, c.seq}, MemoryCategory::kOther, "in"));
    MW_ASSIGN_OR_RETURN(batch.target,
                        Tensor::FromHost(*device, ids, {b * c.seq}, MemoryCategory::kOther, "t"));
    return trainer->TrainStep({&batch, 1}).status();
  }();
  const AllocatorStats stats = device->allocator().stats();
  out.requested_peak = stats.requested.peak;
  out.reserved_peak = stats.reserved.peak;
  return out;
}

double Off(int64_t measured, int64_t predicted) {
  return predicted == 0 ? 0.0 : 100.0 * (double(measured) - predicted) / predicted;
}

int Main(const std::string& only) {
  const std::vector<Strategy> strategies = {
      {"stage 0", 0, 0, false, "none"},
      {"stage 1", 1, 0, false, "none"},
      {"stage 2", 2, 0, false, "none"},
      {"stage 3", 3, 0, false, "none"},
      {"stage 3 + sqrt recomputation", 3, 0, false, "sqrt"},
      {"stage 2 + optimizer offload", 2, 1.0f, false, "none"},
      {"stage 3 + offload + paging + optimal", 3, 1.0f, true, "optimal"},
      {"stage 3 + all on NVMe, 4 tiles on use + optimal", 3, 1.0f, true, "optimal", 4},
  };
  std::printf("plan_validation: gpt-tiny family (4 layers, seq 64, micro-batch 4, bf16), host "
              "backend, one real step per row\n\n");
  std::printf("%-8s %-38s %7s %12s %12s %7s %12s %12s %7s  %s\n", "device", "strategy", "hidden",
              "pred. req.", "real req.", "off", "pred. res.", "real res.", "off",
              "next size up, real step");
  int bad = 0;
  for (int64_t capacity : {128 * kMiB, 256 * kMiB, 512 * kMiB}) {
    for (const Strategy& s : strategies) {
      if (!absl::StrContains(s.name, only)) continue;
      auto fits = [&](int64_t m) {
        const absl::StatusOr<DryRunResult> r = Predict(s, m, capacity);
        return r.ok() && r->fits;
      };
      if (!fits(1)) {
        std::printf("%-8s %-38s   none fits\n", FormatBytes(capacity).c_str(), s.name.c_str());
        continue;
      }
      int64_t lo = 1, hi = 2;
      while (fits(hi)) lo = hi, hi *= 2;
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      const DryRunResult at = Predict(s, lo, capacity).value();
      const DryRunResult up = Predict(s, lo + 1, capacity).value();
      const Measured real = RealStep(s, lo, capacity, at.recompute);
      const Measured next = RealStep(s, lo + 1, capacity, up.recompute);
      const double off_req = Off(real.requested_peak, at.device_requested_peak);
      const double off_res = Off(real.reserved_peak, at.device_reserved_peak);
      const bool next_oom = next.status.code() == absl::StatusCode::kResourceExhausted &&
                            absl::StartsWith(next.status.message(), "out of memory on host:0");
      const bool ok = real.status.ok() && next_oom && std::fabs(off_req) <= 1.0 &&
                      std::fabs(off_res) <= 1.0;
      bad += !ok;
      std::printf("%-8s %-38s %7lld %12s %12s %6.2f%% %12s %12s %6.2f%%  %s%s\n",
                  FormatBytes(capacity).c_str(), s.name.c_str(), static_cast<long long>(64 * lo),
                  FormatBytes(at.device_requested_peak).c_str(),
                  FormatBytes(real.requested_peak).c_str(), off_req,
                  FormatBytes(at.device_reserved_peak).c_str(),
                  FormatBytes(real.reserved_peak).c_str(), off_res,
                  next_oom ? "out of memory (report)" : std::string(next.status.ToString()).c_str(),
                  real.status.ok() ? "" : absl::StrCat("; largest failed: ", real.status.ToString()).c_str());
      std::fflush(stdout);
    }
  }
  std::printf("\n%d of %zu rows disagree\n", bad, 3 * strategies.size());
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc > 1 ? argv[1] : ""); }
