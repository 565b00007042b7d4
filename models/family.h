// Model families for `memwall max-params` (engine/max_params.h): members
// of growing size, each a spec --model runs.
#ifndef MEMWALL_MODELS_FAMILY_H_
#define MEMWALL_MODELS_FAMILY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/max_params.h"

namespace memwall {

// The GPT family: member s has hidden 128 s and s heads (GPT-3's shape
// rule) and, unless `layers` fixes them, s layers; seq and vocab fixed.
// Its members tile (models/spec.h WithTiles).
struct GptFamily {
  int64_t seq = 1024;
  int64_t vocab = 0;   // 0: GPT-2's 50257
  int64_t layers = 0;  // 0: as many as heads
  // "gpt:layers=12,hidden=1536,heads=12,seq=1024" for s = 12.
  std::string Spec(int64_t size) const;
  // "GPT, hidden = 128 x heads = 128 x layers, seq 1024".
  std::string Description() const;
};

// "gpt", or "gpt:" with fixed keys seq, vocab, layers ("gpt:seq=2048");
// `seq` > 0 overrides the spec's (default 1024). Errors name --model and
// the key.
absl::StatusOr<GptFamily> ParseGptFamily(const std::string& spec, int64_t seq = 0);

ModelFamily MakeGptFamily(const GptFamily& family);

}  // namespace memwall

#endif  // MEMWALL_MODELS_FAMILY_H_
