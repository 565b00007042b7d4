#include "models/spec.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "runtime/status.h"

namespace memwall {

namespace {

// A micro-batch's tokens (or pixels) must be countable: `batch` x `per`.
absl::Status CheckBatch(int64_t batch, int64_t per, const std::string& what) {
  if (batch < 1 || batch > std::numeric_limits<int64_t>::max() / std::max<int64_t>(per, 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch: ", batch, " samples of ", per, " ", what,
        "; expected >= 1 and a product within 64 bits"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Model> MakeModel(const std::string& spec, int64_t batch, int64_t seq,
                                int64_t image) {
  Model m;
  const std::vector<std::string> zoo = ZooModels();
  if (std::find(zoo.begin(), zoo.end(), spec) != zoo.end()) {
    const bool cnn = spec.rfind("res", 0) == 0;
    const int64_t length = seq > 0 ? seq : (spec == "llama-7b" ? 2048 : 4096);
    MW_ASSIGN_OR_RETURN(m.layers, MakeZooModel(spec, length));
    if (cnn) {
      if (image < 32) {
        return absl::InvalidArgumentError(absl::StrCat("--image: expected >= 32, got ", image));
      }
      MW_RETURN_IF_ERROR(CheckBatch(batch, 3 * image * image, "values"));
      m.input = {batch, 3, image, image};
      m.target = {batch, 1000};
      m.loss = std::make_unique<MseLoss>();
    } else {
      MW_RETURN_IF_ERROR(CheckBatch(batch, length, "tokens"));
      m.input = {batch, length};
      m.target = {batch * length};
      m.loss = std::make_unique<CrossEntropyLoss>();
    }
    return m;
  }
  absl::StatusOr<GptConfig> parsed = ParseGptModel(spec);
  if (parsed.status().code() == absl::StatusCode::kNotFound) {
    // Not a GPT preset; the zoo's models are names here too.
    return absl::NotFoundError(absl::StrCat(parsed.status().message(), "; or a zoo model: ",
                                            absl::StrJoin(zoo, ", ")));
  }
  MW_ASSIGN_OR_RETURN(GptConfig gpt, std::move(parsed));
  if (seq > 0) gpt.seq = seq;
  MW_RETURN_IF_ERROR(CheckBatch(batch, gpt.seq, "tokens"));
  MW_ASSIGN_OR_RETURN(m.layers, MakeGpt(gpt));
  m.input = {batch, gpt.seq};
  m.target = {batch * gpt.seq};
  m.loss = std::make_unique<CrossEntropyLoss>();
  return m;
}

ModelFactory SpecModel(const std::string& spec, int64_t seq, int64_t image) {
  return [spec, seq, image](int64_t batch) { return MakeModel(spec, batch, seq, image); };
}

absl::StatusOr<std::string> WithTiles(const std::string& spec, int64_t tiles) {
  if (spec.find("tiles=") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("model '", spec, "': names its tiles already"));
  }
  const std::string tiled = absl::StrCat(spec, spec.find(':') == std::string::npos ? ":" : ",",
                                         "tiles=", tiles, ",vocab_tiles=", tiles);
  MW_RETURN_IF_ERROR(ParseGptModel(tiled).status());
  return tiled;
}

}  // namespace memwall
