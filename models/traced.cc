#include "models/traced.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/json_reader.h"
#include "runtime/status.h"
#include "runtime/text_file.h"

namespace memwall {
namespace {

// Descriptions larger than this are refused before parsing (bytes; a
// 70B model's is about 100 KiB, one of 100,000 layers about 100 MiB).
constexpr int64_t kMaxTracedBytes = int64_t{256} << 20;

// A parameter may hold at most 2^48 elements (16 bytes of Adam states each:
// 4 PiB), and a figure at most 2^50 bytes (1 PiB) fixed and per sample:
// beyond them the engine's 64-bit byte counts would overflow, and no
// traced model comes near.
constexpr int64_t kMaxParameterElements = int64_t{1} << 48;
constexpr double kMaxFigureBytes = double(int64_t{1} << 50);
// Byte figures at a micro-batch saturate here (bytes): a dry run then
// reports "fits: no" instead of wrapping around to a small number.
constexpr int64_t kSaturatedBytes = int64_t{1} << 62;

using json = nlohmann::json;

// Errors name the description and the field.
absl::Status Bad(const std::string& source, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("traced model ", source, ": ", field, ": expected ", what));
}

// Transient peaks (workspaces) need not grow with the batch, so they may
// fall per sample (clamped at 0); what a stage keeps or computes may not.
absl::StatusOr<TracedFigure> Figure(const json& stage, const char* key, const std::string& source,
                                    const std::string& where, bool may_fall = false) {
  const std::string field = where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
  if (!stage.contains(key)) return Bad(source, field, "[fixed, per sample], missing");
  const json& v = stage.at(key);
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
    return Bad(source, field, absl::StrCat("[fixed, per sample] numbers, got ", v.dump()));
  }
  TracedFigure f{v[0].get<double>(), v[1].get<double>()};
  if (!std::isfinite(f.fixed) || !std::isfinite(f.per_sample) ||
      (f.per_sample < 0 && !may_fall) || f.At(1) < 0) {
    return Bad(source, field, absl::StrCat("finite, per sample >= 0, >= 0 at micro-batch 1; got ",
                                           v.dump()));
  }
  const bool flops = std::string(key) == "forward_flops";
  if (!flops && (std::abs(f.fixed) > kMaxFigureBytes || std::abs(f.per_sample) > kMaxFigureBytes)) {
    return Bad(source, field, absl::StrCat("at most 2^50 bytes (1 PiB) fixed and per sample; got ",
                                           v.dump()));
  }
  return f;
}

int64_t Bytes(const TracedFigure& f, int64_t batch) {
  const double bytes = std::max(0.0, f.At(batch));
  return bytes >= double(kSaturatedBytes) ? kSaturatedBytes
                                          : static_cast<int64_t>(std::llround(bytes));
}

// One unit of a traced model at a given micro-batch size. Its output is one
// 1-D tensor of the stage's output bytes in the traced dtype; what it keeps
// besides is one saved tensor.
class TracedLayer final : public Layer {
 public:
  TracedLayer(const TracedStage& stage, const TracedModel& model, int64_t batch)
      : Layer(stage.name),
        stage_(stage),
        dtype_(model.dtype),
        kept_(Bytes(stage.kept, batch)),
        output_(Bytes(stage.output, batch)),
        input_grad_(Bytes(stage.input_grad, batch)),
        workspace_(Bytes(stage.workspace, batch)),
        backward_workspace_(Bytes(stage.backward_workspace, batch)),
        flops_(std::max(0.0, stage.forward_flops.At(batch))),
        recompute_held_(Bytes(model.recompute_inputs, batch)) {}

  std::vector<ParameterDecl> Parameters() const override { return stage_.parameters; }
  std::vector<std::string> SharedParameters() const override { return stage_.shared; }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>&) const override {
    return std::vector<int64_t>{Elements(output_)};
  }
  int64_t ActivationBytes(const std::vector<int64_t>&, DType dtype) const override {
    return static_cast<int64_t>(DTypeSize(dtype)) * (Elements(kept_) + Elements(output_));
  }
  int64_t InputGradientBytes(const std::vector<int64_t>&) const override {
    return 4 * F32Elements(input_grad_);
  }
  bool BackwardReadsInput() const override { return stage_.reads_input; }
  bool Recomputable() const override { return stage_.recomputable; }
  int64_t RecomputeHeldBytes() const override {
    return static_cast<int64_t>(DTypeSize(dtype_)) * Elements(recompute_held_);
  }
  bool UsesGroupsInTurn() const override { return true; }
  double ForwardFlops(const std::vector<int64_t>&) const override { return flops_; }

  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor&) override {
    MW_RETURN_IF_ERROR(Runnable(ctx));
    ctx.saved().clear();
    if (kept_ > 0) {
      MW_ASSIGN_OR_RETURN(Tensor saved, ctx.Activation({Elements(kept_)}));
      ctx.saved().push_back(std::move(saved));
    }
    MW_ASSIGN_OR_RETURN(Tensor output, ctx.Activation({Elements(output_)}));
    if (workspace_ > 0) {
      // The forward's transients, at their peak beside what it keeps.
      MW_ASSIGN_OR_RETURN(Tensor transient, ctx.Workspace({F32Elements(workspace_)}));
    }
    return output;
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor&, const Tensor&) override {
    MW_RETURN_IF_ERROR(Runnable(ctx));
    // Input gradients are f32 in the engine (engine/layer.h); torch's are
    // in the input's dtype: the same bytes, as f32 elements.
    MW_ASSIGN_OR_RETURN(Tensor input_grad, ctx.InputGradient({F32Elements(input_grad_)}));
    if (backward_workspace_ > 0) {
      MW_ASSIGN_OR_RETURN(Tensor transient, ctx.Workspace({F32Elements(backward_workspace_)}));
    }
    return input_grad;
  }

 private:
  int64_t Elements(int64_t bytes) const {
    const int64_t size = static_cast<int64_t>(DTypeSize(dtype_));
    return (bytes + size - 1) / size;
  }
  static int64_t F32Elements(int64_t bytes) { return (bytes + 3) / 4; }
  absl::Status Runnable(LayerContext& ctx) const {
    if (ctx.computes()) {
      return absl::UnimplementedError(absl::StrCat(
          "layer '", name(), "' is traced (its figures, not its computation): it runs on the "
          "meta backend only"));
    }
    if (ctx.activation_dtype() != dtype_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer '", name(), "' was traced in ", DTypeName(dtype_), " but the config trains in ",
          DTypeName(ctx.activation_dtype()),
          " (its bf16/fp16 sections); trace the model in the config's dtype"));
    }
    return absl::OkStatus();
  }

  const TracedStage stage_;
  const DType dtype_;
  const int64_t kept_, output_, input_grad_, workspace_, backward_workspace_;
  const double flops_;
  const int64_t recompute_held_;
};

// The loss is part of the last stage (the stage's output is the loss
// value); what remains is its gradient, which the engine allocates.
class TracedLoss final : public LossFunction {
 public:
  absl::StatusOr<float> Compute(LayerContext& ctx, const Tensor&, const Tensor&,
                                Tensor&) override {
    if (ctx.computes()) return absl::UnimplementedError("a traced model's loss runs on meta only");
    return 0.0f;
  }
};

}  // namespace

absl::StatusOr<TracedModel> ParseTracedModel(const std::string& json_text,
                                             const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("traced model ", source, ": not JSON (", e.what(), ")"));
  }
  // Every typed read goes through a JsonReader: a field of the wrong type
  // is an error naming it, never an exception.
  const std::string prefix = absl::StrCat("traced model ", source, ": ");
  MW_ASSIGN_OR_RETURN(JsonReader doc, JsonReader::Open(j, "", prefix, "the document"));
  const json* format = doc.Find("format");
  if (format == nullptr || *format != "memwall.traced/1") {
    return Bad(source, "format", absl::StrCat("\"memwall.traced/1\", got ",
                                              format != nullptr ? format->dump() : "none"));
  }
  TracedModel m;
  m.source = source;
  m.model = "traced";
  MW_RETURN_IF_ERROR(doc.String("model", /*non_empty=*/false, m.model));
  MW_RETURN_IF_ERROR(doc.String("attention", /*non_empty=*/false, m.attention));
  const json* dtype_field = doc.Find("dtype");
  const std::string dtype = dtype_field != nullptr && dtype_field->is_string()
                                ? dtype_field->get<std::string>()
                                : "";
  if (dtype == "f32") {
    m.dtype = DType::kF32;
  } else if (dtype == "bf16") {
    m.dtype = DType::kBF16;
  } else if (dtype == "f16") {
    m.dtype = DType::kF16;
  } else {
    return Bad(source, "dtype", absl::StrCat("\"f32\", \"bf16\" or \"f16\", got ",
                                             dtype_field != nullptr ? dtype_field->dump() : "none"));
  }
  if (!j.contains("input") || !j["input"].is_array()) {
    return Bad(source, "input", "one sample's input shape, e.g. [4096]");
  }
  for (const json& d : j["input"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1) {
      return Bad(source, "input", absl::StrCat("positive integers, got ", j["input"].dump()));
    }
    m.input.push_back(d.get<int64_t>());
  }
  if (j.contains("recompute_inputs")) {
    MW_ASSIGN_OR_RETURN(m.recompute_inputs, Figure(j, "recompute_inputs", source, ""));
  }
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    return Bad(source, "stages", "a non-empty array");
  }
  std::set<std::string> names, params;
  for (size_t i = 0; i < j["stages"].size(); ++i) {
    const json& s = j["stages"][i];
    const std::string where = absl::StrCat("stages[", i, "]");
    MW_ASSIGN_OR_RETURN(JsonReader stage_reader, JsonReader::Open(s, where, prefix));
    TracedStage stage;
    MW_RETURN_IF_ERROR(stage_reader.String("name", /*non_empty=*/true, stage.name));
    if (stage.name.empty()) return Bad(source, where + ".name", "a non-empty string");
    if (!names.insert(stage.name).second) {
      return Bad(source, where + ".name", absl::StrCat("unique; '", stage.name, "' repeats"));
    }
    for (const json& p : s.value("parameters", json::array())) {
      ParameterDecl d;
      if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
          !p.contains("shape") || !p["shape"].is_array()) {
        return Bad(source, where + ".parameters", "objects with a name and a shape");
      }
      d.name = p["name"].get<std::string>();
      const std::string shape_field = absl::StrCat(where, ".parameters '", d.name, "'.shape");
      int64_t elements = 1;
      for (const json& x : p["shape"]) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1) {
          return Bad(source, shape_field,
                     absl::StrCat("positive integers, got ", p["shape"].dump()));
        }
        const int64_t extent = x.get<int64_t>();
        if (extent > kMaxParameterElements / elements) {
          return Bad(source, shape_field,
                     absl::StrCat("at most 2^48 elements in all; got ", p["shape"].dump()));
        }
        elements *= extent;
        d.shape.push_back(extent);
      }
      MW_ASSIGN_OR_RETURN(
          JsonReader parameter,
          JsonReader::Open(p, absl::StrCat(where, ".parameters '", d.name, "'"), prefix));
      MW_RETURN_IF_ERROR(parameter.Bool("trainable", d.trainable));
      MW_RETURN_IF_ERROR(parameter.String("group", /*non_empty=*/false, d.group));
      if (!params.insert(absl::StrCat(stage.name, ".", d.name)).second) {
        return Bad(source, where + ".parameters",
                   absl::StrCat("unique names; '", d.name, "' repeats"));
      }
      stage.parameters.push_back(std::move(d));
    }
    for (const json& n : s.value("shared", json::array())) {
      if (!n.is_string()) return Bad(source, where + ".shared", "full parameter names");
      stage.shared.push_back(n.get<std::string>());
    }
    MW_ASSIGN_OR_RETURN(stage.kept, Figure(s, "kept", source, where));
    MW_ASSIGN_OR_RETURN(stage.output, Figure(s, "output", source, where));
    MW_ASSIGN_OR_RETURN(stage.input_grad, Figure(s, "input_grad", source, where));
    MW_ASSIGN_OR_RETURN(stage.forward_flops, Figure(s, "forward_flops", source, where));
    if (s.contains("workspace")) {
      MW_ASSIGN_OR_RETURN(stage.workspace, Figure(s, "workspace", source, where, true));
    }
    if (s.contains("backward_workspace")) {
      MW_ASSIGN_OR_RETURN(stage.backward_workspace,
                          Figure(s, "backward_workspace", source, where, true));
    }
    stage.reads_input = true;
    MW_RETURN_IF_ERROR(stage_reader.Bool("reads_input", stage.reads_input));
    stage.recomputable = true;
    MW_RETURN_IF_ERROR(stage_reader.Bool("recomputable", stage.recomputable));
    m.stages.push_back(std::move(stage));
  }
  for (const TracedStage& stage : m.stages) {
    for (const std::string& shared : stage.shared) {
      if (params.count(shared) == 0) {
        return Bad(source, absl::StrCat("stages '", stage.name, "'.shared"),
                   absl::StrCat("parameters of other stages; no stage declares '", shared, "'"));
      }
    }
  }
  return m;
}

absl::StatusOr<TracedModel> LoadTracedModel(const std::string& path) {
  MW_ASSIGN_OR_RETURN(const std::string text,
                      ReadTextFile("traced model", path, kMaxTracedBytes,
                                   "a description memwall.trace.describe wrote"));
  return ParseTracedModel(text, path);
}

int64_t TracedParameters(const TracedModel& model) {
  int64_t n = 0;
  for (const TracedStage& s : model.stages) {
    for (const ParameterDecl& p : s.parameters) {
      int64_t e = 1;
      for (int64_t d : p.shape) e *= d;
      n += e;
    }
  }
  return n;
}

namespace {

// "model.layers.12" -> ("model.layers", 12); false for a name without a
// numbered tail.
bool SplitNumbered(const std::string& name, std::string* prefix, int64_t* index) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot + 1 == name.size()) return false;
  const std::string tail = name.substr(dot + 1);
  if (tail.find_first_not_of("0123456789") != std::string::npos || tail.size() > 9) return false;
  *prefix = name.substr(0, dot);
  *index = std::stoll(tail);
  return true;
}

bool SameFigure(const TracedFigure& a, const TracedFigure& b) {
  return a.fixed == b.fixed && a.per_sample == b.per_sample;
}

// What differs between blocks `a` and `b` (their own names aside), or "".
std::string BlockDifference(const TracedStage& a, const TracedStage& b) {
  if (a.parameters.size() != b.parameters.size()) return "their parameters";
  for (size_t i = 0; i < a.parameters.size(); ++i) {
    const ParameterDecl& p = a.parameters[i];
    const ParameterDecl& q = b.parameters[i];
    const std::string pg = p.group.substr(std::min(p.group.size(), a.name.size()));
    const std::string qg = q.group.substr(std::min(q.group.size(), b.name.size()));
    if (p.name != q.name || p.shape != q.shape || p.trainable != q.trainable || pg != qg) {
      return absl::StrCat("parameter '", p.name, "'");
    }
  }
  const std::pair<const char*, std::pair<const TracedFigure*, const TracedFigure*>> figures[] = {
      {"kept", {&a.kept, &b.kept}},
      {"output", {&a.output, &b.output}},
      {"input_grad", {&a.input_grad, &b.input_grad}},
      {"forward_flops", {&a.forward_flops, &b.forward_flops}},
      {"workspace", {&a.workspace, &b.workspace}},
      {"backward_workspace", {&a.backward_workspace, &b.backward_workspace}}};
  for (const auto& [field, pair] : figures) {
    if (!SameFigure(*pair.first, *pair.second)) return absl::StrCat("'", field, "'");
  }
  if (a.reads_input != b.reads_input) return "'reads_input'";
  if (a.recomputable != b.recomputable) return "'recomputable'";
  if (!a.shared.empty() || !b.shared.empty()) return "'shared'";
  return "";
}

}  // namespace

TracedBlocks FindTracedBlocks(const TracedModel& model) {
  TracedBlocks best;
  for (size_t i = 0; i < model.stages.size(); ++i) {
    std::string prefix;
    int64_t index = 0;
    if (!SplitNumbered(model.stages[i].name, &prefix, &index) || index != 0) continue;
    int64_t count = 1;
    std::string p;
    int64_t k = 0;
    while (i + count < model.stages.size() && SplitNumbered(model.stages[i + count].name, &p, &k) &&
           p == prefix && k == count) {
      ++count;
    }
    if (count > best.count) best = {i, count, prefix};
  }
  return best;
}

absl::StatusOr<TracedModel> WithTracedBlocks(const TracedModel& model, int64_t blocks) {
  const TracedBlocks found = FindTracedBlocks(model);
  const std::string where = absl::StrCat(model.source, " (", model.model, ")");
  if (found.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": no numbered blocks (stages named <prefix>.0, <prefix>.1, ...) to repeat"));
  }
  if (blocks < 1 || blocks > 1'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": blocks: expected 1..1000000, got ", blocks));
  }
  const std::vector<TracedStage>& stages = model.stages;
  const size_t first = found.first, last = first + found.count - 1;
  // The middle blocks must be alike: the copies stand for them.
  const TracedStage& pattern = stages[found.count > 2 ? first + 1 : first];
  for (size_t i = first + 2; i < last; ++i) {
    if (const std::string d = BlockDifference(pattern, stages[i]); !d.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": blocks ", pattern.name, " and ", stages[i].name, " differ in ", d,
          "; repeating one block would not be this model"));
    }
  }
  std::set<std::string> block_parameters;
  for (size_t i = first; i <= last; ++i) {
    for (const ParameterDecl& p : stages[i].parameters) {
      block_parameters.insert(absl::StrCat(stages[i].name, ".", p.name));
    }
  }
  for (const TracedStage& s : stages) {
    for (const std::string& shared : s.shared) {
      if (block_parameters.count(shared) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": stage ", s.name, " shares ", shared,
            ", a block's parameter; a model of another depth would not share it"));
      }
    }
  }
  // Block `from` as block `index`: its name and its groups renamed.
  const auto as_block = [&](const TracedStage& from, int64_t index) {
    TracedStage copy = from;
    copy.name = absl::StrCat(found.prefix, ".", index);
    for (ParameterDecl& p : copy.parameters) {
      if (p.group == from.name || absl::StartsWith(p.group, from.name + ".")) {
        p.group = copy.name + p.group.substr(from.name.size());
      }
    }
    return copy;
  };
  TracedModel out = model;
  out.stages.assign(stages.begin(), stages.begin() + first);
  out.stages.push_back(stages[first]);
  for (int64_t b = 1; b + 1 < blocks; ++b) out.stages.push_back(as_block(pattern, b));
  if (blocks > 1) out.stages.push_back(as_block(stages[last], blocks - 1));
  out.stages.insert(out.stages.end(), stages.begin() + last + 1, stages.end());
  return out;
}

ModelFactory TracedModelFactory(std::shared_ptr<const TracedModel> model) {
  return [model](int64_t batch) -> absl::StatusOr<Model> {
    if (batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch: expected >= 1 samples, got ", batch));
    }
    Model m;
    for (const TracedStage& s : model->stages) {
      m.layers.push_back(std::make_unique<TracedLayer>(s, *model, batch));
    }
    m.loss = std::make_unique<TracedLoss>();
    m.input = {batch};
    m.input.insert(m.input.end(), model->input.begin(), model->input.end());
    m.target = m.input;
    return m;
  };
}

}  // namespace memwall
