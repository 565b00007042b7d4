// The profile job (`memwall profile`): a few training steps of a model under
// the memory profiler, its reports written (profile.txt, profile.json,
// trace.json, profile.html) and each rank's peak gathered over the ranks;
// on meta it works for any model at any size. The caller prints the summary.
#ifndef MEMWALL_JOBS_PROFILE_H_
#define MEMWALL_JOBS_PROFILE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace memwall {

struct ProfileOptions {
  // A GPT spec (gpt2-350m, gpt-tiny:layers=4) or a zoo model (resnet50,
  // resnest269, llama-7b, llama2-70b).
  std::string model = "gpt-tiny";
  std::string config_path;  // empty: the built-in training config
  Backend backend = Backend::kMeta;
  int64_t capacity_bytes = int64_t{32} << 30;
  // The pinned host pool (offloaded optimizer states and activations); 0:
  // what PinnedBytes (engine/engine.h) derives from the config.
  int64_t pinned_bytes = 0;
  std::string out_dir = "memwall-profile";
  int64_t batch = 0;    // 0: the config's micro-batch size
  int64_t seq = 0;      // transformers; 0: the model's own
  int64_t image = 224;  // CNNs: square images of this size
  int64_t steps = 1;
  int simulate_ranks = 1;  // meta: the world rank 0 belongs to
  // How long a rank waits for the others in one collective before the run
  // fails (CommunicatorOptions::timeout).
  absl::Duration collective_timeout = absl::Minutes(10);
};

// What a profile found, on every rank.
struct ProfileSummary {
  int rank = 0;
  int world_size = 1;  // MPI ranks (a simulated world is one process)
  // The recomputation plan in one line; empty when the config plans none.
  std::string recomputation;
  // This rank's terminal report (profiler/report.h TerminalReport).
  std::string report;
  // Over the ranks, at each rank's own peak: [0] the requested bytes of all
  // categories, [1 + c] those of category c (the ranks' max and min).
  static constexpr int kFields = 1 + kNumMemoryCategories;
  std::array<int64_t, kFields> peak_max{}, peak_min{};
};

// Runs on every rank of MPI_COMM_WORLD (host, cuda) or as rank 0 of a
// simulated world (meta). Every rank writes its reports to
// <out_dir>/rank<k>/; on out-of-memory the reports of that moment are
// written and the error (kResourceExhausted) says where. Other errors name
// the option, file or key at fault.
absl::StatusOr<ProfileSummary> RunProfile(const ProfileOptions& options);

}  // namespace memwall

#endif  // MEMWALL_JOBS_PROFILE_H_
