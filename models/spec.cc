#include "models/spec.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "runtime/status.h"

namespace memwall {

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
      m.input = {batch, 3, image, image};
      m.target = {batch, 1000};
      m.loss = std::make_unique<MseLoss>();
    } else {
      m.input = {batch, length};
      m.target = {batch * length};
      m.loss = std::make_unique<CrossEntropyLoss>();
    }
    return m;
  }
  MW_ASSIGN_OR_RETURN(GptConfig gpt, ParseGptModel(spec));
  if (seq > 0) gpt.seq = seq;
  MW_ASSIGN_OR_RETURN(m.layers, MakeGpt(gpt));
  m.input = {batch, gpt.seq};
  m.target = {batch * gpt.seq};
  m.loss = std::make_unique<CrossEntropyLoss>();
  return m;
}

ModelFactory SpecModel(const std::string& spec, int64_t seq, int64_t image) {
  return [spec, seq, image](int64_t batch) { return MakeModel(spec, batch, seq, image); };
}

}  // namespace memwall
