#include "engine/layer.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<const float*> LayerContext::Param(absl::string_view local) {
  return SharedParam(absl::StrCat(layer_, ".", local));
}

absl::StatusOr<float*> LayerContext::Grad(absl::string_view local) {
  return SharedGrad(absl::StrCat(layer_, ".", local));
}

absl::StatusOr<const float*> LayerContext::SharedParam(absl::string_view full_name) {
  MW_ASSIGN_OR_RETURN(ShardedOptimizer::View view, optimizer_.Parameter(full_name));
  if (view.dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat(
        "layer '", layer_, "': ", DTypeName(view.dtype),
        " parameters need the mixed-precision layers, which are not built yet; use f32"));
  }
  return static_cast<const float*>(view.data);
}

absl::StatusOr<float*> LayerContext::SharedGrad(absl::string_view full_name) {
  MW_ASSIGN_OR_RETURN(ShardedOptimizer::View view, optimizer_.Gradient(full_name));
  if (view.dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat(
        "layer '", layer_, "': ", DTypeName(view.dtype),
        " gradients need the mixed-precision layers, which are not built yet; use f32"));
  }
  return static_cast<float*>(view.data);
}

absl::StatusOr<Tensor> LayerContext::Activation(std::vector<int64_t> shape) {
  return Tensor::Empty(device_, DType::kF32, std::move(shape), MemoryCategory::kActivation, layer_);
}

absl::StatusOr<Tensor> LayerContext::InputGradient(std::vector<int64_t> shape) {
  return Tensor::Empty(device_, DType::kF32, std::move(shape), MemoryCategory::kActivation,
                       absl::StrCat(layer_, ".grad"));
}

}  // namespace memwall
