// Basic layers with real compute on host and cuda (kernels/nn.h: OpenBLAS
// or cuBLAS GEMM, GELU kernels with CUDA twins): Linear, GELU (GPT-2's tanh
// approximation), and the mean-squared-error loss. Inputs are
// [rows, features] f32 tensors.
#ifndef MEMWALL_MODELS_LAYERS_H_
#define MEMWALL_MODELS_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/layer.h"

namespace memwall {

// y = x W + b with W [in, out], b [out].
class Linear final : public Layer {
 public:
  Linear(std::string name, int64_t in, int64_t out) : Layer(std::move(name)), in_(in), out_(out) {}
  std::vector<ParameterDecl> Parameters() const override;
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& input) const override;
  int64_t ActivationBytes(const std::vector<int64_t>& input, DType dtype) const override;
  double ForwardFlops(const std::vector<int64_t>& input) const override;
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& input) override;
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& input,
                                  const Tensor& grad_output) override;

 private:
  const int64_t in_, out_;
};

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), element-wise.
class Gelu final : public Layer {
 public:
  explicit Gelu(std::string name) : Layer(std::move(name)) {}
  std::vector<ParameterDecl> Parameters() const override { return {}; }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& input) const override {
    return input;
  }
  int64_t ActivationBytes(const std::vector<int64_t>& input, DType dtype) const override;
  double ForwardFlops(const std::vector<int64_t>& input) const override;
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& input) override;
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& input,
                                  const Tensor& grad_output) override;
};

// loss = sum((y - t)^2) / (2 rows): half the squared error per row.
class MseLoss final : public LossFunction {
 public:
  absl::StatusOr<float> Compute(LayerContext& ctx, const Tensor& output, const Tensor& target,
                                Tensor& grad_output) override;
};

// Linear, GELU, Linear, GELU, ..., Linear: `widths` = {in, hidden..., out}.
std::vector<std::unique_ptr<Layer>> MakeMlp(const std::vector<int64_t>& widths);

}  // namespace memwall

#endif  // MEMWALL_MODELS_LAYERS_H_
