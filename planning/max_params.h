// Max-params requests and their reports (what `memwall max-params`
// prints): the largest model of a family that trains on the given GPUs,
// host memory and disk (engine/max_params.h), what stops the next size up,
// and the config and --model that run it.
#ifndef MEMWALL_PLANNING_MAX_PARAMS_H_
#define MEMWALL_PLANNING_MAX_PARAMS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/max_params.h"
#include "engine/progress.h"

namespace memwall {

struct MaxParamsRequest {
  // "gpt" (GPT-3's shape rule: layers = heads = hidden / 128, hidden
  // searched in steps of 128), optionally with fixed keys seq, vocab and
  // layers ("gpt:seq=2048", "gpt:layers=32": then only the width grows).
  std::string family = "gpt";
  std::string config_path;  // empty: bf16 mixed precision, AdamW, micro-batch 1
  int64_t gpus = 1;
  int64_t device_bytes = kPlanDeviceBytes;
  int64_t host_bytes = kPlanHostBytes;  // pinned host memory per GPU
  int64_t nvme_bytes = 0;                   // per GPU
  int64_t batch = 0;                        // 0: the config's micro-batch
  int64_t seq = 0;                          // 0: the family's (gpt: 1024)
  std::string out_path;                     // the chosen config, if set
  bool overwrite_out = false;
  bool json = false;
  // The machine's flags as given ("--gpus 1 --device_memory 32GiB ..."),
  // echoed in the `memwall plan` line that checks the answer.
  std::string machine_flags;
};

// The report: text ending with "largest: ..." lines, or JSON
// ("memwall.max-params/1"). Errors name the flag or file.
// `progress`, if set, is told each dry run.
absl::StatusOr<std::string> MaxParamsReport(const MaxParamsRequest& flags,
                                            PlanProgress* progress = nullptr);

}  // namespace memwall

#endif  // MEMWALL_PLANNING_MAX_PARAMS_H_
