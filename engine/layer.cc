#include "engine/layer.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<const float*> LayerContext::Param(absl::string_view local) {
  return SharedParam(absl::StrCat(layer_, ".", local));
}

absl::StatusOr<float*> LayerContext::Grad(absl::string_view local) {
  return SharedGrad(absl::StrCat(layer_, ".", local));
}

absl::StatusOr<Tensor> LayerContext::Widen(const ShardedOptimizer::View& view,
                                           absl::string_view full_name, bool copy) {
  MW_ASSIGN_OR_RETURN(Tensor wide, Tensor::Empty(device_, DType::kF32, {view.numel},
                                                 MemoryCategory::kWorkspace,
                                                 absl::StrCat(full_name, copy ? ".f32" : ".grad_f32")));
  if (copy) {
    MW_RETURN_IF_ERROR(kernels::Cast(device_, stream_, view.data, view.dtype, wide.data(),
                                     DType::kF32, view.numel));
  } else {
    MW_RETURN_IF_ERROR(
        kernels::Fill(device_, stream_, wide.data(), DType::kF32, view.numel, 0.0f));
  }
  return wide;  // the layer's kernels use it on stream_, after the cast or fill
}

absl::Status LayerContext::Hold(absl::string_view full_name, bool gradients) {
  if (!gathers_on_use_) return absl::OkStatus();
  MW_ASSIGN_OR_RETURN(const int g, optimizer_.GroupOf(full_name));
  if (gathered_.insert(g).second) MW_RETURN_IF_ERROR(optimizer_.GatherParameters(g));
  // A later layer's backward may have left the gradients acquired (a
  // deferred reduction, set_deferred_reductions): this layer takes them over.
  if (gradients && acquired_.insert(g).second && !optimizer_.HoldsGradients(g)) {
    MW_RETURN_IF_ERROR(optimizer_.AcquireGradients(g));
  }
  return absl::OkStatus();
}

absl::Status LayerContext::Drop(int g) {
  if (acquired_.erase(g) > 0 && deferred_.count(g) == 0) {
    MW_RETURN_IF_ERROR(optimizer_.ReduceGradients(g));
  }
  gathered_.erase(g);
  return optimizer_.ReleaseParameters(g);
}

absl::Status LayerContext::ReleaseGroups() {
  while (!gathered_.empty()) MW_RETURN_IF_ERROR(Drop(*gathered_.begin()));
  return absl::OkStatus();
}

absl::StatusOr<const float*> LayerContext::SharedParam(absl::string_view full_name) {
  MW_RETURN_IF_ERROR(Hold(full_name, /*gradients=*/false));
  MW_ASSIGN_OR_RETURN(ShardedOptimizer::View view, optimizer_.Parameter(full_name));
  if (view.dtype == DType::kF32) return static_cast<const float*>(view.data);
  auto it = param_copies_.find(std::string(full_name));
  if (it == param_copies_.end()) {
    MW_ASSIGN_OR_RETURN(Tensor wide, Widen(view, full_name, /*copy=*/true));
    it = param_copies_.emplace(std::string(full_name), std::move(wide)).first;
  }
  return it->second.data_as<const float>();
}

absl::StatusOr<float*> LayerContext::SharedGrad(absl::string_view full_name) {
  MW_RETURN_IF_ERROR(Hold(full_name, /*gradients=*/true));
  MW_ASSIGN_OR_RETURN(ShardedOptimizer::View view, optimizer_.Gradient(full_name));
  if (view.dtype == DType::kF32) return static_cast<float*>(view.data);
  auto it = grad_copies_.find(std::string(full_name));
  if (it == grad_copies_.end()) {
    MW_ASSIGN_OR_RETURN(Tensor wide, Widen(view, full_name, /*copy=*/false));
    it = grad_copies_.emplace(std::string(full_name), Widened{view, std::move(wide)}).first;
  }
  return it->second.wide.data_as<float>();
}

absl::Status LayerContext::Release(absl::Span<const absl::string_view> locals) {
  return ReleaseNamed(locals.size(),
                      [&](size_t i) { return absl::StrCat(layer_, ".", locals[i]); });
}

absl::Status LayerContext::ReleaseShared(absl::Span<const absl::string_view> full_names) {
  return ReleaseNamed(full_names.size(), [&](size_t i) { return std::string(full_names[i]); });
}

absl::Status LayerContext::ReleaseNamed(size_t n, absl::FunctionRef<std::string(size_t)> name) {
  // Freed in stream order (engine/layer.h): queued kernels may still read
  // a copy, and whatever reuses its block runs after them. Every copy goes
  // before any group does.
  for (size_t i = 0; i < n; ++i) param_copies_.erase(name(i));
  if (!gathers_on_use_) return absl::OkStatus();
  for (size_t i = 0; i < n; ++i) {
    MW_ASSIGN_OR_RETURN(const int g, optimizer_.GroupOf(name(i)));
    if (gathered_.count(g) > 0) MW_RETURN_IF_ERROR(Drop(g));
  }
  return absl::OkStatus();
}

absl::Status LayerContext::FlushGradient(absl::Span<const absl::string_view> locals) {
  for (absl::string_view local : locals) {
    MW_RETURN_IF_ERROR(FlushOne(absl::StrCat(layer_, ".", local)));
  }
  return absl::OkStatus();
}

absl::Status LayerContext::FlushSharedGradient(absl::Span<const absl::string_view> full_names) {
  for (absl::string_view name : full_names) MW_RETURN_IF_ERROR(FlushOne(std::string(name)));
  return absl::OkStatus();
}

absl::Status LayerContext::FlushOne(const std::string& full_name) {
  auto it = grad_copies_.find(full_name);
  if (it == grad_copies_.end()) return absl::OkStatus();
  Widened& g = it->second;
  MW_RETURN_IF_ERROR(kernels::Accumulate(device_, stream_, g.wide.data(), DType::kF32, g.low.data,
                                         g.low.dtype, g.low.numel));
  grad_copies_.erase(it);  // in stream order, after the accumulation
  return absl::OkStatus();
}

absl::Status LayerContext::FlushGradients() {
  for (auto& entry : grad_copies_) {
    Widened& g = entry.second;
    MW_RETURN_IF_ERROR(kernels::Accumulate(device_, stream_, g.wide.data(), DType::kF32, g.low.data,
                                           g.low.dtype, g.low.numel));
  }
  grad_copies_.clear();
  return ReleaseWorkspace();
}

absl::Status LayerContext::ReleaseWorkspace() {
  // In stream order: kernels queued on stream_ may still read these, and
  // what reuses their blocks is ordered after them (engine/layer.h).
  param_copies_.clear();
  reads_.clear();
  return absl::OkStatus();
}

absl::StatusOr<Tensor> LayerContext::Activation(std::vector<int64_t> shape) {
  return Activation(std::move(shape), activation_dtype_);
}

absl::StatusOr<Tensor> LayerContext::Activation(std::vector<int64_t> shape, DType dtype) {
  return Tensor::Empty(device_, dtype, std::move(shape), MemoryCategory::kActivation, layer_);
}

absl::StatusOr<float*> LayerContext::Stage(const Tensor& activation) {
  if (activation.dtype() == DType::kF32) return activation.data_as<float>();
  MW_ASSIGN_OR_RETURN(Tensor wide, Workspace(activation.shape()));
  float* data = wide.data_as<float>();
  staged_[&activation] = std::move(wide);
  return data;
}

absl::Status LayerContext::Commit(const Tensor& activation) {
  auto it = staged_.find(&activation);
  if (it == staged_.end()) return absl::OkStatus();
  MW_RETURN_IF_ERROR(kernels::Cast(device_, stream_, it->second.data(), DType::kF32,
                                   activation.data(), activation.dtype(), activation.numel()));
  // The workspace is freed now (in stream order, after the cast), so the
  // forward's peak holds one layer's f32 values only while they are needed.
  staged_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<const float*> LayerContext::Read(const Tensor& tensor) {
  if (tensor.dtype() == DType::kF32) return tensor.data_as<const float>();
  MW_ASSIGN_OR_RETURN(Tensor wide, Workspace(tensor.shape()));
  MW_RETURN_IF_ERROR(kernels::Cast(device_, stream_, tensor.data(), tensor.dtype(), wide.data(),
                                   DType::kF32, tensor.numel()));
  reads_.push_back(std::move(wide));
  return reads_.back().data_as<const float>();
}

absl::StatusOr<Tensor> LayerContext::InputGradient(std::vector<int64_t> shape) {
  return Tensor::Empty(device_, DType::kF32, std::move(shape), MemoryCategory::kActivation,
                       absl::StrCat(layer_, ".grad"));
}

absl::StatusOr<Tensor> LayerContext::Workspace(std::vector<int64_t> shape) {
  return Tensor::Empty(device_, DType::kF32, std::move(shape), MemoryCategory::kWorkspace,
                       absl::StrCat(layer_, ".workspace"));
}

void LayerContext::Discard() {
  (void)stream_.Synchronize();  // a failed step's error is already the caller's
  saved_.clear();
  param_copies_.clear();
  grad_copies_.clear();
  staged_.clear();
  reads_.clear();
  gathered_.clear();  // the optimizer's AbortStep drops what they held
  acquired_.clear();
}

}  // namespace memwall
