// `memwall train`'s log: the training job's events (jobs/train.h) as lines
// for people or, with --log_format json, one JSON object per line for
// programs (events "start", "resumed", "step", "saved", "nothing_to_train",
// "summary"; sizes in bytes, throughput in tokens/s).
#ifndef MEMWALL_CLI_TRAIN_H_
#define MEMWALL_CLI_TRAIN_H_

#include "absl/status/status.h"
#include "jobs/train.h"

namespace memwall {

// `log_format`: "text" or "json" (anything else is kInvalidArgument naming
// --log_format, before the job starts).
absl::Status RunTrainCommand(const TrainOptions& options, const std::string& log_format);

}  // namespace memwall

#endif  // MEMWALL_CLI_TRAIN_H_
