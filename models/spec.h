// Models by name, for the command line and the benchmarks: a zoo name or a
// GPT spec turned into the engine's Model (engine/model.h).
#ifndef MEMWALL_MODELS_SPEC_H_
#define MEMWALL_MODELS_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace memwall {

// `spec` is a zoo name (models/zoo.h: resnet50, resnest269, llama-7b,
// llama2-70b) or a GPT spec (models/gpt.h: presets, overrides,
// gpt:params=N), for micro-batches of `batch` samples. `seq` > 0 overrides
// a transformer's sequence length; CNNs take square `image`s. Errors name
// the flag or the model.
absl::StatusOr<Model> MakeModel(const std::string& spec, int64_t batch, int64_t seq,
                                int64_t image);

// MakeModel as the engine's factory: the same spec, seq and image for
// every micro-batch size asked for. (`memwall plan` also takes traced
// PyTorch models, "hf:PATH" and "traced:FILE": planning/plan.h.)
ModelFactory SpecModel(const std::string& spec, int64_t seq = 0, int64_t image = 224);

// A GPT spec with its block operators in `tiles` tiles of output columns
// and its tied embedding and LM head in as many tiles of the vocabulary
// (GptConfig::tiles, vocab_tiles): "gpt2-1.5b" ->
// "gpt2-1.5b:tiles=4,vocab_tiles=4", "gpt:params=1e12" ->
// "gpt:params=1e12,tiles=4,vocab_tiles=4". kNotFound for a spec that is no
// GPT; kInvalidArgument for one that already names its tiles, whose widths
// `tiles` does not divide, or whose vocabulary is smaller than `tiles`.
absl::StatusOr<std::string> WithTiles(const std::string& spec, int64_t tiles);

}  // namespace memwall

#endif  // MEMWALL_MODELS_SPEC_H_
