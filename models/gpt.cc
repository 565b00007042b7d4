#include "models/gpt.h"

#include <cblas.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/status.h"

namespace memwall {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

// y = (x - mean) * rstd * gamma + beta, per row; keeps mean and rstd.
void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t h, float* y, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    double m = 0, v = 0;
    for (int64_t i = 0; i < h; ++i) m += xr[i];
    m /= h;
    for (int64_t i = 0; i < h; ++i) v += (xr[i] - m) * (xr[i] - m);
    v /= h;
    const float s = static_cast<float>(1.0 / std::sqrt(v + kLayerNormEps));
    mean[r] = static_cast<float>(m);
    rstd[r] = s;
    for (int64_t i = 0; i < h; ++i) y[r * h + i] = (xr[i] - mean[r]) * s * gamma[i] + beta[i];
  }
}

// Adds dgamma, dbeta; writes dx.
void LayerNormBackward(const float* dy, const float* x, const float* mean, const float* rstd,
                       const float* gamma, int64_t rows, int64_t h, float* dx, float* dgamma,
                       float* dbeta) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      const float dxhat = dyr[i] * gamma[i];
      dgamma[i] += dyr[i] * xhat;
      dbeta[i] += dyr[i];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
    }
    const float a = static_cast<float>(sum_dxhat / h), b = static_cast<float>(sum_dxhat_xhat / h);
    for (int64_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      dx[r * h + i] = rstd[r] * (dyr[i] * gamma[i] - a - xhat * b);
    }
  }
}

// y[rows, out] (+)= x[rows, in] W[in, out] (+ b).
void Affine(const float* x, const float* w, const float* b, int64_t rows, int64_t in,
            int64_t out, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) y[r * out + o] = b[o];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out, in, 1.0f, x, in, w, out, 1.0f,
              y, out);
}

// dW += x^T dy, db += colsum(dy), dx (=, or += if accumulate) dy W^T.
void AffineBackward(const float* x, const float* w, const float* dy, int64_t rows, int64_t in,
                    int64_t out, float* dw, float* db, float* dx, bool accumulate_dx) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, rows, 1.0f, x, in, dy, out, 1.0f,
              dw, out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) db[o] += dy[r * out + o];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in, out, 1.0f, dy, out, w, out,
              accumulate_dx ? 1.0f : 0.0f, dx, in);
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// ---- Embedding: ids [batch, seq] -> wte[id] + wpe[position]. ----
class GptEmbedding final : public Layer {
 public:
  explicit GptEmbedding(const GptConfig& c) : Layer("embed"), c_(c) {}
  std::vector<ParameterDecl> Parameters() const override {
    return {{"wte", {c_.vocab, c_.hidden}, ParameterDecl::Init::kNormal, 0.02f},
            {"wpe", {c_.seq, c_.hidden}, ParameterDecl::Init::kNormal, 0.01f}};
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.seq || in[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("layer 'embed': expected token ids [batch, ",
                                                     c_.seq, "], got ", Shape(in)));
    }
    return std::vector<int64_t>{in[0] * c_.seq, c_.hidden};
  }
  int64_t ActivationBytes(const std::vector<int64_t>& in) const override {
    return in[0] * c_.seq * c_.hidden * 4;
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    return double(in[0]) * c_.seq * c_.hidden;
  }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& ids) override {
    MW_ASSIGN_OR_RETURN(std::vector<int64_t> shape, OutputShape(ids.shape()));
    MW_ASSIGN_OR_RETURN(Tensor out, ctx.Activation(shape));
    if (!ctx.computes()) return out;
    MW_ASSIGN_OR_RETURN(const float* wte, ctx.Param("wte"));
    MW_ASSIGN_OR_RETURN(const float* wpe, ctx.Param("wpe"));
    const int64_t h = c_.hidden;
    for (int64_t r = 0; r < shape[0]; ++r) {
      MW_ASSIGN_OR_RETURN(const int64_t id, Token(ids, r));
      const float* t = wte + id * h;
      const float* p = wpe + (r % c_.seq) * h;
      for (int64_t i = 0; i < h; ++i) out.data_as<float>()[r * h + i] = t[i] + p[i];
    }
    return out;
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& ids,
                                  const Tensor& grad_output) override {
    if (!ctx.computes()) return Tensor();
    MW_ASSIGN_OR_RETURN(float* dwte, ctx.Grad("wte"));
    MW_ASSIGN_OR_RETURN(float* dwpe, ctx.Grad("wpe"));
    const int64_t h = c_.hidden;
    for (int64_t r = 0; r < ids.numel(); ++r) {
      MW_ASSIGN_OR_RETURN(const int64_t id, Token(ids, r));
      const float* d = grad_output.data_as<float>() + r * h;
      for (int64_t i = 0; i < h; ++i) {
        dwte[id * h + i] += d[i];
        dwpe[(r % c_.seq) * h + i] += d[i];
      }
    }
    return Tensor();  // token ids have no gradient
  }

 private:
  absl::StatusOr<int64_t> Token(const Tensor& ids, int64_t r) const {
    const float v = ids.data_as<float>()[r];
    if (!(v >= 0 && v < c_.vocab) || v != std::floor(v)) {
      return absl::InvalidArgumentError(absl::StrCat("layer 'embed': token ", r, " is ", v,
                                                     "; expected an id in 0..", c_.vocab - 1));
    }
    return static_cast<int64_t>(v);
  }
  const GptConfig c_;
};

// ---- A pre-LayerNorm transformer block. ----
// Saved per row (f32): ln1 output (H), ln1 mean and rstd (2), qkv (3H),
// attention output before the projection (H), the residual after attention
// (H), ln2 output (H), ln2 mean and rstd (2), MLP pre-activation (4H), GELU
// output (4H); per sequence and head the causal softmax (seq x seq); and the
// block's output (H). 16H + 4 floats per row plus heads * seq^2 per sequence.
class TransformerBlock final : public Layer {
 public:
  TransformerBlock(std::string name, const GptConfig& c) : Layer(std::move(name)), c_(c) {}

  std::vector<ParameterDecl> Parameters() const override {
    const int64_t h = c_.hidden;
    // GPT-2: residual projections scaled by 1/sqrt(2 * layers).
    const float proj = 0.02f / std::sqrt(2.0f * c_.layers);
    return {{"ln1_weight", {h}, ParameterDecl::Init::kOnes, 0},
            {"ln1_bias", {h}, ParameterDecl::Init::kZeros, 0},
            {"qkv_weight", {h, 3 * h}, ParameterDecl::Init::kNormal, 0.02f},
            {"qkv_bias", {3 * h}, ParameterDecl::Init::kZeros, 0},
            {"attn_proj_weight", {h, h}, ParameterDecl::Init::kNormal, proj},
            {"attn_proj_bias", {h}, ParameterDecl::Init::kZeros, 0},
            {"ln2_weight", {h}, ParameterDecl::Init::kOnes, 0},
            {"ln2_bias", {h}, ParameterDecl::Init::kZeros, 0},
            {"fc_weight", {h, 4 * h}, ParameterDecl::Init::kNormal, 0.02f},
            {"fc_bias", {4 * h}, ParameterDecl::Init::kZeros, 0},
            {"mlp_proj_weight", {4 * h, h}, ParameterDecl::Init::kNormal, proj},
            {"mlp_proj_bias", {h}, ParameterDecl::Init::kZeros, 0}};
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.hidden || in[0] < 1 || in[0] % c_.seq != 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", name(), "': expected [batch * ",
                                                     c_.seq, ", ", c_.hidden, "], got ", Shape(in)));
    }
    return in;
  }
  int64_t ActivationBytes(const std::vector<int64_t>& in) const override {
    const int64_t rows = in[0], batch = rows / c_.seq;
    return 4 * (rows * (16 * c_.hidden + 4) + batch * c_.heads * c_.seq * c_.seq);
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    const double rows = in[0], h = c_.hidden;
    // QKV, projection, MLP (2 x 4h^2) matmuls, and scores + values.
    return 2.0 * rows * (3 * h * h + h * h + 8 * h * h) + 4.0 * rows * c_.seq * h;
  }

  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& x) override {
    MW_RETURN_IF_ERROR(OutputShape(x.shape()).status());
    const int64_t rows = x.shape()[0], h = c_.hidden, batch = rows / c_.seq;
    std::vector<Tensor>& s = ctx.saved();
    s.clear();
    // Allocation order matches Saved below.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{rows, h}, {rows, 2}, {rows, 3 * h}, {rows, h},
                                           {rows, h}, {rows, h}, {rows, 2}, {rows, 4 * h},
                                           {rows, 4 * h}, {batch, c_.heads, c_.seq, c_.seq}}) {
      MW_ASSIGN_OR_RETURN(Tensor t, ctx.Activation(shape));
      s.push_back(std::move(t));
    }
    MW_ASSIGN_OR_RETURN(Tensor y, ctx.Activation({rows, h}));
    if (!ctx.computes()) return y;
    P p{};
    MW_RETURN_IF_ERROR(Load(ctx, p));
    float *ln1 = F(s[kLn1]), *st1 = F(s[kStats1]), *qkv = F(s[kQkv]), *att = F(s[kAttn]),
          *x1 = F(s[kResidual]), *ln2 = F(s[kLn2]), *st2 = F(s[kStats2]), *fc = F(s[kFc]),
          *gelu = F(s[kGelu]), *probs = F(s[kProbs]);
    std::vector<float> mean(rows), rstd(rows);
    LayerNormForward(x.data_as<float>(), p.ln1_w, p.ln1_b, rows, h, ln1, mean.data(), rstd.data());
    PackStats(mean, rstd, st1);
    Affine(ln1, p.qkv_w, p.qkv_b, rows, h, 3 * h, qkv);
    Attention(qkv, batch, probs, att);
    Affine(att, p.proj_w, p.proj_b, rows, h, h, x1);
    for (int64_t i = 0; i < rows * h; ++i) x1[i] += x.data_as<float>()[i];
    LayerNormForward(x1, p.ln2_w, p.ln2_b, rows, h, ln2, mean.data(), rstd.data());
    PackStats(mean, rstd, st2);
    Affine(ln2, p.fc_w, p.fc_b, rows, h, 4 * h, fc);
    for (int64_t i = 0; i < rows * 4 * h; ++i) {
      const float u = kGeluC * (fc[i] + 0.044715f * fc[i] * fc[i] * fc[i]);
      gelu[i] = 0.5f * fc[i] * (1.0f + std::tanh(u));
    }
    float* out = F(y);
    Affine(gelu, p.mlp_w, p.mlp_b, rows, 4 * h, h, out);
    for (int64_t i = 0; i < rows * h; ++i) out[i] += x1[i];
    return y;
  }

  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& x,
                                  const Tensor& grad_output) override {
    const int64_t rows = x.shape()[0], h = c_.hidden, batch = rows / c_.seq;
    MW_ASSIGN_OR_RETURN(Tensor dx_t, ctx.InputGradient({rows, h}));
    if (!ctx.computes()) return dx_t;
    P p{};
    MW_RETURN_IF_ERROR(Load(ctx, p));
    G g{};
    MW_RETURN_IF_ERROR(LoadGrads(ctx, g));
    std::vector<Tensor>& s = ctx.saved();
    const float* dy = grad_output.data_as<float>();
    float* dx = F(dx_t);
    // Scratch for this backward only (kept out of the activation books:
    // plain host vectors, as a kernel workspace would be).
    std::vector<float> d_gelu(rows * 4 * h), d_fc(rows * 4 * h), d_ln2(rows * h), d_x1(rows * h),
        d_att(rows * h), d_qkv(rows * 3 * h), d_ln1(rows * h), mean(rows), rstd(rows);
    // MLP: out = x1 + gelu(fc(ln2(x1))) W + b.
    AffineBackward(F(s[kGelu]), p.mlp_w, dy, rows, 4 * h, h, g.mlp_w, g.mlp_b, d_gelu.data(), false);
    const float* fc = F(s[kFc]);
    for (int64_t i = 0; i < rows * 4 * h; ++i) {
      const float u = kGeluC * (fc[i] + 0.044715f * fc[i] * fc[i] * fc[i]);
      const float t = std::tanh(u);
      const float du = kGeluC * (1.0f + 3.0f * 0.044715f * fc[i] * fc[i]);
      d_fc[i] = d_gelu[i] * (0.5f * (1.0f + t) + 0.5f * fc[i] * (1.0f - t * t) * du);
    }
    AffineBackward(F(s[kLn2]), p.fc_w, d_fc.data(), rows, h, 4 * h, g.fc_w, g.fc_b, d_ln2.data(),
                   false);
    UnpackStats(F(s[kStats2]), rows, mean, rstd);
    LayerNormBackward(d_ln2.data(), F(s[kResidual]), mean.data(), rstd.data(), p.ln2_w, rows, h,
                      d_x1.data(), g.ln2_w, g.ln2_b);
    for (int64_t i = 0; i < rows * h; ++i) d_x1[i] += dy[i];
    // Attention: x1 = x + attn(ln1(x)) W + b.
    AffineBackward(F(s[kAttn]), p.proj_w, d_x1.data(), rows, h, h, g.proj_w, g.proj_b,
                   d_att.data(), false);
    AttentionBackward(F(s[kQkv]), F(s[kProbs]), d_att.data(), batch, d_qkv.data());
    AffineBackward(F(s[kLn1]), p.qkv_w, d_qkv.data(), rows, h, 3 * h, g.qkv_w, g.qkv_b,
                   d_ln1.data(), false);
    UnpackStats(F(s[kStats1]), rows, mean, rstd);
    LayerNormBackward(d_ln1.data(), x.data_as<float>(), mean.data(), rstd.data(), p.ln1_w, rows,
                      h, dx, g.ln1_w, g.ln1_b);
    for (int64_t i = 0; i < rows * h; ++i) dx[i] += d_x1[i];
    return dx_t;
  }

 private:
  enum Saved { kLn1, kStats1, kQkv, kAttn, kResidual, kLn2, kStats2, kFc, kGelu, kProbs };
  struct P {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
        *mlp_w, *mlp_b;
  };
  struct G {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *mlp_w,
        *mlp_b;
  };
  static float* F(const Tensor& t) { return t.data_as<float>(); }

  // Parameters (Param) or gradients (Grad) by name into the struct.
  template <typename Ptrs, typename Get>
  static absl::Status Bind(Ptrs& out, Get get) {
    MW_ASSIGN_OR_RETURN(out.ln1_w, get("ln1_weight"));
    MW_ASSIGN_OR_RETURN(out.ln1_b, get("ln1_bias"));
    MW_ASSIGN_OR_RETURN(out.qkv_w, get("qkv_weight"));
    MW_ASSIGN_OR_RETURN(out.qkv_b, get("qkv_bias"));
    MW_ASSIGN_OR_RETURN(out.proj_w, get("attn_proj_weight"));
    MW_ASSIGN_OR_RETURN(out.proj_b, get("attn_proj_bias"));
    MW_ASSIGN_OR_RETURN(out.ln2_w, get("ln2_weight"));
    MW_ASSIGN_OR_RETURN(out.ln2_b, get("ln2_bias"));
    MW_ASSIGN_OR_RETURN(out.fc_w, get("fc_weight"));
    MW_ASSIGN_OR_RETURN(out.fc_b, get("fc_bias"));
    MW_ASSIGN_OR_RETURN(out.mlp_w, get("mlp_proj_weight"));
    MW_ASSIGN_OR_RETURN(out.mlp_b, get("mlp_proj_bias"));
    return absl::OkStatus();
  }
  static absl::Status Load(LayerContext& ctx, P& p) {
    return Bind(p, [&](const char* n) { return ctx.Param(n); });
  }
  static absl::Status LoadGrads(LayerContext& ctx, G& g) {
    return Bind(g, [&](const char* n) { return ctx.Grad(n); });
  }
  static void PackStats(const std::vector<float>& mean, const std::vector<float>& rstd, float* out) {
    for (size_t r = 0; r < mean.size(); ++r) {
      out[2 * r] = mean[r];
      out[2 * r + 1] = rstd[r];
    }
  }
  static void UnpackStats(const float* in, int64_t rows, std::vector<float>& mean,
                          std::vector<float>& rstd) {
    for (int64_t r = 0; r < rows; ++r) {
      mean[r] = in[2 * r];
      rstd[r] = in[2 * r + 1];
    }
  }

  // Per sequence b and head: scores = q k^T / sqrt(d), causal softmax into
  // probs, out = probs v. q, k, v are column slices of qkv [rows, 3h].
  void Attention(const float* qkv, int64_t batch, float* probs, float* out) const {
    const int64_t h = c_.hidden, s = c_.seq, d = h / c_.heads, ld = 3 * h;
    const float scale = 1.0f / std::sqrt(float(d));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t head = 0; head < c_.heads; ++head) {
        const float* q = qkv + b * s * ld + head * d;
        const float* k = q + h;
        const float* v = q + 2 * h;
        float* pr = probs + (b * c_.heads + head) * s * s;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, d, scale, q, ld, k, ld, 0.0f,
                    pr, s);
        for (int64_t i = 0; i < s; ++i) {
          float* row = pr + i * s;
          float max = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j) max = std::max(max, row[j]);
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            row[j] = std::exp(row[j] - max);
            sum += row[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
          for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, d, s, 1.0f, pr, s, v, ld, 0.0f,
                    out + b * s * h + head * d, h);
      }
    }
  }

  void AttentionBackward(const float* qkv, const float* probs, const float* d_out, int64_t batch,
                         float* d_qkv) const {
    const int64_t h = c_.hidden, s = c_.seq, d = h / c_.heads, ld = 3 * h;
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> dp(s * s);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t head = 0; head < c_.heads; ++head) {
        const float* q = qkv + b * s * ld + head * d;
        const float* k = q + h;
        const float* v = q + 2 * h;
        float* dq = d_qkv + b * s * ld + head * d;
        float* dk = dq + h;
        float* dv = dq + 2 * h;
        const float* pr = probs + (b * c_.heads + head) * s * s;
        const float* dout = d_out + b * s * h + head * d;
        // dP = dOut V^T; dV = P^T dOut.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, d, 1.0f, dout, h, v, ld, 0.0f,
                    dp.data(), s);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, d, s, 1.0f, pr, s, dout, h, 0.0f,
                    dv, ld);
        // dScores = P * (dP - rowsum(dP * P)), masked entries have P = 0.
        for (int64_t i = 0; i < s; ++i) {
          double dot = 0;
          for (int64_t j = 0; j <= i; ++j) dot += double(dp[i * s + j]) * pr[i * s + j];
          for (int64_t j = 0; j < s; ++j) {
            dp[i * s + j] = pr[i * s + j] * (dp[i * s + j] - static_cast<float>(dot));
          }
        }
        // dQ = dS K * scale; dK = dS^T Q * scale.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, d, s, scale, dp.data(), s, k, ld,
                    0.0f, dq, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, d, s, scale, dp.data(), s, q, ld,
                    0.0f, dk, ld);
      }
    }
  }

  const GptConfig c_;
};

// ---- Final LayerNorm and the LM head tied to the token embedding. ----
class GptHead final : public Layer {
 public:
  explicit GptHead(const GptConfig& c) : Layer("head"), c_(c) {}
  std::vector<ParameterDecl> Parameters() const override {
    return {{"ln_weight", {c_.hidden}, ParameterDecl::Init::kOnes, 0},
            {"ln_bias", {c_.hidden}, ParameterDecl::Init::kZeros, 0}};
  }
  std::vector<std::string> SharedParameters() const override { return {"embed.wte"}; }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.hidden) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer 'head': expected [rows, ", c_.hidden, "], got ", Shape(in)));
    }
    return std::vector<int64_t>{in[0], c_.vocab};
  }
  // The LayerNorm output and its stats, and the logits.
  int64_t ActivationBytes(const std::vector<int64_t>& in) const override {
    return 4 * in[0] * (c_.hidden + 2 + c_.vocab);
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    return 2.0 * in[0] * c_.hidden * c_.vocab;
  }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& x) override {
    MW_ASSIGN_OR_RETURN(std::vector<int64_t> shape, OutputShape(x.shape()));
    const int64_t rows = shape[0], h = c_.hidden;
    std::vector<Tensor>& s = ctx.saved();
    s.clear();
    MW_ASSIGN_OR_RETURN(Tensor z, ctx.Activation({rows, h}));
    MW_ASSIGN_OR_RETURN(Tensor stats, ctx.Activation({rows, 2}));
    MW_ASSIGN_OR_RETURN(Tensor logits, ctx.Activation(shape));
    if (ctx.computes()) {
      MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("ln_weight"));
      MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("ln_bias"));
      MW_ASSIGN_OR_RETURN(const float* wte, ctx.SharedParam("embed.wte"));
      std::vector<float> mean(rows), rstd(rows);
      LayerNormForward(x.data_as<float>(), w, b, rows, h, z.data_as<float>(), mean.data(),
                       rstd.data());
      for (int64_t r = 0; r < rows; ++r) {
        stats.data_as<float>()[2 * r] = mean[r];
        stats.data_as<float>()[2 * r + 1] = rstd[r];
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, c_.vocab, h, 1.0f,
                  z.data_as<float>(), h, wte, h, 0.0f, logits.data_as<float>(), c_.vocab);
    }
    s.push_back(std::move(z));
    s.push_back(std::move(stats));
    return logits;
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& x,
                                  const Tensor& grad_logits) override {
    const int64_t rows = x.shape()[0], h = c_.hidden;
    MW_ASSIGN_OR_RETURN(Tensor dx, ctx.InputGradient({rows, h}));
    if (!ctx.computes()) return dx;
    MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("ln_weight"));
    MW_ASSIGN_OR_RETURN(float* dw, ctx.Grad("ln_weight"));
    MW_ASSIGN_OR_RETURN(float* db, ctx.Grad("ln_bias"));
    MW_ASSIGN_OR_RETURN(const float* wte, ctx.SharedParam("embed.wte"));
    MW_ASSIGN_OR_RETURN(float* dwte, ctx.SharedGrad("embed.wte"));
    const float* z = ctx.saved()[0].data_as<float>();
    const float* stats = ctx.saved()[1].data_as<float>();
    const float* dl = grad_logits.data_as<float>();
    std::vector<float> dz(rows * h), mean(rows), rstd(rows);
    // logits = z wte^T: dz = dl wte; dwte += dl^T z.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, h, c_.vocab, 1.0f, dl, c_.vocab,
                wte, h, 0.0f, dz.data(), h);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c_.vocab, h, rows, 1.0f, dl, c_.vocab, z,
                h, 1.0f, dwte, h);
    for (int64_t r = 0; r < rows; ++r) {
      mean[r] = stats[2 * r];
      rstd[r] = stats[2 * r + 1];
    }
    LayerNormBackward(dz.data(), x.data_as<float>(), mean.data(), rstd.data(), w, rows, h,
                      dx.data_as<float>(), dw, db);
    return dx;
  }

 private:
  const GptConfig c_;
};

}  // namespace

absl::Status ValidateGptConfig(const GptConfig& c) {
  const std::pair<const char*, int64_t> fields[] = {
      {"vocab", c.vocab}, {"seq", c.seq}, {"hidden", c.hidden}, {"heads", c.heads},
      {"layers", c.layers}};
  for (const auto& [field, value] : fields) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("gpt ", field, ": expected >= 1, got ", value));
    }
  }
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt hidden: ", c.hidden,
                                                   " is not divisible by heads ", c.heads));
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> GptPreset(const std::string& name) {
  struct Preset {
    const char* name;
    GptConfig config;
  };
  static const Preset kPresets[] = {
      {"gpt-tiny", {256, 64, 64, 4, 2}},
      {"gpt2-124m", {50257, 1024, 768, 12, 12}},
      {"gpt2-350m", {50257, 1024, 1024, 16, 24}},
      {"gpt2-774m", {50257, 1024, 1280, 20, 36}},
      {"gpt2-1.5b", {50257, 1024, 1600, 25, 48}},
      {"gpt3-6.7b", {50257, 2048, 4096, 32, 32}},
      {"gpt3-13b", {50257, 2048, 5120, 40, 40}},
      {"gpt3-175b", {50257, 2048, 12288, 96, 96}},
  };
  std::vector<std::string> names;
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config;
    names.push_back(p.name);
  }
  return absl::NotFoundError(absl::StrCat("model '", name, "': expected one of ",
                                          absl::StrJoin(names, ", ")));
}

absl::StatusOr<GptConfig> ParseGptModel(const std::string& spec) {
  const size_t colon = spec.find(':');
  MW_ASSIGN_OR_RETURN(GptConfig config, GptPreset(spec.substr(0, colon)));
  if (colon == std::string::npos) return config;
  for (absl::string_view item : absl::StrSplit(spec.substr(colon + 1), ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    int64_t value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value)) {
      return absl::InvalidArgumentError(absl::StrCat("model '", spec, "': expected key=integer, got '",
                                                     item, "'"));
    }
    int64_t* field = kv[0] == "vocab"    ? &config.vocab
                     : kv[0] == "seq"    ? &config.seq
                     : kv[0] == "hidden" ? &config.hidden
                     : kv[0] == "heads"  ? &config.heads
                     : kv[0] == "layers" ? &config.layers
                                         : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec, "': unknown key '", kv[0], "' (known: vocab, seq, hidden, heads, layers)"));
    }
    *field = value;
  }
  MW_RETURN_IF_ERROR(ValidateGptConfig(config));
  return config;
}

int64_t GptParameterCount(const GptConfig& c) {
  const int64_t h = c.hidden;
  const int64_t block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) +
                        (4 * h * h + h);
  return c.vocab * h + c.seq * h + c.layers * block + 2 * h;
}

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> MakeGpt(const GptConfig& config) {
  MW_RETURN_IF_ERROR(ValidateGptConfig(config));
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<GptEmbedding>(config));
  for (int64_t l = 0; l < config.layers; ++l) {
    layers.push_back(std::make_unique<TransformerBlock>(absl::StrCat("block", l), config));
  }
  layers.push_back(std::make_unique<GptHead>(config));
  return layers;
}

absl::StatusOr<float> CrossEntropyLoss::Compute(LayerContext& ctx, const Tensor& logits,
                                                const Tensor& target, Tensor& grad_logits) {
  if (logits.shape().size() != 2 || target.numel() != logits.shape()[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cross-entropy loss: expected one target id per row of the logits ",
        Shape(logits.shape()), ", got ", target.numel()));
  }
  if (!ctx.computes()) return 0.0f;
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  const float* l = logits.data_as<float>();
  float* dl = grad_logits.data_as<float>();
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float t = target.data_as<float>()[r];
    if (!(t >= 0 && t < vocab) || t != std::floor(t)) {
      return absl::InvalidArgumentError(absl::StrCat("cross-entropy loss: target ", r, " is ", t,
                                                     "; expected an id in 0..", vocab - 1));
    }
    const float* row = l + r * vocab;
    float max = row[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max(max, row[j]);
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(row[j]) - max);
    const double log_sum = std::log(sum) + max;
    loss += log_sum - row[static_cast<int64_t>(t)];
    for (int64_t j = 0; j < vocab; ++j) {
      dl[r * vocab + j] = static_cast<float>(std::exp(double(row[j]) - log_sum) / rows);
    }
    dl[r * vocab + static_cast<int64_t>(t)] -= 1.0f / rows;
  }
  return static_cast<float>(loss / rows);
}

}  // namespace memwall
