#include "engine/model_states.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<float> ModelStates::LearningRate(int index) const {
  if (index < 0 || index >= opt_.num_hyper_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("learning_rate: hyperparameter group ", index,
                                                   " of ", opt_.num_hyper_groups()));
  }
  return opt_.LearningRate(index);
}

absl::StatusOr<std::vector<float>> ModelStates::GatherState(int group, int which) {
  const std::vector<FlatGroup>& groups = opt_.layout().groups;
  if (group < 0 || group >= static_cast<int>(groups.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather_state: group ", group, " of ", groups.size()));
  }
  std::vector<float> out(groups[group].padded_numel);
  MW_RETURN_IF_ERROR(opt_.GatherState(group, which, absl::MakeSpan(out)));
  return out;
}

absl::StatusOr<std::vector<float>> ModelStates::MasterWeights(absl::string_view name) {
  MW_ASSIGN_OR_RETURN(const ParameterPlacement* place, opt_.Placement(name));
  std::vector<float> out(place->numel);
  MW_RETURN_IF_ERROR(opt_.MasterWeights(name, absl::MakeSpan(out)));
  return out;
}

}  // namespace memwall
