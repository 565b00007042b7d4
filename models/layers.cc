#include "models/layers.h"

#include <cblas.h>

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

}  // namespace

std::vector<ParameterDecl> Linear::Parameters() const {
  return {{"weight", {in_, out_}, ParameterDecl::Init::kNormal, 1.0f / std::sqrt(float(in_))},
          {"bias", {out_}, ParameterDecl::Init::kZeros, 0.0f}};
}

absl::StatusOr<std::vector<int64_t>> Linear::OutputShape(const std::vector<int64_t>& input) const {
  MW_RETURN_IF_ERROR(ExpectMatrix(name(), input, in_));
  return std::vector<int64_t>{input[0], out_};
}

int64_t Linear::ActivationBytes(const std::vector<int64_t>& input) const {
  return Rows(input) * out_ * 4;  // the output, which the next layer reads in backward
}

double Linear::ForwardFlops(const std::vector<int64_t>& input) const {
  return 2.0 * Rows(input) * in_ * out_;
}

absl::StatusOr<Tensor> Linear::Forward(LayerContext& ctx, const Tensor& input) {
  MW_ASSIGN_OR_RETURN(std::vector<int64_t> shape, OutputShape(input.shape()));
  MW_ASSIGN_OR_RETURN(Tensor output, ctx.Activation(shape));
  if (!ctx.computes()) return output;
  MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
  MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("bias"));
  const int64_t rows = shape[0];
  float* y = output.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out_; ++o) y[r * out_ + o] = b[o];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out_, in_, 1.0f,
              input.data_as<float>(), in_, w, out_, 1.0f, y, out_);
  return output;
}

absl::StatusOr<Tensor> Linear::Backward(LayerContext& ctx, const Tensor& input,
                                        const Tensor& grad_output) {
  const int64_t rows = input.shape()[0];
  MW_ASSIGN_OR_RETURN(Tensor grad_input, ctx.InputGradient(input.shape()));
  if (!ctx.computes()) return grad_input;
  MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
  MW_ASSIGN_OR_RETURN(float* dw, ctx.Grad("weight"));
  MW_ASSIGN_OR_RETURN(float* db, ctx.Grad("bias"));
  const float* x = input.data_as<float>();
  const float* dy = grad_output.data_as<float>();
  // dW += x^T dy; db += sum over rows of dy; dx = dy W^T.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in_, out_, rows, 1.0f, x, in_, dy, out_,
              1.0f, dw, out_);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out_; ++o) db[o] += dy[r * out_ + o];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in_, out_, 1.0f, dy, out_, w, out_,
              0.0f, grad_input.data_as<float>(), in_);
  return grad_input;
}

int64_t Gelu::ActivationBytes(const std::vector<int64_t>& input) const {
  int64_t n = 1;
  for (int64_t d : input) n *= d;
  return n * 4;  // the output; backward recomputes from the input it is given
}

double Gelu::ForwardFlops(const std::vector<int64_t>& input) const {
  double n = 1;
  for (int64_t d : input) n *= d;
  return 8.0 * n;
}

absl::StatusOr<Tensor> Gelu::Forward(LayerContext& ctx, const Tensor& input) {
  MW_ASSIGN_OR_RETURN(Tensor output, ctx.Activation(input.shape()));
  if (!ctx.computes()) return output;
  const float* x = input.data_as<float>();
  float* y = output.data_as<float>();
  for (int64_t i = 0; i < input.numel(); ++i) {
    const float u = kGeluC * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    y[i] = 0.5f * x[i] * (1.0f + std::tanh(u));
  }
  return output;
}

absl::StatusOr<Tensor> Gelu::Backward(LayerContext& ctx, const Tensor& input,
                                      const Tensor& grad_output) {
  MW_ASSIGN_OR_RETURN(Tensor grad_input, ctx.InputGradient(input.shape()));
  if (!ctx.computes()) return grad_input;
  const float* x = input.data_as<float>();
  const float* dy = grad_output.data_as<float>();
  float* dx = grad_input.data_as<float>();
  for (int64_t i = 0; i < input.numel(); ++i) {
    const float u = kGeluC * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    const float t = std::tanh(u);
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x[i] * x[i]);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * x[i] * (1.0f - t * t) * du);
  }
  return grad_input;
}

absl::StatusOr<float> MseLoss::Compute(LayerContext& ctx, const Tensor& output,
                                       const Tensor& target, Tensor& grad_output) {
  if (output.shape() != target.shape() || output.shape().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mse loss: the target's shape [", absl::StrJoin(target.shape(), ", "),
        "] differs from the output's [", absl::StrJoin(output.shape(), ", "), "]"));
  }
  if (!ctx.computes()) return 0.0f;
  const float* y = output.data_as<float>();
  const float* t = target.data_as<float>();
  float* dy = grad_output.data_as<float>();
  const float rows = float(output.shape()[0]);
  double loss = 0;
  for (int64_t i = 0; i < output.numel(); ++i) {
    const float e = y[i] - t[i];
    loss += 0.5 * double(e) * e;
    dy[i] = e / rows;
  }
  return static_cast<float>(loss / rows);
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
