#include "models/family.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/status.h"

namespace memwall {

std::string GptFamily::Spec(int64_t size) const {
  return absl::StrCat("gpt:layers=", layers > 0 ? layers : size, ",hidden=", 128 * size,
                      ",heads=", size, ",seq=", seq,
                      vocab > 0 ? absl::StrCat(",vocab=", vocab) : "");
}

std::string GptFamily::Description() const {
  return absl::StrCat("GPT, hidden = 128 x heads",
                      layers > 0 ? absl::StrCat(", ", layers, " layers") : " = 128 x layers",
                      ", seq ", seq, vocab > 0 ? absl::StrCat(", vocab ", vocab) : "");
}

absl::StatusOr<GptFamily> ParseGptFamily(const std::string& spec, int64_t seq) {
  GptFamily family;
  if (spec != "gpt" && spec.rfind("gpt:", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model: expected the family gpt, optionally with fixed seq, vocab or layers "
        "(gpt:seq=2048,layers=32), got '", spec, "'"));
  }
  if (spec.size() > 4) {
    for (absl::string_view field : absl::StrSplit(spec.substr(4), ',')) {
      const std::vector<std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      int64_t value = 0;
      if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value) || value < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--model ", spec, ": '", field, "': expected key=N with N >= 1"));
      }
      if (kv[0] == "seq") {
        family.seq = value;
      } else if (kv[0] == "vocab") {
        family.vocab = value;
      } else if (kv[0] == "layers") {
        family.layers = value;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--model ", spec, ": key '", kv[0],
            "' is not fixed in a family (hidden and heads grow with the size; fixed keys: seq, "
            "vocab, layers)"));
      }
    }
  }
  if (seq > 0) family.seq = seq;
  MW_RETURN_IF_ERROR(ParseGptModel(family.Spec(1)).status());
  return family;
}

ModelFamily MakeGptFamily(const GptFamily& family) {
  return [family](int64_t size) -> absl::StatusOr<FamilyMember> {
    FamilyMember member;
    member.spec = family.Spec(size);
    MW_RETURN_IF_ERROR(ParseGptModel(member.spec).status());
    member.model = SpecModel(member.spec);
    member.tiled = [spec = member.spec](int64_t tiles)
        -> absl::StatusOr<std::pair<std::string, ModelFactory>> {
      MW_ASSIGN_OR_RETURN(std::string tiled, WithTiles(spec, tiles));
      ModelFactory model = SpecModel(tiled);
      return std::make_pair(std::move(tiled), std::move(model));
    };
    return member;
  };
}

}  // namespace memwall
