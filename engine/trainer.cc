#include "engine/trainer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/chain.h"
#include "kernels/ops.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// FNV-1a: a seed per parameter name that is the same in every process.
uint64_t NameSeed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The initial values of `decl`, a parameter of layer `layer`.
std::vector<float> InitialValues(const ParameterDecl& decl, const std::string& layer,
                                 uint64_t seed) {
  const std::string full_name = absl::StrCat(layer, ".", decl.name);
  int64_t n = 1;
  for (int64_t d : decl.shape) n *= d;
  std::vector<float> values(n, 0.0f);
  if (decl.init == ParameterDecl::Init::kOnes) std::fill(values.begin(), values.end(), 1.0f);
  if (decl.init == ParameterDecl::Init::kNormal && !decl.tile_of.empty()) {
    // A tile: its block of the whole parameter's values.
    ParameterDecl whole = decl;
    whole.name = decl.tile_of;
    whole.shape = decl.whole_shape;
    whole.tile_of.clear();
    const std::vector<float> all = InitialValues(whole, layer, seed);
    const int64_t rows = decl.shape[0], cols = decl.shape[1], stride = decl.whole_shape[1];
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(all.begin() + (decl.row + r) * stride + decl.column, cols,
                  values.begin() + r * cols);
    }
  } else if (decl.init == ParameterDecl::Init::kNormal) {
    std::mt19937_64 rng(NameSeed(full_name, seed));
    std::normal_distribution<float> normal(0.0f, decl.stddev);
    for (float& v : values) v = normal(rng);
  }
  return values;
}

// Whether `layer` gathers its parameters on use in this run
// (zero_optimization.stage3_gather_on_use, engine/layer.h UseGroups).
bool GathersOnUse(const Layer& layer, const ShardingOptions& options) {
  return options.zero.stage3_gather_on_use && options.zero.stage == 3 && !layer.UseGroups().empty();
}

// The explicit group of each parameter of a layer that gathers on use:
// "<layer>.<first parameter of its set>". kInvalidArgument naming the layer
// when the sets do not cover its parameters exactly once, a parameter
// already names a group, or a set mixes trainable and frozen parameters (a
// flat group is one or the other).
absl::StatusOr<std::map<std::string, std::string>> UseGroupNames(const Layer& layer) {
  std::map<std::string, std::string> group_of;
  for (const std::vector<std::string>& set : layer.UseGroups()) {
    for (const std::string& local : set) {
      if (!group_of.emplace(local, absl::StrCat(layer.name(), ".", set.front())).second) {
        return absl::InvalidArgumentError(absl::StrCat("Trainer: layer '", layer.name(),
                                                       "' lists '", local, "' in two use groups"));
      }
    }
  }
  const std::vector<ParameterDecl> decls = layer.Parameters();
  std::map<std::string, bool> trainable;  // of each use group's parameters, alike
  for (const ParameterDecl& decl : decls) {
    if (group_of.count(decl.name) == 0 || !decl.group.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Trainer: layer '", layer.name(), "' cannot gather '", decl.name,
          "' on use (every parameter in one use group, none naming a group of its own)"));
    }
    const auto [it, first] = trainable.emplace(group_of[decl.name], decl.trainable);
    if (!first && it->second != decl.trainable) {
      return absl::InvalidArgumentError(
          absl::StrCat("Trainer: layer '", layer.name(), "' cannot gather '", decl.name,
                       "' on use with the rest of its use group (they train; it is frozen, or "
                       "the other way round)"));
    }
  }
  if (group_of.size() != decls.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Trainer: layer '", layer.name(), "' lists use groups of parameters it does not declare"));
  }
  return group_of;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    std::vector<std::unique_ptr<Layer>> layers, std::unique_ptr<LossFunction> loss,
    const ShardingOptions& options, Device& device, Communicator& comm, uint64_t seed) {
  if (layers.empty()) return absl::InvalidArgumentError("Trainer: the model has no layers");
  MW_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> optimizer,
                      ShardedOptimizer::Create(options, device, comm));
  std::set<std::string> names;
  // Parameters naming an explicit group (and frozen ones, which a layer's
  // buckets cannot hold: "<layer> (frozen)") are registered a group at a
  // time, as the consecutive run of declarations naming it.
  std::string pending_group;
  std::vector<ShardedOptimizer::ParameterInit> pending;
  auto flush = [&]() -> absl::Status {
    if (pending.empty()) return absl::OkStatus();
    absl::Status s = optimizer->AddParameterGroup(pending_group, std::move(pending));
    pending.clear();
    return s;
  };
  for (const auto& layer : layers) {
    if (!names.insert(layer->name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Trainer: two layers are named '", layer->name(), "'"));
    }
    std::map<std::string, std::string> use_groups;
    if (GathersOnUse(*layer, options)) {
      MW_ASSIGN_OR_RETURN(use_groups, UseGroupNames(*layer));
    }
    for (const ParameterDecl& decl : layer->Parameters()) {
      const std::string full = absl::StrCat(layer->name(), ".", decl.name);
      // Meta holds no values: do not generate billions of them.
      std::vector<float> values =
          device.holds_bytes() ? InitialValues(decl, layer->name(), seed) : std::vector<float>();
      const std::string group = !use_groups.empty()   ? use_groups.at(decl.name)
                                : !decl.group.empty() ? decl.group
                                : decl.trainable      ? std::string()
                                                      : absl::StrCat(layer->name(), " (frozen)");
      if (group != pending_group) MW_RETURN_IF_ERROR(flush());
      pending_group = group;
      if (group.empty()) {
        MW_RETURN_IF_ERROR(optimizer->AddParameter(full, decl.shape, values));
      } else {
        pending.push_back({full, decl.shape, std::move(values), decl.trainable, 0});
      }
    }
  }
  MW_RETURN_IF_ERROR(flush());
  MW_RETURN_IF_ERROR(optimizer->Finalize());
  for (const auto& layer : layers) {
    for (const std::string& shared : layer->SharedParameters()) {
      if (!optimizer->GroupOf(shared).ok()) {
        return absl::InvalidArgumentError(absl::StrCat("Trainer: layer '", layer->name(),
                                                       "' shares '", shared,
                                                       "', which no layer declares"));
      }
    }
  }
  return std::unique_ptr<Trainer>(
      new Trainer(std::move(layers), std::move(loss), device, std::move(optimizer)));
}

Trainer::Trainer(std::vector<std::unique_ptr<Layer>> layers, std::unique_ptr<LossFunction> loss,
                 Device& device, std::unique_ptr<ShardedOptimizer> optimizer)
    : layers_(std::move(layers)),
      loss_(std::move(loss)),
      device_(device),
      optimizer_(std::move(optimizer)),
      states_(*optimizer_),
      stream_(&optimizer_->stream()) {
  // Activations are stored in the parameters' dtype (16-bit storage, f32
  // compute; see engine/layer.h).
  const DType activation_dtype = optimizer_->config().param_dtype();
  for (const auto& layer : layers_) {
    contexts_.push_back(
        std::make_unique<LayerContext>(device_, *stream_, *optimizer_, layer->name()));
    contexts_.back()->set_activation_dtype(activation_dtype);
    contexts_.back()->set_gathers_on_use(GathersOnUse(*layer, optimizer_->config()));
    std::set<int> groups;
    for (const ParameterDecl& d : layer->Parameters()) {
      groups.insert(optimizer_->GroupOf(absl::StrCat(layer->name(), ".", d.name)).value());
    }
    for (const std::string& shared : layer->SharedParameters()) {
      groups.insert(optimizer_->GroupOf(shared).value());
    }
    groups_of_layer_.emplace_back(groups.begin(), groups.end());
  }
  first_user_.assign(optimizer_->layout().groups.size(), -1);
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    for (int g : groups_of_layer_[l]) first_user_[g] = l;
  }
  // Gathering on use, a group's gradients are reduced by its first user's
  // backward, the last to add to them.
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::set<int> deferred;
    for (int g : groups_of_layer_[l]) {
      if (first_user_[g] != static_cast<int>(l)) deferred.insert(g);
    }
    contexts_[l]->set_deferred_reductions(std::move(deferred));
  }
  loss_context_ = std::make_unique<LayerContext>(device_, *stream_, *optimizer_, "loss");
  loss_context_->set_activation_dtype(activation_dtype);
  // No recomputation until a plan is set.
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    plan_.segments.push_back({l, l + 1, SegmentMode::kKeep});
    segment_of_.push_back(l);
  }
  plan_.planner = "none";
}

absl::StatusOr<Chain> Trainer::ChainFor(const std::vector<int64_t>& input) const {
  return ChainOf(layers_, input, optimizer_->config().param_dtype());
}

absl::Status Trainer::SetRecomputationPlan(const RecomputationPlan& plan, const Chain& chain) {
  if (chain.layers.size() != layers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("recomputation plan '", plan.planner, "': for ",
                                                   chain.layers.size(), " layers; the model has ",
                                                   layers_.size()));
  }
  MW_RETURN_IF_ERROR(ValidatePlan(chain, plan));
  for (const Segment& s : plan.segments) {
    if (s.mode == SegmentMode::kOffload && device_.pinned_allocator() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "recomputation plan '", plan.planner, "': segment [", s.begin, ", ", s.end,
          ") offloads its input to pinned host memory, but ", device_.name(),
          " has no pinned pool (DeviceOptions::pinned_capacity_bytes)"));
    }
  }
  std::vector<int> segment_of(layers_.size());
  for (size_t k = 0; k < plan.segments.size(); ++k) {
    for (int l = plan.segments[k].begin; l < plan.segments[k].end; ++l) segment_of[l] = k;
  }
  plan_ = plan;
  segment_of_ = std::move(segment_of);
  recompute_held_ = Recomputes(plan) ? chain.recompute_held : 0;
  return absl::OkStatus();
}

const Tensor& Trainer::Pass::input_of(int l) const {
  return l == 0 ? batch.input : outputs[l - 1];
}

absl::Status Trainer::Offload(Pass& pass, int l) {
  Tensor& t = pass.outputs[l];
  MW_ASSIGN_OR_RETURN(DeviceBuffer host,
                      device_.AllocatePinned(t.nbytes(), MemoryCategory::kCheckpointedActivation,
                                             absl::StrCat(t.owner(), ".offloaded")));
  MW_RETURN_IF_ERROR(device_.CopyAsync(host.data(), t.data(), t.nbytes(), *stream_));
  MW_RETURN_IF_ERROR(stream_->Synchronize());
  pass.offloaded[l] = Pass::Offloaded{std::move(host), t.dtype(), t.shape(), t.owner()};
  t = Tensor();
  return absl::OkStatus();
}

absl::Status Trainer::Fetch(Pass& pass, int l) {
  Pass::Offloaded& o = pass.offloaded.at(l);
  MW_ASSIGN_OR_RETURN(pass.outputs[l], Tensor::Empty(device_, o.dtype, o.shape,
                                                     MemoryCategory::kActivation, o.owner));
  MW_RETURN_IF_ERROR(device_.CopyAsync(pass.outputs[l].data(), o.host.data(),
                                       pass.outputs[l].nbytes(), *stream_));
  MW_RETURN_IF_ERROR(stream_->Synchronize());
  pass.offloaded.erase(l);
  return absl::OkStatus();
}

absl::Status Trainer::ReleaseUnread(Pass& pass, std::set<int>& held, const std::vector<int>& next) {
  for (auto it = held.begin(); it != held.end();) {
    const int g = *it;
    if (std::find(next.begin(), next.end(), g) != next.end()) {
      ++it;
      continue;
    }
    MW_RETURN_IF_ERROR(optimizer_->ReleaseParameters(g));
    it = held.erase(it);
    pass.gathered.erase(g);
  }
  return absl::OkStatus();
}

absl::Status Trainer::Forward(Pass& pass) {
  // A layer's groups are gathered before it runs and released once the
  // next layer does not read them.
  const int n = static_cast<int>(layers_.size());
  ScopedPhase forward(profiler_, "forward");
  if (recompute_held_ > 0) {
    const DType dtype = optimizer_->config().param_dtype();
    MW_ASSIGN_OR_RETURN(pass.recompute_held,
                        Tensor::Empty(device_, dtype, {recompute_held_ / int64_t(DTypeSize(dtype))},
                                      MemoryCategory::kActivation, "recomputation inputs"));
  }
  const std::vector<int> none;
  for (int l = 0; l < n; ++l) {
    ScopedPhase layer(profiler_, layers_[l]->name());
    const std::vector<int>& next = l + 1 < n ? groups_of_layer_[l + 1] : none;
    // Gathering on use: the layer's Forward gathers its groups itself.
    for (int g : contexts_[l]->gathers_on_use() ? none : groups_of_layer_[l]) {
      if (!pass.gathered.insert(g).second) continue;
      MW_RETURN_IF_ERROR(optimizer_->GatherParameters(g));
      if (layers_[l]->UsesGroupsInTurn() && std::find(next.begin(), next.end(), g) == next.end()) {
        MW_RETURN_IF_ERROR(optimizer_->ReleaseParameters(g));
        pass.gathered.erase(g);
      }
    }
    const Segment& segment = plan_.segments[segment_of_[l]];
    contexts_[l]->set_selective(segment.mode == SegmentMode::kSelective);
    MW_ASSIGN_OR_RETURN(pass.outputs[l], layers_[l]->Forward(*contexts_[l], pass.input_of(l)));
    MW_RETURN_IF_ERROR(contexts_[l]->ReleaseWorkspace());
    MW_RETURN_IF_ERROR(contexts_[l]->ReleaseGroups());
    if (segment.mode == SegmentMode::kRecompute || segment.mode == SegmentMode::kOffload) {
      // Keep only the segment's last output: this layer's saved tensors,
      // and the previous output once this layer has read it, go now.
      contexts_[l]->saved().clear();
      if (l > segment.begin) pass.outputs[l - 1] = Tensor();
    } else if (l > 0 && !layers_[l]->BackwardReadsInput()) {
      // Nothing reads it again (a kept segment recomputes nothing from it).
      pass.outputs[l - 1] = Tensor();
    }
    if (segment.mode == SegmentMode::kOffload && l == segment.end - 1) {
      MW_RETURN_IF_ERROR(Offload(pass, segment.begin - 1));  // the segment's input
    }
    MW_RETURN_IF_ERROR(ReleaseUnread(pass, pass.gathered, next));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Trainer::Loss(Pass& pass, float& loss) {
  // The loss, scaled for fp16 training.
  ScopedPhase phase(profiler_, "loss");
  const Tensor& output = pass.outputs.back();
  MW_ASSIGN_OR_RETURN(Tensor grad, loss_context_->InputGradient(output.shape()));
  MW_ASSIGN_OR_RETURN(loss, loss_->Compute(*loss_context_, output, pass.batch.target, grad));
  MW_RETURN_IF_ERROR(loss_context_->ReleaseWorkspace());
  const float scale = optimizer_->loss_scale();
  if (scale != 1.0f) {
    MW_RETURN_IF_ERROR(
        kernels::Scale(device_, *stream_, grad.data(), DType::kF32, grad.numel(), scale));
  }
  return grad;
}

absl::Status Trainer::Recompute(Pass& pass, const Segment& segment, int l) {
  // The segment's forward again, from its input, keeping every activation.
  // Parameters are held as in forward, not for the whole segment: a group
  // this recomputation gathers goes once the next layer does not read it
  // (backward gathers it again), so a long segment at stage 3 never holds
  // more than two layers' parameters.
  ScopedPhase recompute(profiler_, absl::StrCat("recompute ", layers_[segment.begin]->name(),
                                                "..", layers_[l]->name()));
  if (segment.mode == SegmentMode::kOffload) MW_RETURN_IF_ERROR(Fetch(pass, segment.begin - 1));
  pass.outputs[l] = Tensor();  // the checkpoint: recomputed with the rest
  std::set<int> regathered;    // not those backward already holds
  const std::vector<int> none;
  for (int j = segment.begin; j < segment.end; ++j) {
    // Gathering on use: the layer's Forward gathers its groups itself.
    for (int g : contexts_[j]->gathers_on_use() ? none : groups_of_layer_[j]) {
      if (pass.gathered.insert(g).second) {
        MW_RETURN_IF_ERROR(optimizer_->GatherParameters(g));
        regathered.insert(g);
      }
    }
    MW_ASSIGN_OR_RETURN(pass.outputs[j], layers_[j]->Forward(*contexts_[j], pass.input_of(j)));
    MW_RETURN_IF_ERROR(contexts_[j]->ReleaseWorkspace());
    MW_RETURN_IF_ERROR(contexts_[j]->ReleaseGroups());
    if (j < l) MW_RETURN_IF_ERROR(ReleaseUnread(pass, regathered, groups_of_layer_[j + 1]));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Backward(Pass& pass, Tensor grad) {
  // A group is gathered and its gradients acquired when backward first
  // reaches a layer that reads it (gathered earlier if a recomputed segment
  // reads it), and reduced and released after the first layer (in forward
  // order) that reads it. `pass.gathered` is empty again: forward released
  // every group.
  ShardedOptimizer& opt = *optimizer_;
  std::set<int> acquired;
  ScopedPhase backward(profiler_, "backward");
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    const Segment& segment = plan_.segments[segment_of_[l]];
    const bool recomputed =
        segment.mode == SegmentMode::kRecompute || segment.mode == SegmentMode::kOffload;
    if (recomputed && l == segment.end - 1) MW_RETURN_IF_ERROR(Recompute(pass, segment, l));
    ScopedPhase layer(profiler_, layers_[l]->name());
    const bool by_group = layers_[l]->UsesGroupsInTurn();
    // Gathering on use: the layer's Backward gathers, reduces and releases
    // each of its groups around the operation that uses it.
    const bool on_use = contexts_[l]->gathers_on_use();
    auto acquire = [&](int g) -> absl::Status {
      if (!opt.layout().groups[g].trainable || !acquired.insert(g).second) {
        return absl::OkStatus();
      }
      return opt.AcquireGradients(g);
    };
    auto gather = [&](int g) -> absl::Status {
      return pass.gathered.insert(g).second ? opt.GatherParameters(g) : absl::OkStatus();
    };
    if (!by_group && !on_use) {
      for (int g : groups_of_layer_[l]) {
        MW_RETURN_IF_ERROR(gather(g));
        MW_RETURN_IF_ERROR(acquire(g));
      }
    }
    MW_ASSIGN_OR_RETURN(Tensor grad_input,
                        layers_[l]->Backward(*contexts_[l], pass.input_of(l), grad));
    contexts_[l]->saved().clear();
    MW_RETURN_IF_ERROR(contexts_[l]->FlushGradients());
    MW_RETURN_IF_ERROR(contexts_[l]->ReleaseGroups());
    pass.outputs[l] = Tensor();  // read by layer l + 1's backward, which has run
    grad = std::move(grad_input);
    if (on_use) continue;
    // By group: in reverse registration order, as autograd reaches modules.
    std::vector<int> groups = groups_of_layer_[l];
    if (by_group) std::reverse(groups.begin(), groups.end());
    for (int g : groups) {
      if (by_group) {
        MW_RETURN_IF_ERROR(gather(g));
        MW_RETURN_IF_ERROR(acquire(g));
      }
      if (first_user_[g] != l) continue;
      if (opt.layout().groups[g].trainable) MW_RETURN_IF_ERROR(opt.ReduceGradients(g));
      MW_RETURN_IF_ERROR(opt.ReleaseParameters(g));
      pass.gathered.erase(g);
      acquired.erase(g);
    }
  }
  pass.recompute_held = Tensor();
  return absl::OkStatus();
}

absl::StatusOr<float> Trainer::MicroBatch(const Batch& batch) {
  Pass pass{batch, std::vector<Tensor>(layers_.size()), {}, {}};
  MW_RETURN_IF_ERROR(Forward(pass));
  float loss = 0.0f;
  MW_ASSIGN_OR_RETURN(Tensor grad, Loss(pass, loss));
  MW_RETURN_IF_ERROR(Backward(pass, std::move(grad)));
  return loss;
}

absl::StatusOr<Trainer::StepReport> Trainer::TrainStep(absl::Span<const Batch> micro_batches) {
  const int expected = optimizer_->config().gradient_accumulation_steps;
  if (static_cast<int>(micro_batches.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainStep: ", micro_batches.size(), " micro-batches for gradient_accumulation_steps ",
        expected));
  }
  // The layers compute on the optimizer's stream: what they allocate is its.
  Device::StreamGuard compute(optimizer_->device(), optimizer_->stream());
  StepReport report;
  Communicator& comm = optimizer_->communicator();
  const LinkBytes traffic_before = comm.total_link_bytes();
  const Arrivals arrivals_before = comm.arrivals();
  ScopedPhase step(profiler_, absl::StrCat("step ", steps_));
  absl::Status failed = absl::OkStatus();
  double sum = 0;
  for (size_t u = 0; u < micro_batches.size() && failed.ok(); ++u) {
    ScopedPhase micro(profiler_, absl::StrCat("micro-batch ", u));
    absl::StatusOr<float> loss = MicroBatch(micro_batches[u]);
    if (loss.ok()) sum += *loss;
    failed = loss.status();
  }
  if (failed.ok()) {
    report.loss = static_cast<float>(sum / expected);
    ScopedPhase update(profiler_, "optimizer step");
    absl::StatusOr<ShardedOptimizer::StepResult> stepped = optimizer_->Step();
    if (stepped.ok()) report.step = *stepped;
    failed = stepped.status();
  }
  if (!failed.ok()) {
    // Nothing of the failed step stays: activations, gathered parameters,
    // gradients. The model is as before it, and the next step starts clean.
    for (auto& context : contexts_) context->Discard();
    loss_context_->Discard();
    (void)optimizer_->AbortStep();  // `failed` is the error to report
    return failed;
  }
  ++steps_;
  // Step() has waited for the step's collectives: the counters are current.
  report.traffic = comm.total_link_bytes() - traffic_before;
  report.arrivals = comm.arrivals();
  for (int r = 0; r < comm.world_size(); ++r) {
    report.arrivals.last[r] -= arrivals_before.last[r];
    report.arrivals.cost[r] -= arrivals_before.cost[r];
  }
  return report;
}

}  // namespace memwall
