// `memwall profile`: runs a few training steps of a model under the memory
// profiler and writes its reports (profile.txt, profile.json, trace.json,
// profile.html); on meta it works for any model at any size.
#ifndef MEMWALL_CLI_PROFILE_H_
#define MEMWALL_CLI_PROFILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/device.h"

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
  int64_t batch = 0;  // 0: the config's micro-batch size
  int64_t seq = 0;    // transformers; 0: the model's own
  int64_t image = 224;  // CNNs: square images of this size
  int64_t steps = 1;
  int simulate_ranks = 1;  // meta: the world rank 0 belongs to
  // How long a rank waits for the others in one collective before the run
  // fails (CommunicatorOptions::timeout).
  absl::Duration collective_timeout = absl::Minutes(10);
};

// Every rank writes its reports to <out_dir>/rank<k>/; rank 0 prints its
// terminal report and, over ranks, the max, min and imbalance of each rank's
// peak and of every category at it. On out-of-memory the reports of
// that moment are written and the error says where.
absl::Status RunProfile(const ProfileOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_PROFILE_H_
