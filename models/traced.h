// Traced models: a PyTorch model's training step as memwall.trace measured
// it (python/memwall/trace.py: one forward and backward on torch's meta
// device, unit by unit), turned into a chain of shape-only layers the meta
// dry run, the recomputation planners and the auto strategy take like any
// other model. No values: a traced layer computes nothing (on a device
// with bytes its forward fails with kUnimplemented naming the layer).
//
// The description (JSON, "format": "memwall.traced/1"), one entry per
// stage (a unit the engine gathers: a transformer block, the embeddings,
// the head; what runs outside every unit, such as the loss, joins the
// stage before it):
//   {"format": "memwall.traced/1", "model": "LlamaForCausalLM",
//    "dtype": "bf16", "attention": "flash", "input": [4096],
//    "stages": [{"name": "model.layers.0",
//                "parameters": [{"name": "self_attn.q_proj.weight",
//                                "shape": [4096, 4096], "trainable": true,
//                                "group": "model.layers.0.self_attn.q_proj"}],
//                "shared": ["model.embed_tokens.weight"],
//                "kept": [0, 981467136], "output": [0, 16777216],
//                "input_grad": [0, 16777216], "forward_flops": [0, 1.2e12],
//                "workspace": [0, 67108864], "backward_workspace": [0, 50331648],
//                "reads_input": false}]}
// "recompute_inputs" (optional, top level): bytes of the tensors the
// recomputable stages take from before them (not the hidden state they
// hand on) that autograd does not save -- an attention mask, position ids
// -- which memwall.torch holds while any segment is recomputed
// (Chain::recompute_held).
// Figures are [fixed, per sample]: at micro-batch b a figure is
// fixed + b * per_sample (traced at two micro-batch sizes; only the
// workspaces may fall per sample, and a figure below 0 counts as 0). "kept": bytes
// autograd saves for backward that the stage creates, besides its output;
// "output": bytes of the tensors it hands on (the last stage: the loss);
// "input_grad": bytes of its input's gradient; "workspace" (optional):
// bytes its forward holds for a while above what it keeps and hands on
// (transients: attention scores, f32 upcasts, the loss's f32 logits),
// allocated after them and freed at the forward's end; "backward_workspace"
// (optional): likewise for its backward, above the gradient of its output
// and its input's gradient (intermediate gradients, parameter gradients
// until the engine takes them, the loss's f32 gradients); "reads_input": whether
// autograd saves its input (false lets the engine free it early; see
// Layer::BackwardReadsInput); "recomputable" (optional, default true):
// whether memwall.torch can run the stage again in backward (a block, an
// item of a ModuleList or Sequential run once per step with no operator
// outside it until the next unit; see python/memwall/recompute.py), so
// the planners recompute only such stages (Layer::Recomputable). Parameter names are local to the stage
// (full name: "<stage>.<name>", torch's); "group" is the flat group
// memwall.torch.ZeroOptimizer forms for it (the module owning it), so a
// dry run holds the model states a real run of the front end holds.
#ifndef MEMWALL_MODELS_TRACED_H_
#define MEMWALL_MODELS_TRACED_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layer.h"
#include "engine/model.h"
#include "runtime/dtype.h"

namespace memwall {

// fixed + per_sample * micro-batch.
struct TracedFigure {
  double fixed = 0;
  double per_sample = 0;
  double At(int64_t batch) const { return fixed + per_sample * static_cast<double>(batch); }
};

struct TracedStage {
  std::string name;
  std::vector<ParameterDecl> parameters;
  std::vector<std::string> shared;  // full names of other stages' parameters
  TracedFigure kept, output, input_grad, forward_flops, workspace, backward_workspace;
  bool reads_input = true;
  bool recomputable = true;
};

struct TracedModel {
  std::string model;      // the traced class, for messages
  std::string source;     // the file or "<memory>"
  DType dtype = DType::kF32;  // what it was traced in (parameters, activations)
  std::string attention;  // the attention kernel assumed
  std::vector<int64_t> input;  // one sample's input shape (token ids)
  std::vector<TracedStage> stages;
  // Bytes a recomputing plan holds besides each segment's input: tensors
  // the blocks take that autograd does not save (Chain::recompute_held).
  TracedFigure recompute_inputs;
};

// Parses a description; errors name `source` and the field, and what was
// expected.
absl::StatusOr<TracedModel> ParseTracedModel(const std::string& json_text,
                                             const std::string& source);
// Reads and parses the file at `path`.
absl::StatusOr<TracedModel> LoadTracedModel(const std::string& path);

// Parameter elements, all stages.
int64_t TracedParameters(const TracedModel& model);

// The stages that are the model's numbered blocks ("model.layers.0",
// "model.layers.1", ...: one prefix, numbered 0 to L-1 in order, L >= 1;
// the longest such run): their first index in `model.stages` and L. 0
// blocks if there is none.
struct TracedBlocks {
  size_t first = 0;
  int64_t count = 0;
  std::string prefix;  // "model.layers"
};
TracedBlocks FindTracedBlocks(const TracedModel& model);

// `model` with `blocks` (>= 1) numbered blocks instead of its own: the
// first and the last as traced (what feeds them and what they feed may
// differ), every other a copy of block 1 renamed (its parameters' groups
// too). Depth scaling for a uniform stack; kInvalidArgument naming the
// stages where the model has no numbered blocks, where its middle blocks
// differ (a repeated block would not be this model), or where another
// stage shares a block's parameter.
absl::StatusOr<TracedModel> WithTracedBlocks(const TracedModel& model, int64_t blocks);

// The engine's factory: a fresh chain of traced layers per micro-batch
// size. Its layers refuse (kInvalidArgument, at forward) to run with
// activations in a dtype other than the traced one.
ModelFactory TracedModelFactory(std::shared_ptr<const TracedModel> model);

}  // namespace memwall

#endif  // MEMWALL_MODELS_TRACED_H_
