#include "models/gpt.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "kernels/nn.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// y += x (n elements).
absl::Status AddInto(LayerContext& ctx, const float* x, float* y, int64_t n) {
  return kernels::Axpy(ctx.device(), ctx.stream(), 1.0f, x, y, n);
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// A tile's parameter name: "<weight>_tile<t>".
std::string TileName(absl::string_view weight, int64_t t) {
  return absl::StrCat(weight, "_tile", t);
}

// Whether the token embedding is in vocabulary tiles of their own
// (GptConfig::vocab_tiles, tile_parameters).
bool VocabTiled(const GptConfig& c) { return c.vocab_tiles > 1 && c.tile_parameters; }

// ---- Embedding: ids [batch, seq] -> wte[id] + wpe[position]. ----
class GptEmbedding final : public Layer {
 public:
  explicit GptEmbedding(const GptConfig& c) : Layer("embed"), c_(c) {}
  std::vector<ParameterDecl> Parameters() const override {
    std::vector<ParameterDecl> decls;
    if (!VocabTiled(c_)) {
      decls.push_back({"wte", {c_.vocab, c_.hidden}, ParameterDecl::Init::kNormal, 0.02f});
    }
    for (int64_t t = 0; VocabTiled(c_) && t < c_.vocab_tiles; ++t) {
      const auto [begin, end] = GptVocabTile(c_, t);
      ParameterDecl tile{
          TileName("wte", t), {end - begin, c_.hidden}, ParameterDecl::Init::kNormal, 0.02f};
      tile.tile_of = "wte";
      tile.whole_shape = {c_.vocab, c_.hidden};
      tile.row = begin;
      decls.push_back(std::move(tile));
    }
    decls.push_back({"wpe", {c_.seq, c_.hidden}, ParameterDecl::Init::kNormal, 0.01f});
    return decls;
  }
  // In vocabulary tiles: each tile alone, and the position table, which
  // every tile's rows add, alone.
  std::vector<std::vector<std::string>> UseGroups() const override {
    if (!VocabTiled(c_)) return {};
    std::vector<std::vector<std::string>> sets;
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) sets.push_back({TileName("wte", t)});
    sets.push_back({"wpe"});
    return sets;
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.seq || in[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("layer 'embed': expected token ids [batch, ",
                                                     c_.seq, "], got ", Shape(in)));
    }
    return std::vector<int64_t>{in[0] * c_.seq, c_.hidden};
  }
  int64_t ActivationBytes(const std::vector<int64_t>& in, DType dtype) const override {
    return in[0] * c_.seq * c_.hidden * static_cast<int64_t>(DTypeSize(dtype));
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    return double(in[0]) * c_.seq * c_.hidden;
  }
  // Token ids have no gradient.
  int64_t InputGradientBytes(const std::vector<int64_t>&) const override { return 0; }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& ids) override {
    MW_ASSIGN_OR_RETURN(std::vector<int64_t> shape, OutputShape(ids.shape()));
    MW_ASSIGN_OR_RETURN(Tensor out, ctx.Activation(shape));
    MW_ASSIGN_OR_RETURN(const float* id, ctx.Read(ids));
    MW_RETURN_IF_ERROR(kernels::CheckIds(ctx.device(), ctx.stream(), id, ids.numel(), c_.vocab,
                                         "layer 'embed': token"));
    // Tile by tile (one tile when untiled): each writes its tokens' rows.
    const float* whole = nullptr;
    if (!VocabTiled(c_)) {
      MW_ASSIGN_OR_RETURN(whole, ctx.Param("wte"));
    }
    MW_ASSIGN_OR_RETURN(const float* wpe, ctx.Param("wpe"));
    MW_ASSIGN_OR_RETURN(float* y, ctx.Stage(out));
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) {
      const auto [begin, end] = GptVocabTile(c_, t);
      const std::string tile = VocabTiled(c_) ? TileName("wte", t) : std::string();
      const float* w = nullptr;
      if (VocabTiled(c_)) {
        MW_ASSIGN_OR_RETURN(w, ctx.Param(tile));
      } else {
        w = whole + begin * c_.hidden;
      }
      MW_RETURN_IF_ERROR(kernels::EmbeddingForward(ctx.device(), ctx.stream(), id, w, begin, end,
                                                   wpe, shape[0], c_.seq, c_.hidden, y));
      if (VocabTiled(c_)) MW_RETURN_IF_ERROR(ctx.Release({tile}));
    }
    MW_RETURN_IF_ERROR(ctx.Commit(out));
    return out;
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& ids,
                                  const Tensor& grad_output) override {
    float* whole = nullptr;
    if (!VocabTiled(c_)) {
      MW_ASSIGN_OR_RETURN(whole, ctx.Grad("wte"));
    }
    MW_ASSIGN_OR_RETURN(float* dwpe, ctx.Grad("wpe"));
    MW_ASSIGN_OR_RETURN(const float* id, ctx.Read(ids));  // forward checked them
    // Tile by tile; the first adds the positions' gradient too. Each row's
    // gradient lands in its token's tile, so every element of the table
    // takes the adds of the untiled kernel, in its (row) order.
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) {
      const auto [begin, end] = GptVocabTile(c_, t);
      const std::string tile = VocabTiled(c_) ? TileName("wte", t) : std::string();
      float* dw = nullptr;
      if (VocabTiled(c_)) {
        MW_ASSIGN_OR_RETURN(dw, ctx.Grad(tile));
      } else {
        dw = whole + begin * c_.hidden;
      }
      MW_RETURN_IF_ERROR(kernels::EmbeddingBackward(
          ctx.device(), ctx.stream(), id, grad_output.data_as<float>(), ids.numel(), c_.seq,
          c_.hidden, begin, end, dw, t == 0 ? dwpe : nullptr));
      if (VocabTiled(c_)) {
        MW_RETURN_IF_ERROR(ctx.FlushGradient({tile}));
        MW_RETURN_IF_ERROR(ctx.Release({tile}));
      }
    }
    return Tensor();  // token ids have no gradient
  }

 private:
  const GptConfig c_;
};

// ---- A pre-LayerNorm transformer block. ----
// Saved per row, in the activation dtype: ln1 output (H), qkv (3H), the
// attention output before the projection (H), the residual after attention
// (H), ln2 output (H), MLP pre-activation (4H), GELU output (4H), the block's
// output (H); per sequence and head the causal softmax (seq x seq); and in
// f32 the two LayerNorms' mean and rstd (4 floats per row). With 16-bit
// activations: 32H + 16 bytes per row plus 2 heads seq^2 per sequence, under
// Megatron's 34H + 5 heads seq (per row) for the same block with dropout.
class TransformerBlock final : public Layer {
 public:
  TransformerBlock(std::string name, const GptConfig& c, bool frozen)
      : Layer(std::move(name)), c_(c), frozen_(frozen) {}

  std::vector<ParameterDecl> Parameters() const override {
    const int64_t h = c_.hidden;
    // GPT-2: residual projections scaled by 1/sqrt(2 * layers).
    const float proj = 0.02f / std::sqrt(2.0f * c_.layers);
    std::vector<ParameterDecl> decls = {{"ln1_weight", {h}, ParameterDecl::Init::kOnes, 0},
                                        {"ln1_bias", {h}, ParameterDecl::Init::kZeros, 0}};
    // A weight, whole or in tiles of columns, then its bias.
    const auto affine = [&](Names names, int64_t in, int64_t out, float stddev) {
      if (!tiled()) {
        decls.push_back({std::string(names[0]), {in, out}, ParameterDecl::Init::kNormal, stddev});
      }
      const int64_t width = out / c_.tiles;
      for (int64_t t = 0; tiled() && t < c_.tiles; ++t) {
        ParameterDecl tile{
            TileName(names[0], t), {in, width}, ParameterDecl::Init::kNormal, stddev};
        tile.tile_of = std::string(names[0]);
        tile.whole_shape = {in, out};
        tile.column = t * width;
        decls.push_back(std::move(tile));
      }
      decls.push_back({std::string(names[1]), {out}, ParameterDecl::Init::kZeros, 0});
    };
    affine(kQkvNames, h, 3 * h, 0.02f);
    affine(kProjNames, h, h, proj);
    decls.push_back({"ln2_weight", {h}, ParameterDecl::Init::kOnes, 0});
    decls.push_back({"ln2_bias", {h}, ParameterDecl::Init::kZeros, 0});
    affine(kFcNames, h, 4 * h, 0.02f);
    affine(kMlpNames, 4 * h, h, proj);
    for (ParameterDecl& decl : decls) decl.trainable = !frozen_;
    return decls;
  }
  // Each weight with its bias (a layer norm's scale with its shift): the
  // operations fetch them as these pairs (Params, Grads) and release them
  // after (Release, done).
  // Tiled: each tile alone, and each bias alone (broadcast, or summed,
  // once for all tiles).
  std::vector<std::vector<std::string>> UseGroups() const override {
    std::vector<std::vector<std::string>> sets;
    for (Names names : {Names(kLn1Names), Names(kQkvNames), Names(kProjNames), Names(kLn2Names),
                        Names(kFcNames), Names(kMlpNames)}) {
      const bool affine = names[0] != kLn1Names[0] && names[0] != kLn2Names[0];
      if (!affine || !tiled()) {
        sets.push_back({std::string(names[0]), std::string(names[1])});
        continue;
      }
      for (int64_t t = 0; t < c_.tiles; ++t) sets.push_back({TileName(names[0], t)});
      sets.push_back({std::string(names[1])});
    }
    return sets;
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.hidden || in[0] < 1 || in[0] % c_.seq != 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", name(), "': expected [batch * ",
                                                     c_.seq, ", ", c_.hidden, "], got ", Shape(in)));
    }
    return in;
  }
  int64_t ActivationBytes(const std::vector<int64_t>& in, DType dtype) const override {
    const int64_t rows = in[0], batch = rows / c_.seq;
    const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
    return size * (rows * 16 * c_.hidden + batch * c_.heads * c_.seq * c_.seq) + 4 * rows * 4;
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    const double rows = in[0], h = c_.hidden;
    // QKV, projection, MLP (2 x 4h^2) matmuls, and scores + values.
    return 2.0 * rows * (3 * h * h + h * h + 8 * h * h) + AttentionCoreFlops(rows);
  }
  // Selective mode keeps neither the softmax nor the attention output (the
  // "attention core" of Korthikanti et al.) and recomputes both from the
  // kept qkv at the start of backward.
  absl::optional<SelectiveProfile> Selective(const std::vector<int64_t>& in,
                                             DType dtype) const override {
    const int64_t rows = in[0], batch = rows / c_.seq;
    const int64_t core = static_cast<int64_t>(DTypeSize(dtype)) *
                         (rows * c_.hidden + batch * c_.heads * c_.seq * c_.seq);
    SelectiveProfile p;
    p.saved_bytes = ActivationBytes(in, dtype) - core;
    p.recomputed_bytes = core;
    p.extra_flops = AttentionCoreFlops(double(rows));
    return p;
  }

  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& x) override {
    MW_RETURN_IF_ERROR(OutputShape(x.shape()).status());
    const int64_t rows = x.shape()[0], h = c_.hidden, batch = rows / c_.seq;
    std::vector<Tensor>& s = ctx.saved();
    s.clear();
    // Allocation order matches Saved below; the statistics stay f32. In
    // selective mode the attention core is not kept (empty placeholders).
    for (const auto& [shape, dtype] : SavedShapes(rows, ctx.activation_dtype())) {
      const int i = static_cast<int>(s.size());
      if (ctx.selective() && (i == kAttn || i == kProbs)) {
        s.emplace_back();
        continue;
      }
      MW_ASSIGN_OR_RETURN(Tensor t, ctx.Activation(shape, dtype));
      s.push_back(std::move(t));
    }
    MW_ASSIGN_OR_RETURN(Tensor y, ctx.Activation({rows, h}));
    Device& d = ctx.device();
    Stream& st = ctx.stream();
    MW_ASSIGN_OR_RETURN(const float* in, ctx.Read(x));
    // Each activation is computed in f32 and committed (rounded into its
    // storage) after its last use in this forward.
    MW_ASSIGN_OR_RETURN(float* ln1, ctx.Stage(s[kLn1]));
    MW_ASSIGN_OR_RETURN(float* qkv, ctx.Stage(s[kQkv]));
    // Each parameter pair is fetched (in f32) for its one use and released.
    MW_ASSIGN_OR_RETURN(Pair p, Params(ctx, kLn1Names));
    MW_RETURN_IF_ERROR(
        kernels::LayerNormForward(d, st, in, p.w, p.b, rows, h, ln1, F(s[kStats1])));
    MW_RETURN_IF_ERROR(ctx.Release(kLn1Names));
    MW_RETURN_IF_ERROR(TiledAffine(ctx, kQkvNames, ln1, rows, h, 3 * h, qkv));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kLn1]));
    // Attention reads qkv as stored (rounded to the activation dtype), as a
    // recomputation in backward will: both give the same bits.
    MW_RETURN_IF_ERROR(ctx.Commit(s[kQkv]));
    MW_ASSIGN_OR_RETURN(const float* qkv_kept, ctx.Read(s[kQkv]));
    // In selective mode the softmax and attention output live in workspace
    // for this forward only.
    Tensor probs_ws, att_ws;
    float *probs, *att;
    if (ctx.selective()) {
      MW_ASSIGN_OR_RETURN(probs_ws, ctx.Workspace({batch, c_.heads, c_.seq, c_.seq}));
      MW_ASSIGN_OR_RETURN(att_ws, ctx.Workspace({rows, h}));
      probs = F(probs_ws);
      att = F(att_ws);
    } else {
      MW_ASSIGN_OR_RETURN(probs, ctx.Stage(s[kProbs]));
      MW_ASSIGN_OR_RETURN(att, ctx.Stage(s[kAttn]));
    }
    MW_RETURN_IF_ERROR(Attention(ctx, qkv_kept, batch, probs, att));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kProbs]));
    MW_ASSIGN_OR_RETURN(float* x1, ctx.Stage(s[kResidual]));
    MW_RETURN_IF_ERROR(TiledAffine(ctx, kProjNames, att, rows, h, h, x1));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kAttn]));
    MW_RETURN_IF_ERROR(AddInto(ctx, in, x1, rows * h));
    MW_ASSIGN_OR_RETURN(float* ln2, ctx.Stage(s[kLn2]));
    MW_ASSIGN_OR_RETURN(p, Params(ctx, kLn2Names));
    MW_RETURN_IF_ERROR(
        kernels::LayerNormForward(d, st, x1, p.w, p.b, rows, h, ln2, F(s[kStats2])));
    MW_RETURN_IF_ERROR(ctx.Release(kLn2Names));
    MW_ASSIGN_OR_RETURN(float* fc, ctx.Stage(s[kFc]));
    MW_RETURN_IF_ERROR(TiledAffine(ctx, kFcNames, ln2, rows, h, 4 * h, fc));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kLn2]));
    MW_ASSIGN_OR_RETURN(float* gelu, ctx.Stage(s[kGelu]));
    MW_RETURN_IF_ERROR(kernels::GeluForward(d, st, fc, gelu, rows * 4 * h));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kFc]));
    MW_ASSIGN_OR_RETURN(float* out, ctx.Stage(y));
    MW_RETURN_IF_ERROR(TiledAffine(ctx, kMlpNames, gelu, rows, 4 * h, h, out));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kGelu]));
    MW_RETURN_IF_ERROR(AddInto(ctx, x1, out, rows * h));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kResidual]));
    MW_RETURN_IF_ERROR(ctx.Commit(y));
    return y;
  }

  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& x,
                                  const Tensor& grad_output) override {
    const int64_t rows = x.shape()[0], h = c_.hidden, batch = rows / c_.seq;
    MW_ASSIGN_OR_RETURN(Tensor dx_t, ctx.InputGradient({rows, h}));
    std::vector<Tensor>& s = ctx.saved();
    if (ctx.selective()) MW_RETURN_IF_ERROR(RecomputeAttentionCore(ctx, rows));
    Device& d = ctx.device();
    Stream& st = ctx.stream();
    const float* dy = F(grad_output);
    float* dx = F(dx_t);
    // Scratch for this backward only: workspace, outside the activation books.
    MW_ASSIGN_OR_RETURN(Tensor d_big, ctx.Workspace({rows, 4 * h}));  // d_gelu, then d_fc
    MW_ASSIGN_OR_RETURN(Tensor d_ln, ctx.Workspace({rows, h}));       // d_ln2, then d_att
    MW_ASSIGN_OR_RETURN(Tensor d_x1_t, ctx.Workspace({rows, h}));
    MW_ASSIGN_OR_RETURN(Tensor d_qkv_t, ctx.Workspace({rows, 3 * h}));
    float *d_mlp = F(d_big), *d_small = F(d_ln), *d_x1 = F(d_x1_t), *d_qkv = F(d_qkv_t);
    // Saved activations as f32, each read back just before its first use.
    auto read = [&](Saved i) { return ctx.Read(s[i]); };
    // MLP: out = x1 + gelu(fc(ln2(x1))) W + b.
    // Each pair's f32 copy and gradient live only around the op that uses
    // them: fetched, used, the gradient flushed, the copy released.
    auto done = [&ctx](Names names) -> absl::Status {
      MW_RETURN_IF_ERROR(ctx.FlushGradient(names));
      return ctx.Release(names);
    };
    MW_ASSIGN_OR_RETURN(const float* gelu, read(kGelu));
    MW_RETURN_IF_ERROR(TiledAffineBackward(ctx, kMlpNames, gelu, dy, rows, 4 * h, h, d_mlp));
    MW_ASSIGN_OR_RETURN(const float* fc, read(kFc));
    MW_RETURN_IF_ERROR(kernels::GeluBackward(d, st, fc, d_mlp, d_mlp, rows * 4 * h));
    MW_ASSIGN_OR_RETURN(const float* ln2, read(kLn2));
    MW_RETURN_IF_ERROR(TiledAffineBackward(ctx, kFcNames, ln2, d_mlp, rows, h, 4 * h, d_small));
    MW_ASSIGN_OR_RETURN(const float* x1, read(kResidual));
    MW_ASSIGN_OR_RETURN(Pair p, Params(ctx, kLn2Names));
    MW_ASSIGN_OR_RETURN(GradPair g, LayerNormGrads(ctx, kLn2Names));
    MW_RETURN_IF_ERROR(kernels::LayerNormBackward(d, st, d_small, x1, F(s[kStats2]), p.w, rows, h,
                                                  d_x1, g.w, g.b));
    MW_RETURN_IF_ERROR(done(kLn2Names));
    MW_RETURN_IF_ERROR(AddInto(ctx, dy, d_x1, rows * h));
    // Attention: x1 = x + attn(ln1(x)) W + b.
    MW_ASSIGN_OR_RETURN(const float* att, read(kAttn));
    MW_RETURN_IF_ERROR(TiledAffineBackward(ctx, kProjNames, att, d_x1, rows, h, h, d_small));
    MW_ASSIGN_OR_RETURN(const float* qkv, read(kQkv));
    MW_ASSIGN_OR_RETURN(const float* probs, read(kProbs));
    MW_RETURN_IF_ERROR(AttentionBackward(ctx, qkv, probs, d_small, batch, d_qkv));
    MW_ASSIGN_OR_RETURN(const float* ln1, read(kLn1));
    MW_RETURN_IF_ERROR(TiledAffineBackward(ctx, kQkvNames, ln1, d_qkv, rows, h, 3 * h, d_small));
    MW_ASSIGN_OR_RETURN(const float* in, ctx.Read(x));
    MW_ASSIGN_OR_RETURN(p, Params(ctx, kLn1Names));
    MW_ASSIGN_OR_RETURN(g, LayerNormGrads(ctx, kLn1Names));
    MW_RETURN_IF_ERROR(kernels::LayerNormBackward(d, st, d_small, in, F(s[kStats1]), p.w, rows, h,
                                                  dx, g.w, g.b));
    MW_RETURN_IF_ERROR(done(kLn1Names));
    MW_RETURN_IF_ERROR(AddInto(ctx, d_x1, dx, rows * h));
    return dx_t;
  }

 private:
  enum Saved { kLn1, kStats1, kQkv, kAttn, kResidual, kLn2, kStats2, kFc, kGelu, kProbs };
  // The shapes and dtypes of Saved, in order.
  std::vector<std::pair<std::vector<int64_t>, DType>> SavedShapes(int64_t rows, DType act) const {
    const int64_t h = c_.hidden, batch = rows / c_.seq;
    const DType f32 = DType::kF32;
    return {{{rows, h}, act},     {{rows, 2}, f32},     {{rows, 3 * h}, act}, {{rows, h}, act},
            {{rows, h}, act},     {{rows, h}, act},     {{rows, 2}, f32},     {{rows, 4 * h}, act},
            {{rows, 4 * h}, act}, {{batch, c_.heads, c_.seq, c_.seq}, act}};
  }
  // Scores and values: 2 s^2 d FLOPs each per sequence and head.
  double AttentionCoreFlops(double rows) const { return 4.0 * rows * c_.seq * c_.hidden; }

  // Selective mode, start of backward: the softmax and the attention output
  // again, from the kept qkv, stored as forward would have stored them.
  absl::Status RecomputeAttentionCore(LayerContext& ctx, int64_t rows) {
    std::vector<Tensor>& s = ctx.saved();
    const auto shapes = SavedShapes(rows, ctx.activation_dtype());
    MW_ASSIGN_OR_RETURN(s[kAttn], ctx.Activation(shapes[kAttn].first));
    MW_ASSIGN_OR_RETURN(s[kProbs], ctx.Activation(shapes[kProbs].first));
    MW_ASSIGN_OR_RETURN(const float* qkv, ctx.Read(s[kQkv]));
    MW_ASSIGN_OR_RETURN(float* att, ctx.Stage(s[kAttn]));
    MW_ASSIGN_OR_RETURN(float* probs, ctx.Stage(s[kProbs]));
    MW_RETURN_IF_ERROR(Attention(ctx, qkv, rows / c_.seq, probs, att));
    MW_RETURN_IF_ERROR(ctx.Commit(s[kAttn]));
    return ctx.Commit(s[kProbs]);
  }

  // A weight and its bias, by local name, in f32 for one use.
  using Names = absl::Span<const absl::string_view>;
  static constexpr absl::string_view kLn1Names[] = {"ln1_weight", "ln1_bias"};
  static constexpr absl::string_view kQkvNames[] = {"qkv_weight", "qkv_bias"};
  static constexpr absl::string_view kProjNames[] = {"attn_proj_weight", "attn_proj_bias"};
  static constexpr absl::string_view kLn2Names[] = {"ln2_weight", "ln2_bias"};
  static constexpr absl::string_view kFcNames[] = {"fc_weight", "fc_bias"};
  static constexpr absl::string_view kMlpNames[] = {"mlp_proj_weight", "mlp_proj_bias"};
  struct Pair {
    const float* w;
    const float* b;
  };
  struct GradPair {
    float* w;
    float* b;
  };
  static absl::StatusOr<Pair> Params(LayerContext& ctx, Names names) {
    Pair p{};
    MW_ASSIGN_OR_RETURN(p.w, ctx.Param(names[0]));
    MW_ASSIGN_OR_RETURN(p.b, ctx.Param(names[1]));
    return p;
  }
  static absl::StatusOr<GradPair> Grads(LayerContext& ctx, Names names) {
    GradPair g{};
    MW_ASSIGN_OR_RETURN(g.w, ctx.Grad(names[0]));
    MW_ASSIGN_OR_RETURN(g.b, ctx.Grad(names[1]));
    return g;
  }
  // A layer norm's scale and shift gradients; frozen, a workspace the
  // kernel's (unused) sums land in, so the input's gradient is computed
  // as always.
  absl::StatusOr<GradPair> LayerNormGrads(LayerContext& ctx, Names names) const {
    if (!frozen_) return Grads(ctx, names);
    MW_ASSIGN_OR_RETURN(Tensor scratch, ctx.Workspace({2, c_.hidden}));
    return GradPair{F(scratch), F(scratch) + c_.hidden};
  }

  // Tiles (GptConfig::tiles): each weight in parameters of its own.
  bool tiled() const { return c_.tiles > 1 && c_.tile_parameters; }

  // y[rows, out] = x[rows, in] W[in, out] + b, the bias broadcast first and
  // then each of the c_.tiles blocks of columns by its own GEMM. Tiled, the
  // bias and each tile are fetched, used and released in turn; whole, the
  // weight and bias are fetched once (the same GEMMs: bit for bit).
  absl::Status TiledAffine(LayerContext& ctx, Names names, const float* x, int64_t rows, int64_t in,
                           int64_t out, float* y) const {
    Device& d = ctx.device();
    Stream& st = ctx.stream();
    const int64_t width = out / c_.tiles;
    Pair whole{};
    if (!tiled()) {
      MW_ASSIGN_OR_RETURN(whole, Params(ctx, names));
    } else {
      MW_ASSIGN_OR_RETURN(whole.b, ctx.Param(names[1]));
    }
    MW_RETURN_IF_ERROR(kernels::BroadcastRows(d, st, whole.b, rows, out, y));
    if (tiled()) MW_RETURN_IF_ERROR(ctx.Release(names.subspan(1)));
    for (int64_t t = 0; t < c_.tiles; ++t) {
      const std::string tile = tiled() ? TileName(names[0], t) : std::string();
      const absl::string_view local[] = {tile};
      const float* w = nullptr;
      if (tiled()) {
        MW_ASSIGN_OR_RETURN(w, ctx.Param(tile));
      } else {
        w = whole.w + t * width;
      }
      MW_RETURN_IF_ERROR(kernels::Gemm(d, st, false, false, rows, width, in, 1.0f, x, in, w,
                                       tiled() ? width : out, 1.0f, y + t * width, out));
      if (tiled()) MW_RETURN_IF_ERROR(ctx.Release(local));
    }
    if (!tiled()) MW_RETURN_IF_ERROR(ctx.Release(names));
    return absl::OkStatus();
  }

  // Its backward: dW += x^T dy and dx = dy W^T, block of columns by block
  // (dx: block 0 writes, the rest add, in order), and db += colsum(dy) once.
  // Each parameter's gradient is flushed and the parameter released after
  // its last use (LayerContext::FlushGradient, Release).
  absl::Status TiledAffineBackward(LayerContext& ctx, Names names, const float* x, const float* dy,
                                   int64_t rows, int64_t in, int64_t out, float* dx) const {
    Device& d = ctx.device();
    Stream& st = ctx.stream();
    const int64_t width = out / c_.tiles;
    const auto done = [&ctx](Names locals) -> absl::Status {
      MW_RETURN_IF_ERROR(ctx.FlushGradient(locals));
      return ctx.Release(locals);
    };
    Pair whole{};
    GradPair grads{};
    if (!tiled()) {
      MW_ASSIGN_OR_RETURN(whole, Params(ctx, names));
      if (!frozen_) {
        MW_ASSIGN_OR_RETURN(grads, Grads(ctx, names));
      }
    }
    for (int64_t t = 0; t < c_.tiles; ++t) {
      const std::string tile = tiled() ? TileName(names[0], t) : std::string();
      const absl::string_view local[] = {tile};
      const float* w = nullptr;
      float* dw = nullptr;
      if (tiled()) {
        MW_ASSIGN_OR_RETURN(w, ctx.Param(tile));
        if (!frozen_) {
          MW_ASSIGN_OR_RETURN(dw, ctx.Grad(tile));
        }
      } else {
        w = whole.w + t * width;
        if (!frozen_) dw = grads.w + t * width;
      }
      const int64_t ld = tiled() ? width : out;
      // Frozen: no weight or bias gradient, only the input's.
      if (!frozen_) {
        MW_RETURN_IF_ERROR(kernels::Gemm(d, st, true, false, in, width, rows, 1.0f, x, in,
                                         dy + t * width, out, 1.0f, dw, ld));
      }
      if (!frozen_ && !tiled() && t == 0) {
        MW_RETURN_IF_ERROR(kernels::ColumnSum(d, st, dy, rows, out, grads.b));
      }
      MW_RETURN_IF_ERROR(kernels::Gemm(d, st, false, true, rows, in, width, 1.0f, dy + t * width,
                                       out, w, ld, t == 0 ? 0.0f : 1.0f, dx, in));
      if (tiled()) MW_RETURN_IF_ERROR(done(local));
    }
    if (!tiled()) return done(names);
    if (!frozen_) {
      MW_ASSIGN_OR_RETURN(float* db, ctx.Grad(names[1]));
      MW_RETURN_IF_ERROR(kernels::ColumnSum(d, st, dy, rows, out, db));
    }
    return done(names.subspan(1));
  }

  static float* F(const Tensor& t) { return t.data_as<float>(); }

  // Per sequence b and head: scores = q k^T / sqrt(d), causal softmax into
  // probs, out = probs v. q, k, v are column slices of qkv [rows, 3h].
  absl::Status Attention(LayerContext& ctx, const float* qkv, int64_t batch, float* probs,
                         float* out) const {
    const int64_t h = c_.hidden, s = c_.seq, d = h / c_.heads, ld = 3 * h;
    const float scale = 1.0f / std::sqrt(float(d));
    Device& dev = ctx.device();
    Stream& st = ctx.stream();
    // A dry run computes nothing: the per-sequence, per-head products
    // (which allocate nothing) are counted, one launch each, not called,
    // so its cost does not grow with the batch (a plan at micro-batch 1e8
    // made 8e8 empty calls).
    const int64_t products = batch * c_.heads;
    if (!dev.holds_bytes()) {
      dev.CountLaunch(products);
      MW_RETURN_IF_ERROR(kernels::CausalSoftmaxForward(dev, st, probs, products, s));
      dev.CountLaunch(products);
      return absl::OkStatus();
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t head = 0; head < c_.heads; ++head) {
        const float* q = qkv + b * s * ld + head * d;
        MW_RETURN_IF_ERROR(kernels::Gemm(dev, st, false, true, s, s, d, scale, q, ld, q + h, ld,
                                         0.0f, probs + (b * c_.heads + head) * s * s, s));
      }
    }
    MW_RETURN_IF_ERROR(kernels::CausalSoftmaxForward(dev, st, probs, products, s));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t head = 0; head < c_.heads; ++head) {
        const float* v = qkv + b * s * ld + head * d + 2 * h;
        MW_RETURN_IF_ERROR(kernels::Gemm(dev, st, false, false, s, d, s, 1.0f,
                                         probs + (b * c_.heads + head) * s * s, s, v, ld, 0.0f,
                                         out + b * s * h + head * d, h));
      }
    }
    return absl::OkStatus();
  }

  absl::Status AttentionBackward(LayerContext& ctx, const float* qkv, const float* probs,
                                 const float* d_out, int64_t batch, float* d_qkv) const {
    const int64_t h = c_.hidden, s = c_.seq, d = h / c_.heads, ld = 3 * h;
    const float scale = 1.0f / std::sqrt(float(d));
    Device& dev = ctx.device();
    Stream& st = ctx.stream();
    MW_ASSIGN_OR_RETURN(Tensor dp_t, ctx.Workspace({s, s}));
    float* dp = F(dp_t);
    if (!dev.holds_bytes()) {  // counted as in Attention: 4 products and a softmax a head
      dev.CountLaunch(5 * batch * c_.heads);
      return absl::OkStatus();
    }
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
        // dP = dOut V^T; dV = P^T dOut; dS = softmax backward of dP.
        MW_RETURN_IF_ERROR(
            kernels::Gemm(dev, st, false, true, s, s, d, 1.0f, dout, h, v, ld, 0.0f, dp, s));
        MW_RETURN_IF_ERROR(
            kernels::Gemm(dev, st, true, false, s, d, s, 1.0f, pr, s, dout, h, 0.0f, dv, ld));
        MW_RETURN_IF_ERROR(kernels::CausalSoftmaxBackward(dev, st, pr, dp, 1, s));
        // dQ = dS K * scale; dK = dS^T Q * scale.
        MW_RETURN_IF_ERROR(
            kernels::Gemm(dev, st, false, false, s, d, s, scale, dp, s, k, ld, 0.0f, dq, ld));
        MW_RETURN_IF_ERROR(
            kernels::Gemm(dev, st, true, false, s, d, s, scale, dp, s, q, ld, 0.0f, dk, ld));
      }
    }
    return absl::OkStatus();
  }

  const GptConfig c_;
  const bool frozen_;  // GptConfig::frozen_blocks
};

// ---- Final LayerNorm and the LM head tied to the token embedding. ----
class GptHead final : public Layer {
 public:
  explicit GptHead(const GptConfig& c) : Layer("head"), c_(c) {}
  std::vector<ParameterDecl> Parameters() const override {
    return {{"ln_weight", {c_.hidden}, ParameterDecl::Init::kOnes, 0},
            {"ln_bias", {c_.hidden}, ParameterDecl::Init::kZeros, 0}};
  }
  std::vector<std::string> SharedParameters() const override {
    if (!VocabTiled(c_)) return {"embed.wte"};
    std::vector<std::string> tiles;
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) tiles.push_back(SharedTile(t));
    return tiles;
  }
  // In vocabulary tiles: the LayerNorm's pair; the shared tiles are fetched
  // and released one by one around their GEMMs.
  std::vector<std::vector<std::string>> UseGroups() const override {
    if (!VocabTiled(c_)) return {};
    return {{"ln_weight", "ln_bias"}};
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    if (in.size() != 2 || in[1] != c_.hidden) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer 'head': expected [rows, ", c_.hidden, "], got ", Shape(in)));
    }
    return std::vector<int64_t>{in[0], c_.vocab};
  }
  // The LayerNorm output and the logits in the activation dtype, the
  // LayerNorm's mean and rstd in f32.
  int64_t ActivationBytes(const std::vector<int64_t>& in, DType dtype) const override {
    return static_cast<int64_t>(DTypeSize(dtype)) * in[0] * (c_.hidden + c_.vocab) + 4 * in[0] * 2;
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
    MW_ASSIGN_OR_RETURN(Tensor stats, ctx.Activation({rows, 2}, DType::kF32));
    MW_ASSIGN_OR_RETURN(Tensor logits, ctx.Activation(shape));
    MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("ln_weight"));
    MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("ln_bias"));
    const float* whole = nullptr;
    if (!VocabTiled(c_)) {
      MW_ASSIGN_OR_RETURN(whole, ctx.SharedParam("embed.wte"));
    }
    MW_ASSIGN_OR_RETURN(const float* in, ctx.Read(x));
    MW_ASSIGN_OR_RETURN(float* zf, ctx.Stage(z));
    MW_RETURN_IF_ERROR(kernels::LayerNormForward(ctx.device(), ctx.stream(), in, w, b, rows, h, zf,
                                                 stats.data_as<float>()));
    // Tiled, the pair goes before the tiles come (untiled, with the layer).
    if (VocabTiled(c_)) MW_RETURN_IF_ERROR(ctx.Release(kLnNames));
    MW_ASSIGN_OR_RETURN(float* lf, ctx.Stage(logits));
    // logits[:, tile] = z wte[tile]^T, tile by tile.
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) {
      const auto [begin, end] = GptVocabTile(c_, t);
      const float* wte = nullptr;
      if (VocabTiled(c_)) {
        MW_ASSIGN_OR_RETURN(wte, ctx.SharedParam(SharedTile(t)));
      } else {
        wte = whole + begin * h;
      }
      MW_RETURN_IF_ERROR(kernels::Gemm(ctx.device(), ctx.stream(), false, true, rows, end - begin,
                                       h, 1.0f, zf, h, wte, h, 0.0f, lf + begin, c_.vocab));
      if (VocabTiled(c_)) MW_RETURN_IF_ERROR(ctx.ReleaseShared({SharedTile(t)}));
    }
    MW_RETURN_IF_ERROR(ctx.Commit(z));
    MW_RETURN_IF_ERROR(ctx.Commit(logits));
    s.push_back(std::move(z));
    s.push_back(std::move(stats));
    return logits;
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& x,
                                  const Tensor& grad_logits) override {
    const int64_t rows = x.shape()[0], h = c_.hidden;
    MW_ASSIGN_OR_RETURN(Tensor dx, ctx.InputGradient({rows, h}));
    // The LayerNorm's pair: untiled, with the whole table, for the layer;
    // tiled, after the tiles, for its own operation only.
    const float* w = nullptr;
    float* dw = nullptr;
    float* db = nullptr;
    const auto fetch_ln = [&]() -> absl::Status {
      MW_ASSIGN_OR_RETURN(w, ctx.Param("ln_weight"));
      MW_ASSIGN_OR_RETURN(dw, ctx.Grad("ln_weight"));
      MW_ASSIGN_OR_RETURN(db, ctx.Grad("ln_bias"));
      return absl::OkStatus();
    };
    const float* whole = nullptr;
    float* dwhole = nullptr;
    if (!VocabTiled(c_)) {
      MW_RETURN_IF_ERROR(fetch_ln());
      MW_ASSIGN_OR_RETURN(whole, ctx.SharedParam("embed.wte"));
      MW_ASSIGN_OR_RETURN(dwhole, ctx.SharedGrad("embed.wte"));
    }
    MW_ASSIGN_OR_RETURN(const float* z, ctx.Read(ctx.saved()[0]));
    const float* stats = ctx.saved()[1].data_as<float>();
    MW_ASSIGN_OR_RETURN(const float* in, ctx.Read(x));
    const float* dl = grad_logits.data_as<float>();
    Device& d = ctx.device();
    MW_ASSIGN_OR_RETURN(Tensor dz, ctx.Workspace({rows, h}));
    // logits = z wte^T, tile by tile: dz = dl wte (tile 0 writes, the
    // others add); dwte[tile] += dl[:, tile]^T z.
    for (int64_t t = 0; t < c_.vocab_tiles; ++t) {
      const auto [begin, end] = GptVocabTile(c_, t);
      const float* wte = nullptr;
      float* dwte = nullptr;
      if (VocabTiled(c_)) {
        MW_ASSIGN_OR_RETURN(wte, ctx.SharedParam(SharedTile(t)));
        MW_ASSIGN_OR_RETURN(dwte, ctx.SharedGrad(SharedTile(t)));
      } else {
        wte = whole + begin * h;
        dwte = dwhole + begin * h;
      }
      MW_RETURN_IF_ERROR(kernels::Gemm(d, ctx.stream(), false, false, rows, h, end - begin, 1.0f,
                                       dl + begin, c_.vocab, wte, h, t == 0 ? 0.0f : 1.0f,
                                       dz.data_as<float>(), h));
      MW_RETURN_IF_ERROR(kernels::Gemm(d, ctx.stream(), true, false, end - begin, h, rows, 1.0f,
                                       dl + begin, c_.vocab, z, h, 1.0f, dwte, h));
      if (VocabTiled(c_)) {
        MW_RETURN_IF_ERROR(ctx.FlushSharedGradient({SharedTile(t)}));
        MW_RETURN_IF_ERROR(ctx.ReleaseShared({SharedTile(t)}));
      }
    }
    if (VocabTiled(c_)) MW_RETURN_IF_ERROR(fetch_ln());
    MW_RETURN_IF_ERROR(kernels::LayerNormBackward(d, ctx.stream(), dz.data_as<float>(), in, stats,
                                                  w, rows, h, dx.data_as<float>(), dw, db));
    return dx;
  }

 private:
  static constexpr absl::string_view kLnNames[] = {"ln_weight", "ln_bias"};
  static std::string SharedTile(int64_t t) { return TileName("embed.wte", t); }

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
  if (c.tiles < 1 || c.hidden % c.tiles != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt tiles: expected a divisor of hidden ", c.hidden, ", got ", c.tiles));
  }
  if (c.vocab_tiles < 1 || c.vocab_tiles > c.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt vocab_tiles: expected 1..vocab (", c.vocab, "), got ", c.vocab_tiles));
  }
  if (c.frozen_blocks < 0 || c.frozen_blocks > c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("gpt frozen_blocks: expected 0..layers (",
                                                   c.layers, "), got ", c.frozen_blocks));
  }
  // Every layer is an object, a chain link and a flat group in a dry run:
  // bounded so that a plan's host memory and time stay bounded (the
  // deepest published transformers have a few hundred layers).
  if (c.layers > kMaxGptLayers) {
    return absl::InvalidArgumentError(absl::StrCat("gpt layers: ", c.layers, "; at most ",
                                                   kMaxGptLayers, " are supported"));
  }
  // Counted in doubles first: the int64 arithmetic of GptParameterCount and
  // of every tensor size must not overflow (found by fuzzing --model).
  const double h = double(c.hidden);
  const double parameters = (double(c.vocab) + double(c.seq) + 2) * h +
                            double(c.layers) * (12 * h * h + 13 * h);
  const double activations = double(c.seq) * double(c.seq) * double(c.heads);
  if (!(parameters <= kMaxGptParameters) || !(activations <= kMaxGptParameters)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gpt: %.3g parameters (%.3g attention scores per sequence); at most %.0e are supported",
        parameters, activations, kMaxGptParameters));
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

GptConfig GptShapeForParameters(double parameters) {
  // GPT-3's family: layers = heads = hidden / 128, so 12 layers hidden^2 =
  // 12 hidden^3 / 128 parameters in the blocks; solve for hidden, rounded to
  // a multiple of 128 (at least 128).
  const double hidden = std::cbrt(std::max(parameters, 1.0) * 128.0 / 12.0);
  GptConfig c;
  c.vocab = 50257;
  c.seq = 2048;
  c.hidden = std::max<int64_t>(128, std::llround(hidden / 128.0) * 128);
  c.heads = c.hidden / 128;
  c.layers = c.hidden / 128;
  return c;
}

absl::StatusOr<GptConfig> ParseGptModel(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string base = spec.substr(0, colon);
  GptConfig config;
  if (base == "gpt") {
    // "gpt:" needs a shape: params=N (the rule above) or the explicit keys.
    config = GptShapeForParameters(1.5e9);
    config.layers = config.hidden = config.heads = 0;
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model 'gpt': expected gpt:params=N or gpt:layers=L,hidden=H,heads=A[,seq=S,vocab=V]"));
    }
  } else {
    MW_ASSIGN_OR_RETURN(config, GptPreset(base));
  }
  if (colon == std::string::npos) return config;
  for (absl::string_view item : absl::StrSplit(spec.substr(colon + 1), ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() == 2 && kv[0] == "params") {
      double parameters = 0;
      if (!absl::SimpleAtod(kv[1], &parameters) || !(parameters >= 1) ||
          !(parameters <= kMaxGptParameters)) {
        return absl::InvalidArgumentError(absl::StrCat("model '", spec,
                                                       "': params: expected a count such as 80e9 "
                                                       "(1 to 1e18), got '", kv[1], "'"));
      }
      const GptConfig shape = GptShapeForParameters(parameters);
      config.hidden = shape.hidden;
      config.heads = shape.heads;
      config.layers = shape.layers;
      continue;
    }
    int64_t value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value)) {
      return absl::InvalidArgumentError(absl::StrCat("model '", spec, "': expected key=integer, got '",
                                                     item, "'"));
    }
    int64_t* field = kv[0] == "vocab"           ? &config.vocab
                     : kv[0] == "seq"           ? &config.seq
                     : kv[0] == "hidden"        ? &config.hidden
                     : kv[0] == "heads"         ? &config.heads
                     : kv[0] == "layers"        ? &config.layers
                     : kv[0] == "tiles"         ? &config.tiles
                     : kv[0] == "vocab_tiles"   ? &config.vocab_tiles
                     : kv[0] == "frozen_blocks" ? &config.frozen_blocks
                                                : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec, "': unknown key '", kv[0],
          "' (known: vocab, seq, hidden, heads, layers, tiles, vocab_tiles, frozen_blocks, "
          "params)"));
    }
    *field = value;
  }
  MW_RETURN_IF_ERROR(ValidateGptConfig(config));
  return config;
}

std::pair<int64_t, int64_t> GptVocabTile(const GptConfig& c, int64_t t) {
  // Sizes q + 1 for the first r tiles, q for the rest (no product of two
  // sizes, so no overflow).
  const int64_t q = c.vocab / c.vocab_tiles, r = c.vocab % c.vocab_tiles;
  const int64_t begin = t * q + std::min(t, r);
  return {begin, begin + q + (t < r ? 1 : 0)};
}

std::string GptDescription(const GptConfig& config) {
  std::string out = absl::StrFormat("gpt:vocab=%d,seq=%d,hidden=%d,heads=%d,layers=%d",
                                    config.vocab, config.seq, config.hidden, config.heads,
                                    config.layers);
  if (config.tiles > 1) absl::StrAppend(&out, ",tiles=", config.tiles);
  if (config.vocab_tiles > 1) absl::StrAppend(&out, ",vocab_tiles=", config.vocab_tiles);
  if (config.frozen_blocks > 0) absl::StrAppend(&out, ",frozen_blocks=", config.frozen_blocks);
  return out;
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
    layers.push_back(std::make_unique<TransformerBlock>(absl::StrCat("block", l), config,
                                                        l < config.frozen_blocks));
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
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  MW_ASSIGN_OR_RETURN(const float* t, ctx.Read(target));
  MW_RETURN_IF_ERROR(
      kernels::CheckIds(ctx.device(), ctx.stream(), t, rows, vocab, "cross-entropy loss: target"));
  MW_ASSIGN_OR_RETURN(const float* l, ctx.Read(logits));
  MW_ASSIGN_OR_RETURN(const double sum,
                      kernels::CrossEntropy(ctx.device(), ctx.stream(), l, t, rows, vocab,
                                            1.0f / rows, grad_logits.data_as<float>()));
  return static_cast<float>(sum / rows);
}

}  // namespace memwall
