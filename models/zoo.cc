#include "models/zoo.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"
#include "sharding/flat_layout.h"

namespace memwall {
namespace {

using Shape = std::vector<int64_t>;

// What a shape-only layer computes from its input shape.
struct ShapeRule {
  Shape output;
  int64_t saved_elements = 0;  // elements kept for backward, besides the output
  double flops = 0;
};

class ShapeLayer final : public Layer {
 public:
  ShapeLayer(std::string name, std::vector<ParameterDecl> params,
             std::function<absl::StatusOr<ShapeRule>(const Shape&)> rule)
      : Layer(std::move(name)), params_(std::move(params)), rule_(std::move(rule)) {}

  std::vector<ParameterDecl> Parameters() const override { return params_; }
  absl::StatusOr<Shape> OutputShape(const Shape& in) const override {
    MW_ASSIGN_OR_RETURN(ShapeRule r, rule_(in));
    return r.output;
  }
  int64_t ActivationBytes(const Shape& in, DType dtype) const override {
    const absl::StatusOr<ShapeRule> r = rule_(in);
    if (!r.ok()) return 0;
    return static_cast<int64_t>(DTypeSize(dtype)) * (r->saved_elements + NumElements(r->output));
  }
  double ForwardFlops(const Shape& in) const override {
    const absl::StatusOr<ShapeRule> r = rule_(in);
    return r.ok() ? r->flops : 0.0;
  }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& input) override {
    MW_RETURN_IF_ERROR(Computable(ctx));
    MW_ASSIGN_OR_RETURN(ShapeRule r, rule_(input.shape()));
    ctx.saved().clear();
    if (r.saved_elements > 0) {
      MW_ASSIGN_OR_RETURN(Tensor saved, ctx.Activation({r.saved_elements}));
      ctx.saved().push_back(std::move(saved));
    }
    return ctx.Activation(r.output);
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& input, const Tensor&) override {
    MW_RETURN_IF_ERROR(Computable(ctx));
    return ctx.InputGradient(input.shape());
  }

 private:
  absl::Status Computable(LayerContext& ctx) const {
    if (!ctx.computes()) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat(
        "layer '", name(), "' is shape-only (the zoo plans and dry-runs it on meta; it does "
        "not compute)"));
  }
  const std::vector<ParameterDecl> params_;
  const std::function<absl::StatusOr<ShapeRule>(const Shape&)> rule_;
};

ParameterDecl Weight(std::string name, Shape shape) {
  return {std::move(name), std::move(shape), ParameterDecl::Init::kNormal, 0.02f};
}

absl::Status Expect(bool ok, const std::string& layer, const std::string& expected,
                    const Shape& got) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("layer '", layer, "': expected ", expected,
                                                 ", got [", absl::StrJoin(got, ", "), "]"));
}

// ---- CNNs ----

// A convolution (no bias) followed by batch norm: weight and BN parameters,
// output spatial size, saved conv and BN outputs, FLOPs.
struct Conv {
  int64_t in, out, kernel, stride;
  int64_t groups = 1;  // grouped convolution: each group maps in/groups to out/groups
};

void AddConvParams(std::vector<ParameterDecl>& p, const std::string& prefix, const Conv& c) {
  p.push_back(Weight(prefix + "_weight", {c.out, c.in / c.groups, c.kernel, c.kernel}));
  p.push_back({prefix + "_bn_weight", {c.out}, ParameterDecl::Init::kOnes, 0});
  p.push_back({prefix + "_bn_bias", {c.out}, ParameterDecl::Init::kZeros, 0});
}

// Elements saved by conv + BN at output size `hw` per image, and FLOPs.
void Account(const Conv& c, int64_t batch, int64_t out_hw, ShapeRule& r) {
  r.saved_elements += 2 * batch * c.out * out_hw * out_hw;
  r.flops += 2.0 * batch * (c.in / c.groups) * c.out * c.kernel * c.kernel * out_hw * out_hw;
}

std::unique_ptr<Layer> Stem(const std::string& name, bool deep) {
  // ResNet: 7x7/2 conv to 64, then 3x3/2 max pool. ResNeSt's deep stem:
  // three 3x3 convs (3->64/2, 64->64, 64->128) then the pool.
  std::vector<Conv> convs = deep ? std::vector<Conv>{{3, 64, 3, 2}, {64, 64, 3, 1}, {64, 128, 3, 1}}
                                 : std::vector<Conv>{{3, 64, 7, 2}};
  std::vector<ParameterDecl> p;
  for (size_t i = 0; i < convs.size(); ++i) AddConvParams(p, absl::StrCat("conv", i), convs[i]);
  const int64_t channels = convs.back().out;
  return std::make_unique<ShapeLayer>(name, p, [=](const Shape& in) -> absl::StatusOr<ShapeRule> {
    MW_RETURN_IF_ERROR(Expect(in.size() == 4 && in[1] == 3 && in[2] == in[3] && in[2] >= 32,
                              name, "images [batch, 3, size, size] with size >= 32", in));
    ShapeRule r;
    const int64_t half = (in[2] + 1) / 2;
    for (const Conv& c : convs) Account(c, in[0], half, r);
    r.output = {in[0], channels, (half + 1) / 2, (half + 1) / 2};
    return r;
  });
}

// A bottleneck block: 1x1 reduce, 3x3 (stride; optionally radix-2 split
// attention), 1x1 expand x4, projection shortcut when the shape changes.
std::unique_ptr<Layer> Bottleneck(const std::string& name, int64_t in, int64_t mid, int64_t stride,
                                  bool split_attention) {
  const int64_t out = 4 * mid;
  const bool project = stride != 1 || in != out;
  std::vector<ParameterDecl> p;
  const Conv reduce{in, mid, 1, 1};
  // Split attention (radix 2): the 3x3 conv, grouped in two, makes 2 * mid
  // channels; a two-layer attention over the pooled sum weighs the halves.
  const Conv spatial{mid, split_attention ? 2 * mid : mid, 3, stride, split_attention ? 2 : 1};
  const int64_t inter = std::max<int64_t>(mid * 2 / 4, 32);
  const Conv expand{mid, out, 1, 1};
  const Conv shortcut{in, out, 1, stride};
  AddConvParams(p, "conv1", reduce);
  AddConvParams(p, "conv2", spatial);
  if (split_attention) {
    p.push_back(Weight("attn_fc1_weight", {inter, mid}));
    p.push_back({"attn_fc1_bias", {inter}, ParameterDecl::Init::kZeros, 0});
    p.push_back({"attn_bn_weight", {inter}, ParameterDecl::Init::kOnes, 0});
    p.push_back({"attn_bn_bias", {inter}, ParameterDecl::Init::kZeros, 0});
    p.push_back(Weight("attn_fc2_weight", {2 * mid, inter}));
    p.push_back({"attn_fc2_bias", {2 * mid}, ParameterDecl::Init::kZeros, 0});
  }
  AddConvParams(p, "conv3", expand);
  if (project) AddConvParams(p, "shortcut", shortcut);
  return std::make_unique<ShapeLayer>(name, p, [=](const Shape& s) -> absl::StatusOr<ShapeRule> {
    MW_RETURN_IF_ERROR(Expect(s.size() == 4 && s[1] == in && s[2] == s[3], name,
                              absl::StrCat("[batch, ", in, ", size, size]"), s));
    ShapeRule r;
    const int64_t b = s[0], hw = s[2], out_hw = (hw + stride - 1) / stride;
    Account(reduce, b, hw, r);
    Account(spatial, b, out_hw, r);
    if (split_attention) {
      // The attended sum of the two halves (what conv3 reads).
      r.saved_elements += b * mid * out_hw * out_hw;
    }
    Account(expand, b, out_hw, r);
    if (project) Account(shortcut, b, out_hw, r);
    r.output = {b, out, out_hw, out_hw};
    return r;
  });
}

std::unique_ptr<Layer> ClassifierHead(const std::string& name, int64_t channels, int64_t classes) {
  return std::make_unique<ShapeLayer>(
      name,
      std::vector<ParameterDecl>{Weight("fc_weight", {channels, classes}),
                                 {"fc_bias", {classes}, ParameterDecl::Init::kZeros, 0}},
      [=](const Shape& s) -> absl::StatusOr<ShapeRule> {
        MW_RETURN_IF_ERROR(Expect(s.size() == 4 && s[1] == channels, name,
                                  absl::StrCat("[batch, ", channels, ", h, w]"), s));
        ShapeRule r;
        r.saved_elements = s[0] * channels;  // the pooled features
        r.flops = 2.0 * s[0] * channels * classes;
        r.output = {s[0], classes};
        return r;
      });
}

std::vector<std::unique_ptr<Layer>> ResNetLike(const std::vector<int>& depths, bool resnest) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(Stem("stem", resnest));
  int64_t channels = resnest ? 128 : 64;
  for (size_t stage = 0; stage < depths.size(); ++stage) {
    const int64_t mid = int64_t{64} << stage;
    for (int block = 0; block < depths[stage]; ++block) {
      const int64_t stride = block == 0 && stage > 0 ? 2 : 1;
      layers.push_back(Bottleneck(absl::StrCat("stage", stage + 1, ".block", block), channels, mid,
                                  stride, resnest));
      channels = 4 * mid;
    }
  }
  layers.push_back(ClassifierHead("head", channels, 1000));
  return layers;
}

// ---- LLaMA-style transformers ----

struct LlamaConfig {
  int64_t vocab, hidden, layers, heads, kv_heads, ffn;
};

std::vector<std::unique_ptr<Layer>> Llama(const LlamaConfig& c, int64_t seq) {
  std::vector<std::unique_ptr<Layer>> layers;
  const int64_t h = c.hidden, d = c.hidden / c.heads, kv = c.kv_heads * d;
  layers.push_back(std::make_unique<ShapeLayer>(
      "embed", std::vector<ParameterDecl>{Weight("weight", {c.vocab, h})},
      [=](const Shape& s) -> absl::StatusOr<ShapeRule> {
        MW_RETURN_IF_ERROR(Expect(s.size() == 2 && s[1] == seq, "embed",
                                  absl::StrCat("token ids [batch, ", seq, "]"), s));
        ShapeRule r;
        r.output = {s[0] * seq, h};
        return r;
      }));
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string name = absl::StrCat("block", l);
    layers.push_back(std::make_unique<ShapeLayer>(
        name,
        std::vector<ParameterDecl>{{"attn_norm", {h}, ParameterDecl::Init::kOnes, 0},
                                   Weight("wq", {h, h}), Weight("wk", {h, kv}),
                                   Weight("wv", {h, kv}), Weight("wo", {h, h}),
                                   {"ffn_norm", {h}, ParameterDecl::Init::kOnes, 0},
                                   Weight("w1", {h, c.ffn}), Weight("w3", {h, c.ffn}),
                                   Weight("w2", {c.ffn, h})},
        [=](const Shape& s) -> absl::StatusOr<ShapeRule> {
          MW_RETURN_IF_ERROR(Expect(s.size() == 2 && s[1] == h && s[0] % seq == 0, name,
                                    absl::StrCat("[batch * ", seq, ", ", h, "]"), s));
          ShapeRule r;
          const int64_t rows = s[0], batch = rows / seq;
          // norm out, q, k, v, attention out, residual, norm out, w1 and w3
          // outputs, their SwiGLU product; probabilities per head.
          r.saved_elements = rows * (h + h + 2 * kv + h + h + h + 3 * c.ffn) +
                             batch * c.heads * seq * seq;
          r.flops = 2.0 * rows * (2 * h * h + 2 * h * kv + 3 * h * c.ffn) + 4.0 * rows * seq * h;
          r.output = s;
          return r;
        }));
  }
  layers.push_back(std::make_unique<ShapeLayer>(
      "head",
      std::vector<ParameterDecl>{{"norm", {h}, ParameterDecl::Init::kOnes, 0},
                                 Weight("lm_head", {h, c.vocab})},
      [=](const Shape& s) -> absl::StatusOr<ShapeRule> {
        MW_RETURN_IF_ERROR(Expect(s.size() == 2 && s[1] == h, "head",
                                  absl::StrCat("[rows, ", h, "]"), s));
        ShapeRule r;
        r.saved_elements = s[0] * h;
        r.flops = 2.0 * s[0] * h * c.vocab;
        r.output = {s[0], c.vocab};
        return r;
      }));
  return layers;
}

}  // namespace

std::vector<std::string> ZooModels() { return {"resnet50", "resnest269", "llama-7b", "llama2-70b"}; }

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> MakeZooModel(const std::string& name,
                                                                 int64_t seq) {
  if (name == "resnet50") return ResNetLike({3, 4, 6, 3}, /*resnest=*/false);
  if (name == "resnest269") return ResNetLike({3, 30, 48, 8}, /*resnest=*/true);
  const std::vector<std::string> names = ZooModels();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    return absl::NotFoundError(absl::StrCat("model '", name, "': expected one of ",
                                            absl::StrJoin(names, ", ")));
  }
  if (seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name, "': seq must be >= 1, got ", seq));
  }
  if (name == "llama-7b") return Llama({32000, 4096, 32, 32, 32, 11008}, seq);
  return Llama({32000, 8192, 80, 64, 8, 28672}, seq);  // llama2-70b
}

int64_t CountParameters(const std::vector<std::unique_ptr<Layer>>& layers) {
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const ParameterDecl& d : layer->Parameters()) total += NumElements(d.shape);
  }
  return total;
}

}  // namespace memwall
