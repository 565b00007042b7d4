#include "models/layers.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/nn.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {
namespace {

int64_t Rows(const std::vector<int64_t>& shape) { return shape.empty() ? 0 : shape[0]; }

absl::Status ExpectMatrix(const std::string& layer, const std::vector<int64_t>& shape,
                          int64_t columns) {
  if (shape.size() != 2 || shape[1] != columns) {
    return absl::InvalidArgumentError(absl::StrCat("layer '", layer, "': expected an input of shape [rows, ",
                                                   columns, "], got [", absl::StrJoin(shape, ", "), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<ParameterDecl> Linear::Parameters() const {
  return {{"weight", {in_, out_}, ParameterDecl::Init::kNormal, 1.0f / std::sqrt(float(in_))},
          {"bias", {out_}, ParameterDecl::Init::kZeros, 0.0f}};
}

absl::StatusOr<std::vector<int64_t>> Linear::OutputShape(const std::vector<int64_t>& input) const {
  MW_RETURN_IF_ERROR(ExpectMatrix(name(), input, in_));
  return std::vector<int64_t>{input[0], out_};
}

int64_t Linear::ActivationBytes(const std::vector<int64_t>& input, DType dtype) const {
  // The output, which the next layer reads in backward.
  return Rows(input) * out_ * static_cast<int64_t>(DTypeSize(dtype));
}

double Linear::ForwardFlops(const std::vector<int64_t>& input) const {
  return 2.0 * Rows(input) * in_ * out_;
}

absl::StatusOr<Tensor> Linear::Forward(LayerContext& ctx, const Tensor& input) {
  MW_ASSIGN_OR_RETURN(std::vector<int64_t> shape, OutputShape(input.shape()));
  MW_ASSIGN_OR_RETURN(Tensor output, ctx.Activation(shape));
  MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
  MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("bias"));
  MW_ASSIGN_OR_RETURN(const float* x, ctx.Read(input));
  MW_ASSIGN_OR_RETURN(float* y, ctx.Stage(output));
  const int64_t rows = shape[0];
  MW_RETURN_IF_ERROR(kernels::BroadcastRows(ctx.device(), ctx.stream(), b, rows, out_, y));
  MW_RETURN_IF_ERROR(kernels::Gemm(ctx.device(), ctx.stream(), false, false, rows, out_, in_, 1.0f,
                                   x, in_, w, out_, 1.0f, y, out_));
  MW_RETURN_IF_ERROR(ctx.Commit(output));
  return output;
}

absl::StatusOr<Tensor> Linear::Backward(LayerContext& ctx, const Tensor& input,
                                        const Tensor& grad_output) {
  const int64_t rows = input.shape()[0];
  MW_ASSIGN_OR_RETURN(Tensor grad_input, ctx.InputGradient(input.shape()));
  MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
  MW_ASSIGN_OR_RETURN(float* dw, ctx.Grad("weight"));
  MW_ASSIGN_OR_RETURN(float* db, ctx.Grad("bias"));
  MW_ASSIGN_OR_RETURN(const float* x, ctx.Read(input));
  const float* dy = grad_output.data_as<float>();
  // dW += x^T dy; db += sum over rows of dy; dx = dy W^T.
  Device& d = ctx.device();
  MW_RETURN_IF_ERROR(kernels::Gemm(d, ctx.stream(), true, false, in_, out_, rows, 1.0f, x, in_, dy,
                                   out_, 1.0f, dw, out_));
  MW_RETURN_IF_ERROR(kernels::ColumnSum(d, ctx.stream(), dy, rows, out_, db));
  MW_RETURN_IF_ERROR(kernels::Gemm(d, ctx.stream(), false, true, rows, in_, out_, 1.0f, dy, out_,
                                   w, out_, 0.0f, grad_input.data_as<float>(), in_));
  return grad_input;
}

int64_t Gelu::ActivationBytes(const std::vector<int64_t>& input, DType dtype) const {
  int64_t n = 1;
  for (int64_t d : input) n *= d;
  // The output; backward recomputes from the input it is given.
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

double Gelu::ForwardFlops(const std::vector<int64_t>& input) const {
  double n = 1;
  for (int64_t d : input) n *= d;
  return 8.0 * n;
}

absl::StatusOr<Tensor> Gelu::Forward(LayerContext& ctx, const Tensor& input) {
  MW_ASSIGN_OR_RETURN(Tensor output, ctx.Activation(input.shape()));
  MW_ASSIGN_OR_RETURN(const float* x, ctx.Read(input));
  MW_ASSIGN_OR_RETURN(float* y, ctx.Stage(output));
  MW_RETURN_IF_ERROR(kernels::GeluForward(ctx.device(), ctx.stream(), x, y, input.numel()));
  MW_RETURN_IF_ERROR(ctx.Commit(output));
  return output;
}

absl::StatusOr<Tensor> Gelu::Backward(LayerContext& ctx, const Tensor& input,
                                      const Tensor& grad_output) {
  MW_ASSIGN_OR_RETURN(Tensor grad_input, ctx.InputGradient(input.shape()));
  MW_ASSIGN_OR_RETURN(const float* x, ctx.Read(input));
  MW_RETURN_IF_ERROR(kernels::GeluBackward(ctx.device(), ctx.stream(), x,
                                           grad_output.data_as<float>(),
                                           grad_input.data_as<float>(), input.numel()));
  return grad_input;
}

absl::StatusOr<float> MseLoss::Compute(LayerContext& ctx, const Tensor& output,
                                       const Tensor& target, Tensor& grad_output) {
  if (output.shape() != target.shape() || output.shape().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mse loss: the target's shape [", absl::StrJoin(target.shape(), ", "),
        "] differs from the output's [", absl::StrJoin(output.shape(), ", "), "]"));
  }
  // e = y - t in grad_output; loss = 0.5 sum(e^2) / rows; dy = e / rows.
  Device& d = ctx.device();
  Stream& stream = ctx.stream();
  const size_t n = output.numel();
  const float rows = float(output.shape()[0]);
  float* e = grad_output.data_as<float>();
  MW_ASSIGN_OR_RETURN(const float* y, ctx.Read(output));
  MW_RETURN_IF_ERROR(kernels::Copy(d, stream, e, y, n * sizeof(float)));
  MW_RETURN_IF_ERROR(kernels::Axpy(d, stream, -1.0f, target.data_as<float>(), e, n));
  MW_ASSIGN_OR_RETURN(const double squares, kernels::SumOfSquares(d, stream, e, DType::kF32, n));
  MW_RETURN_IF_ERROR(kernels::Scale(d, stream, e, DType::kF32, n, 1.0f / rows));
  return static_cast<float>(0.5 * squares / rows);
}

std::vector<std::unique_ptr<Layer>> MakeMlp(const std::vector<int64_t>& widths) {
  std::vector<std::unique_ptr<Layer>> layers;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    layers.push_back(std::make_unique<Linear>(absl::StrCat("fc", i), widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) layers.push_back(std::make_unique<Gelu>(absl::StrCat("gelu", i)));
  }
  return layers;
}

}  // namespace memwall
