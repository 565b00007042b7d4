// What the `memwall` commands share: the config they run with.
#ifndef MEMWALL_CLI_SESSION_H_
#define MEMWALL_CLI_SESSION_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"

namespace memwall {

// The built-in default config (ZeRO stage 2 with overlap, AdamW); the same
// as configs/gpt-tiny-zero2.json.
extern const char kDefaultTrainConfig[];

// `path`'s config, or the built-in one when `path` is empty.
absl::StatusOr<Config> LoadConfigOrDefault(const std::string& path);

}  // namespace memwall

#endif  // MEMWALL_CLI_SESSION_H_
