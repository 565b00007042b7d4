// The Layer interface: how a model plugs into memwall's training step.
//
// A sequential model is a list of layers. Each layer declares its
// parameters; the engine registers them with the ShardedOptimizer as
// "<layer name>.<parameter name>" (so flat groups follow layers), hands the
// layer its parameter and gradient memory through a LayerContext, and keeps
// each layer's input alive from its forward to its backward.
//
// Activation accounting: the tensors a layer allocates through its context
// during forward and keeps until backward (its output, which the next layer
// reads in backward, and anything it saves) are owned by the layer's name and
// categorised as activations; ActivationBytes() must predict their size
// exactly (the recomputation planner and the dry run rely on it; a test
// checks it against the allocator). Gradients of inputs are owned by
// "<layer name>.grad" and live only until the previous layer's backward.
//
// Layers compute in f32 through kernels/nn.h, so the same layer code runs on
// host, cuda and meta (meta allocates and accounts exactly as the others do,
// and computes nothing). Mixed precision (bf16/f16 parameters) is 16-bit
// storage with f32 compute, for parameters and activations alike:
// - the context hands a layer f32 copies of its parameters and f32 gradient
//   buffers in workspace memory, and the engine adds those gradients into
//   the low-precision gradients after the layer's backward (FlushGradients);
// - activations are stored in the run's 16-bit dtype (activation_dtype());
//   a layer computes each one in f32 (Stage) and rounds it into storage
//   once its forward no longer needs the f32 values (Commit), and reads
//   stored ones back as f32 (Read). Small per-row statistics stay f32.
// Input gradients stay f32: they live only from one layer's backward to the
// next.
//
// Stream order: a layer's kernels run on the context's stream, which is
// the optimizer's caller stream (ShardedOptimizer::stream()). Memory the
// layer or the context frees is freed in stream order, without the host
// waiting: a block freed while kernels queued on that stream may still
// read it is only reused by later work on the same stream (which runs
// after them) or by the optimizer's communication stream, which waits for
// the caller stream's work before each collective. The host reads device
// values only where it must (a loss, a check of token ids), and waits there.
#ifndef MEMWALL_ENGINE_LAYER_H_
#define MEMWALL_ENGINE_LAYER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

struct ParameterDecl {
  enum class Init : uint8_t { kZeros, kOnes, kNormal };
  std::string name;  // local to the layer: "weight", "bias"
  std::vector<int64_t> shape;
  Init init = Init::kNormal;
  float stddev = 0.02f;  // for kNormal
  // False: frozen (no gradient, no optimizer state; a LoRA base weight).
  bool trainable = true;
  // Non-empty: the explicit flat group (ShardedOptimizer::AddParameterGroup)
  // it gathers, releases and reduces with; a group's parameters are
  // consecutive in the model and all trainable or all frozen. Empty: the
  // engine groups by layer and reduce bucket.
  std::string group;
  // Non-empty: a tile of a larger parameter of this layer (the local name
  // here, of shape `whole_shape`, 2-D), rows [row, row + shape[0]) and
  // columns [column, column + shape[1]) of it; kNormal values are those of
  // the values the whole parameter would get, so a tiled model starts where
  // the untiled one does.
  std::string tile_of;
  std::vector<int64_t> whole_shape;
  int64_t row = 0;
  int64_t column = 0;
};

// What a layer sees while it runs. Owned by the engine; one per layer.
class LayerContext {
 public:
  LayerContext(Device& device, Stream& stream, ShardedOptimizer& optimizer, std::string layer)
      : device_(device), stream_(stream), optimizer_(optimizer), layer_(std::move(layer)) {}

  Device& device() { return device_; }
  Stream& stream() { return stream_; }
  // Whether compute should run (false on meta: shapes and bytes only).
  bool computes() const { return device_.holds_bytes(); }
  // The layer's parameter (f32) and the gradient its backward adds into.
  // kFailedPrecondition outside the engine's gather/acquire window. For
  // bf16/f16 parameters these are f32 workspace copies (see the file
  // comment), valid until ReleaseWorkspace().
  absl::StatusOr<const float*> Param(absl::string_view local);
  absl::StatusOr<float*> Grad(absl::string_view local);
  // Another layer's parameter that this layer also uses (a tied weight),
  // by full name; the layer lists it in SharedParameters().
  absl::StatusOr<const float*> SharedParam(absl::string_view full_name);
  absl::StatusOr<float*> SharedGrad(absl::string_view full_name);
  // The dtype activations are stored in (the engine sets the parameters'
  // dtype: f32, bf16 or f16).
  DType activation_dtype() const { return activation_dtype_; }
  void set_activation_dtype(DType dtype) { activation_dtype_ = dtype; }
  // An activation owned by the layer (counted by ActivationBytes), in
  // activation_dtype() or in `dtype`.
  absl::StatusOr<Tensor> Activation(std::vector<int64_t> shape);
  absl::StatusOr<Tensor> Activation(std::vector<int64_t> shape, DType dtype);
  // f32 memory to compute `activation` into: its own bytes when it is f32;
  // otherwise an f32 workspace that Commit(activation) rounds (to nearest
  // even) into it and frees. `activation` must stay at its address until
  // then.
  absl::StatusOr<float*> Stage(const Tensor& activation);
  // A no-op for an activation that was not staged through a workspace.
  absl::Status Commit(const Tensor& activation);
  // `tensor`'s values as f32: its own bytes when it is f32, else an f32
  // workspace copy valid until ReleaseWorkspace().
  absl::StatusOr<const float*> Read(const Tensor& tensor);
  // An f32 input gradient, owned by "<layer>.grad".
  absl::StatusOr<Tensor> InputGradient(std::vector<int64_t> shape);
  // f32 scratch for one forward or backward (category workspace, owned by
  // "<layer>.workspace"; not counted by ActivationBytes).
  absl::StatusOr<Tensor> Workspace(std::vector<int64_t> shape);
  // Tensors kept from forward for backward; the engine clears them after
  // the layer's backward (or, when the recomputation plan drops them, after
  // the forward).
  std::vector<Tensor>& saved() { return saved_; }
  // Whether this forward and backward run in selective-recomputation mode
  // (see Layer::Selective); set by the engine, only for layers offering it.
  bool selective() const { return selective_; }
  void set_selective(bool selective) { selective_ = selective; }

  // Layer side, for bf16/f16 runs (no-ops in f32): frees the f32 copies of
  // these parameters once the layer has used them for the last time in this
  // forward or backward, and adds these parameters' f32 gradients into the
  // low-precision ones once the backward has computed them, so a layer
  // holds one parameter's f32 copy and gradient at a time rather than all.
  absl::Status Release(absl::Span<const absl::string_view> locals);
  absl::Status FlushGradient(absl::Span<const absl::string_view> locals);
  // The same for shared parameters (SharedParam), by full name.
  absl::Status ReleaseShared(absl::Span<const absl::string_view> full_names);
  absl::Status FlushSharedGradient(absl::Span<const absl::string_view> full_names);

  // Engine side: adds the f32 gradient workspaces handed out since the last
  // call into the low-precision gradients (rounding once), then frees every
  // workspace. A no-op for f32 parameters.
  absl::Status FlushGradients();
  // Engine side: frees (in stream order) the f32 parameter copies and the
  // f32 copies Read made.
  absl::Status ReleaseWorkspace();
  // Engine side, after a failed step: waits for the stream and drops all the
  // context holds (saved tensors, workspaces, unflushed gradient copies).
  void Discard();

  // Gathering on use (Layer::UseGroups): Param and Grad gather the
  // parameter's group (and acquire its gradients) if this context does not
  // hold it yet; Release releases the groups of the parameters named,
  // reducing their gradients first if they were acquired. Set by the engine.
  void set_gathers_on_use(bool on) { gathers_on_use_ = on; }
  bool gathers_on_use() const { return gathers_on_use_; }
  // Gathering on use, groups an earlier layer uses too (a tied weight's
  // tiles, shared by a later layer): this layer's backward leaves their
  // gradients acquired when it releases them, and the earlier layer's
  // backward, which adds to them last, takes them over and reduces them.
  // Set by the engine.
  void set_deferred_reductions(std::set<int> groups) { deferred_ = std::move(groups); }
  // Engine side, after the layer's Forward or Backward: releases (reducing
  // acquired gradients first) whatever group the layer left held.
  absl::Status ReleaseGroups();

 private:
  struct Widened {
    ShardedOptimizer::View low;  // the parameter or gradient in its dtype
    Tensor wide;                 // its f32 workspace
  };
  absl::StatusOr<Tensor> Widen(const ShardedOptimizer::View& view, absl::string_view full_name,
                               bool copy);
  // Gathering on use: holds the group of `full_name` (gathered; its
  // gradients acquired too if `gradients`); lets group g go.
  absl::Status Hold(absl::string_view full_name, bool gradients);
  // Release and ReleaseShared of the n parameters name(0..n).
  absl::Status ReleaseNamed(size_t n, absl::FunctionRef<std::string(size_t)> name);
  // FlushGradient of one parameter, by full name.
  absl::Status FlushOne(const std::string& full_name);
  absl::Status Drop(int g);

  Device& device_;
  Stream& stream_;
  ShardedOptimizer& optimizer_;
  const std::string layer_;
  std::vector<Tensor> saved_;
  DType activation_dtype_ = DType::kF32;
  bool selective_ = false;
  std::map<std::string, Tensor> param_copies_;
  std::map<std::string, Widened> grad_copies_;
  std::map<const Tensor*, Tensor> staged_;  // activation -> its f32 workspace
  std::vector<Tensor> reads_;
  bool gathers_on_use_ = false;
  std::set<int> gathered_, acquired_;  // groups held on use
  std::set<int> deferred_;             // set_deferred_reductions
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;

  // Unique within the model; a prefix of its parameters' full names.
  const std::string& name() const { return name_; }
  virtual std::vector<ParameterDecl> Parameters() const = 0;
  // Full names of other layers' parameters this layer reads (tied weights,
  // e.g. an LM head reading the embedding); the engine gathers and reduces
  // them around this layer too.
  virtual std::vector<std::string> SharedParameters() const { return {}; }
  // kInvalidArgument (naming the layer) for an input shape it cannot take.
  virtual absl::StatusOr<std::vector<int64_t>> OutputShape(
      const std::vector<int64_t>& input) const = 0;
  // Bytes this layer allocates in forward and keeps until its backward,
  // with activations stored in `dtype` (LayerContext::activation_dtype()).
  // They include its output (stored in `dtype`), which the next layer reads.
  virtual int64_t ActivationBytes(const std::vector<int64_t>& input, DType dtype) const = 0;
  // Bytes of the input gradient its backward allocates (category
  // activation, owner "<layer>.grad", f32): the input's size in f32, or 0
  // for a layer whose input has no gradient (token ids).
  virtual int64_t InputGradientBytes(const std::vector<int64_t>& input) const {
    int64_t n = 1;
    for (int64_t d : input) n *= d;
    return 4 * n;
  }
  // Selective recomputation (Korthikanti et al. 2022): a layer that can keep
  // less in forward and recompute the rest at the start of its backward
  // says how, in this mode: the bytes it keeps from forward to backward
  // (like ActivationBytes, output included), the activation bytes it
  // allocates again at the start of backward, and the FLOPs that costs.
  struct SelectiveProfile {
    int64_t saved_bytes = 0;
    int64_t recomputed_bytes = 0;
    double extra_flops = 0;
  };
  virtual absl::optional<SelectiveProfile> Selective(const std::vector<int64_t>& input,
                                                     DType dtype) const {
    return absl::nullopt;
  }
  // Whether Backward reads `input`. False lets the engine free the previous
  // layer's output once this layer's forward has read it (unless a
  // recomputation segment starts here and keeps it as its checkpoint): a
  // traced PyTorch unit whose input autograd does not save.
  virtual bool BackwardReadsInput() const { return true; }
  // Whether a recomputation plan may run it again in backward. False for a
  // traced PyTorch stage the front end cannot rerun (not a block of its
  // own: the embeddings with the mask-making around them, the head with
  // the loss); the planners keep it (checkpointing/plan.h).
  virtual bool Recomputable() const { return true; }
  // Bytes a plan that recomputes holds for the whole step besides each
  // segment's input (Chain::recompute_held): a traced model's figure, the
  // same from each of its layers; the chain takes the largest.
  virtual int64_t RecomputeHeldBytes() const { return 0; }
  // Whether it uses its flat groups one after another rather than all at
  // once: a traced PyTorch unit, whose modules run in turn and whose
  // gradients autograd produces in turn, and whose Forward and Backward
  // read no parameter or gradient memory. The engine then handles one group
  // at a time, as the PyTorch front end does: in forward each group is
  // gathered and released in turn (kept if the next layer reads it); after
  // Backward, in reverse order, each is gathered, its gradient buffer
  // acquired, reduced and released in turn.
  virtual bool UsesGroupsInTurn() const { return false; }
  // Gathering on use (zero_optimization.stage3_gather_on_use): the sets of
  // its parameters (local names, every one in exactly one set) that one
  // operation reads together, such as a weight and its bias. A layer that
  // returns them fetches each set's parameters (Param, Grad) only around
  // the operation and then releases them (Release; FlushGradient first in
  // backward), so the engine can gather a set right before the operation
  // and release it (reducing its gradients, in backward) right after: the
  // device then holds one set, not the layer's parameters. Empty: the
  // layer's parameters are gathered for the whole layer.
  virtual std::vector<std::vector<std::string>> UseGroups() const { return {}; }
  // Multiply-adds count two FLOPs.
  virtual double ForwardFlops(const std::vector<int64_t>& input) const = 0;
  virtual absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& input) = 0;
  // Adds the parameter gradients; returns the gradient of `input` (f32).
  // `input` is empty when BackwardReadsInput() is false and it was freed.
  virtual absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& input,
                                          const Tensor& grad_output) = 0;

 private:
  const std::string name_;
};

// The loss on the last layer's output: returns the mean loss of the
// micro-batch and writes d(loss)/d(output) into `grad_output` (same shape).
class LossFunction {
 public:
  virtual ~LossFunction() = default;
  virtual absl::StatusOr<float> Compute(LayerContext& ctx, const Tensor& output,
                                        const Tensor& target, Tensor& grad_output) = 0;
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_LAYER_H_
