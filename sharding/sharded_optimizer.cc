#include "sharding/sharded_optimizer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "offload/nvme_chunk_stream.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    const ShardingOptions& config, Device& device, Communicator& comm,
    std::unique_ptr<Stream> caller_stream) {
  // An unresolved "auto" (-1) or any other stage would run with no gradient
  // reduction at all: ranks would drift apart while every step succeeds.
  if (config.zero.stage < 0 || config.zero.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardedOptimizer: zero_optimization.stage: expected 0, 1, 2 or 3, got ",
        config.zero.stage,
        config.zero.stage == kAutoStage ? " (\"auto\" unresolved: the engine resolves it)" : ""));
  }
  const bool simulated = comm.kind() == "simulated";
  if (device.backend() == Backend::kMeta && !simulated && comm.world_size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardedOptimizer: a meta device needs the simulated communicator, got ", comm.kind()));
  }
  if (device.backend() != Backend::kMeta && simulated && comm.world_size() > 1) {
    return absl::InvalidArgumentError(
        "ShardedOptimizer: the simulated communicator moves no bytes; use it with a meta device");
  }
  if (device.backend() == Backend::kCuda && comm.kind() == "mpi") {
    return absl::InvalidArgumentError(
        "ShardedOptimizer: a cuda device needs the NCCL communicator (MPI works on host memory)");
  }
  // The combinations of settings, as the config parser checks them.
  MW_RETURN_IF_ERROR(CheckZeroConfig(config.zero));
  const float ratio = config.zero.offload_optimizer_ratio;
  if (ratio > 0 && device.pinned_allocator() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ShardedOptimizer: offload_optimizer keeps optimizer states in pinned host memory, but ",
        device.name(), " has no pinned pool (DeviceOptions::pinned_capacity_bytes)"));
  }
  std::unique_ptr<Stream> stream = std::move(caller_stream);
  if (stream == nullptr) {
    MW_ASSIGN_OR_RETURN(stream, device.CreateStream());
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> comm_stream, config.zero.overlap_comm
                                                               ? device.CreateAsyncStream()
                                                               : device.CreateStream());
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Event> caller_event, device.CreateEvent());
  std::unique_ptr<ShardedOptimizer> optimizer(new ShardedOptimizer(
      config, device, comm, std::move(stream), std::move(comm_stream), std::move(caller_event)));
  if (config.zero.mics_shard_size > 0) {
    const int size = static_cast<int>(config.zero.mics_shard_size);
    absl::StatusOr<std::unique_ptr<Communicator>> group = comm.SplitBlocks(size);
    if (!group.ok()) {
      return absl::Status(group.status().code(), absl::StrCat("zero_optimization.mics_shard_size: ",
                                                              group.status().message()));
    }
    optimizer->shard_group_ = *std::move(group);
    MW_ASSIGN_OR_RETURN(optimizer->replica_group_, comm.SplitStrided(size));
  }
  MW_ASSIGN_OR_RETURN(optimizer->reducer_,
                      GradientReducer::Create(optimizer->config_, device, optimizer->shards(),
                                              *optimizer->stream_, *optimizer->comm_stream_,
                                              optimizer->replica_group_.get()));
  if (optimizer->overlaps_update()) {
    std::vector<int> cores;
    if (config.zero.offload_bind_cores) {
      cores = UpdateWorker::CoresFor(comm.rank(),
                                     kernels::cpu::CpuThreadsOr(config.zero.offload_cpu_threads),
                                     static_cast<int>(std::thread::hardware_concurrency()));
    }
    MW_ASSIGN_OR_RETURN(optimizer->overlapped_, OverlappedUpdate::Create(device, std::move(cores)));
  }
  return optimizer;
}

ShardedOptimizer::ShardedOptimizer(const ShardingOptions& config, Device& device, Communicator& comm,
                                   std::unique_ptr<Stream> stream,
                                   std::unique_ptr<Stream> comm_stream,
                                   std::unique_ptr<Event> caller_event)
    : config_(config),
      device_(device),
      comm_(comm),
      stream_(std::move(stream)),
      comm_stream_(std::move(comm_stream)),
      caller_event_(std::move(caller_event)),
      scaler_(config.loss_scale, config.fp16) {}

ShardedOptimizer::~ShardedOptimizer() {
  // A failure here was already reported by the call that failed, or would
  // have been by the next Step(); the buffers must outlive the work anyway.
  if (overlapped_ != nullptr) overlapped_->Wait();
  (void)comm_stream_->Synchronize();
}

absl::Status ShardedOptimizer::AddParameter(std::string name, std::vector<int64_t> shape,
                                            absl::Span<const float> initial_values) {
  return Register(std::move(name), std::move(shape),
                  std::vector<float>(initial_values.begin(), initial_values.end()), "",
                  /*trainable=*/true, /*hyper_group=*/0);
}

absl::Status ShardedOptimizer::AddParameterGroup(std::string group,
                                                 std::vector<ParameterInit> parameters) {
  if (group.empty()) return absl::InvalidArgumentError("AddParameterGroup: the group name is empty");
  if (parameters.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddParameterGroup('", group, "'): the group has no parameters"));
  }
  for (const ParameterSpec& spec : specs_) {
    if (spec.group == group) {
      return absl::InvalidArgumentError(
          absl::StrCat("AddParameterGroup('", group, "'): a group of that name exists"));
    }
  }
  const size_t before = specs_.size();
  for (ParameterInit& p : parameters) {
    absl::Status added =
        Register(std::move(p.name), std::move(p.shape), std::move(p.values), group, p.trainable,
                 p.hyper_group);
    if (!added.ok()) {
      while (specs_.size() > before) {
        index_.erase(specs_.back().name);
        specs_.pop_back();
        initial_.pop_back();
        hyper_of_.pop_back();
      }
      return added;
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::Register(std::string name, std::vector<int64_t> shape,
                                        std::vector<float> initial_values,
                                        std::string group, bool trainable, int hyper_group) {
  if (finalized_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AddParameter('", name, "'): the optimizer is finalized; register every parameter first"));
  }
  if (index_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "': registered twice"));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "': shape[", d, "] is ", shape[d], "; expected >= 1"));
    }
  }
  const int64_t numel = NumElements(shape);
  const bool no_values = initial_values.empty() && !device_.holds_bytes();
  if (!no_values && static_cast<int64_t>(initial_values.size()) != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", name, "': ", initial_values.size(),
                     " initial values for a shape of ", numel, " elements"));
  }
  if (hyper_group < 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "': hyperparameter group ",
                                                   hyper_group, "; expected >= 0"));
  }
  index_[name] = static_cast<int>(specs_.size());
  specs_.push_back({std::move(name), std::move(shape), std::move(group), trainable});
  initial_.push_back(std::move(initial_values));
  hyper_of_.push_back(hyper_group);
  return absl::OkStatus();
}

int64_t ShardedOptimizer::update_numel(const FlatGroup& g) const {
  return rules_.update_numel(g);  // 0 for a frozen group: nothing to update, no state
}

int64_t ShardedOptimizer::update_begin(const FlatGroup& g) const {
  return rules_.update_begin(g, shards().rank());
}

int64_t ShardedOptimizer::host_numel(const FlatGroup& g) const {
  const int64_t n = update_numel(g);
  return std::min<int64_t>(n, std::llround(double(config_.zero.offload_optimizer_ratio) * n));
}

absl::Status ShardedOptimizer::AllocateGroup(int g, Group& group) {
  const FlatGroup& flat = layout_.groups[g];
  const DType dtype = config_.param_dtype();
  const int64_t k = host_numel(flat), n = update_numel(flat) - k;  // host, device parts
  MW_RETURN_IF_ERROR(residence_->Allocate(g));
  if (flat.trainable && !streams_gradients(flat)) {
    MW_ASSIGN_OR_RETURN(
        group.grads,
        device_.Allocate(rules_.held_gradients(flat) * DTypeSize(dtype),
                         MemoryCategory::kGradient, absl::StrCat(flat.name, ".grad")));
  }
  const bool adam = config_.optimizer.type == OptimizerType::kAdam;
  const bool momentum = adam || config_.optimizer.momentum > 0;
  const StateTier::Rule rule = adam ? StateTier::Rule::kAdam : StateTier::Rule::kSgd;
  if (n > 0) {
    // f32 runs: the parameters this rank updates are its master weights.
    float* f32_params = mixed() ? nullptr : static_cast<float*>(ParamsAt(g, k));
    MW_ASSIGN_OR_RETURN(group.device_state,
                        DeviceOptimizerSlice::Create(device_, *comm_stream_, rule, momentum, dtype,
                                                     n, flat.name, f32_params));
  }
  if (k == 0) return absl::OkStatus();
  // Offload: the host part (an f32 master copy even in f32 runs).
  HostOptimizerSlice::Options options;
  options.store = nvme_.get();
  // A chunk of the NVMe tier keeps every request of the I/O engine busy.
  options.nvme_buffer_bytes =
      config_.aio.block_size * config_.aio.queue_depth * config_.aio.thread_count;
  options.nvme_buffer_count = config_.zero.offload_buffer_count;
  // Parameters on NVMe: the gradients too, so host memory holds buffers.
  options.gradients_on_nvme = residence_->pages() != nullptr;
  options.speculative = overlaps_update();  // pinned tier: a spare copy
  options.threads = config_.zero.offload_cpu_threads;
  MW_ASSIGN_OR_RETURN(group.host, HostOptimizerSlice::Create(device_, rule, momentum, dtype, k,
                                                             flat.name, options));
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::InitializeGroup(int g, Group& group) {
  const FlatGroup& flat = layout_.groups[g];
  const DType dtype = config_.param_dtype();
  // Meta holds no values but allocates the staging a real run allocates, so
  // that its caching allocator starts the first step as a real run's does.
  const bool values = device_.holds_bytes();
  // The group's initial values in f32, padding zero, for elements
  // [begin, begin + count) of the padded group; none on meta.
  auto initial = [&](int64_t begin, int64_t count) {
    std::vector<float> host;
    if (!values) return host;
    host.assign(count, 0.0f);
    for (int p : flat.parameters) {
      const ParameterPlacement& place = layout_.placements[p];
      const int64_t lo = std::max(place.offset, begin);
      const int64_t hi = std::min(place.offset + place.numel, begin + count);
      for (int64_t i = lo; i < hi; ++i) host[i - begin] = initial_[p][i - place.offset];
    }
    return host;
  };
  const std::vector<float> held =
      initial(rules_.held_parameters_begin(flat, shards().rank()), rules_.held_parameters(flat));
  MW_RETURN_IF_ERROR(
      residence_->Write(g, values ? held.data() : nullptr, *stream_, "optimizer.init"));
  const int64_t k = host_numel(flat), n = update_numel(flat) - k;
  if (mixed() && n > 0) {
    const std::vector<float> master = initial(update_begin(flat) + k, n);
    MW_RETURN_IF_ERROR(UploadF32(device_, *stream_, values ? master.data() : nullptr, n,
                                 group.device_state->master(), DType::kF32, "optimizer.init"));
  }
  const int64_t grads = rules_.held_gradients(flat);
  if (!group.grads.empty()) {
    MW_RETURN_IF_ERROR(kernels::Fill(device_, *stream_, group.grads.data(), dtype, grads, 0.0f));
  }
  if (k > 0 && values) {
    MW_RETURN_IF_ERROR(group.host->WriteState(0, 0, k, initial(update_begin(flat), k).data()));
  }
  return stream_->Synchronize();
}

absl::Status ShardedOptimizer::Finalize() {
  if (finalized_) return absl::FailedPreconditionError("Finalize: called twice");
  MW_ASSIGN_OR_RETURN(FlatLayout layout,
                      BuildFlatLayout(specs_, shards().world_size(), config_.zero.reduce_bucket_size,
                                     kShardAlignmentElements));
  layout_ = std::move(layout);
  // Unique per optimizer: a process may hold several.
  static std::atomic<int> instances{0};
  const auto open_store = [&](const std::string& directory, const char* what,
                              std::unique_ptr<NvmeStore>& store) -> absl::Status {
    const std::string name = absl::StrCat("memwall-", what, "-rank", comm_.rank(), "-pid",
                                          ::getpid(), "-", instances++, ".bin");
    if (!device_.holds_bytes()) {
      store = NvmeStore::Virtual(absl::StrCat(directory, "/", name));
      return absl::OkStatus();
    }
    MW_ASSIGN_OR_RETURN(store, NvmeStore::Open(directory, name, config_.aio));
    return absl::OkStatus();
  };
  if (config_.zero.offload_optimizer_ratio > 0 && !config_.zero.offload_nvme_path.empty()) {
    MW_RETURN_IF_ERROR(open_store(config_.zero.offload_nvme_path, "optimizer", nvme_));
  }
  std::vector<Group> groups(layout_.groups.size());
  // On failure `groups` frees whatever was allocated, and the NVMe files
  // go: no half state.
  auto fail = [&](absl::Status status) {
    groups.clear();
    nvme_.reset();
    residence_.reset();
    return status;
  };
  std::unique_ptr<NvmeStore> param_file;
  if (config_.zero.offload_param && !config_.zero.offload_param_nvme_path.empty()) {
    if (absl::Status s = open_store(config_.zero.offload_param_nvme_path, "params", param_file);
        !s.ok()) {
      return fail(s);
    }
  }
  absl::StatusOr<std::unique_ptr<ParamResidence>> residence =
      ParamResidence::Create(config_, layout_, device_, std::move(param_file));
  if (!residence.ok()) return fail(residence.status());
  residence_ = *std::move(residence);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (absl::Status s = AllocateGroup(static_cast<int>(g), groups[g]); !s.ok()) return fail(s);
  }
  // The NVMe tier's chunk buffers: as many as the group with the most
  // chunks streams through alone, each the size of the largest chunk.
  for (const Group& group : groups) {
    if (group.host == nullptr) continue;
    chunk_buffers_.count = std::max(chunk_buffers_.count, group.host->nvme_buffer_count());
    chunk_buffers_.stride = std::max(chunk_buffers_.stride, group.host->nvme_buffer_stride());
  }
  if (absl::Status s = residence_->AllocatePages(); !s.ok()) return fail(s);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (absl::Status s = InitializeGroup(static_cast<int>(g), groups[g]); !s.ok()) return fail(s);
  }
  groups_ = std::move(groups);
  hyper_.Build(layout_, hyper_of_);
  if (overlapped_ != nullptr) {
    overlapped_->SetGroups(static_cast<int>(groups_.size()), nvme_.get(), chunk_buffers_);
  }
  if (rules_.shards_parameters() && config_.zero.hpz_partition_size > 1) {
    absl::StatusOr<std::unique_ptr<Communicator>> blocks =
        comm_.SplitBlocks(static_cast<int>(config_.zero.hpz_partition_size));
    if (!blocks.ok()) {
      return absl::Status(blocks.status().code(),
                          absl::StrCat("zero_optimization.zero_hpz_partition_size: ",
                                       blocks.status().message()));
    }
    secondary_comm_ = *std::move(blocks);
  }
  gatherer_ = std::make_unique<ParameterGatherer>(
      config_, layout_, device_, shards(), secondary_comm_.get(), *stream_, *comm_stream_,
      residence_->pages(),
      [this](int g) { return residence_->shard(g); },
      [this] { return OrderAfterCaller(); });
  initial_.clear();
  initial_.shrink_to_fit();
  finalized_ = true;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::RequireFinalized(absl::string_view call) const {
  if (!finalized_) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": call Finalize() after registering the parameters"));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::CheckGroup(int g, absl::string_view call) const {
  MW_RETURN_IF_ERROR(RequireFinalized(call));
  if (g < 0 || g >= static_cast<int>(groups_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": group ", g, " does not exist (",
                                                   groups_.size(), " groups)"));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::CheckTrainable(int g, absl::string_view call) const {
  if (layout_.groups[g].trainable) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      call, ": group ", g, " ('", layout_.groups[g].name, "') is frozen and has no gradients"));
}

float ShardedOptimizer::LearningRate(int index) const {
  return hyper_.LearningRate(index, steps_applied_);
}

absl::Status ShardedOptimizer::SetHyperparameters(int index, const Hyperparameters& values) {
  MW_RETURN_IF_ERROR(RequireFinalized("SetHyperparameters"));
  return hyper_.Set(index, values);
}

absl::StatusOr<const ParameterPlacement*> ShardedOptimizer::Placement(
    absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("parameter '", name, "': not registered"));
  }
  MW_RETURN_IF_ERROR(RequireFinalized(absl::StrCat("parameter '", name, "'")));
  return &layout_.placements[it->second];
}

absl::StatusOr<int> ShardedOptimizer::GroupOf(absl::string_view name) const {
  MW_ASSIGN_OR_RETURN(const ParameterPlacement* place, Placement(name));
  return place->group;
}

ShardedOptimizer::View ShardedOptimizer::ViewOf(const ParameterPlacement& place,
                                                void* base) const {
  const DType dtype = config_.param_dtype();
  return View{device_.holds_bytes() ? ElementOffset(base, place.offset, dtype) : nullptr,
              dtype, place.numel};
}

absl::StatusOr<ShardedOptimizer::View> ShardedOptimizer::Parameter(absl::string_view name) {
  MW_ASSIGN_OR_RETURN(const ParameterPlacement* place, Placement(name));
  const int g = place->group;
  if (!rules_.shards_parameters()) return ViewOf(*place, residence_->data(g));
  // A prefetch may still be in flight: only GatherParameters waits for it.
  const DeviceBuffer* gathered = gatherer_->held(g);
  if (gathered == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter '", name, "': its group ", g, " ('", layout_.groups[g].name,
                     "') is not gathered; call GatherParameters(", g, ") first"));
  }
  return ViewOf(*place, gathered->data());
}

absl::StatusOr<ShardedOptimizer::View> ShardedOptimizer::Gradient(absl::string_view name) {
  MW_ASSIGN_OR_RETURN(const ParameterPlacement* place, Placement(name));
  const int g = place->group;
  if (!layout_.groups[g].trainable) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient of '", name, "': the parameter is frozen and has none"));
  }
  if (!rules_.shards_gradients()) return ViewOf(*place, groups_[g].grads.data());
  if (groups_[g].grad_bucket.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient of '", name, "': its group ", g, " ('", layout_.groups[g].name,
                     "') has no gradient buffer; call AcquireGradients(", g, ") first"));
  }
  return ViewOf(*place, groups_[g].grad_bucket.data());
}

absl::StatusOr<DeviceBuffer> ShardedOptimizer::F32Workspace(absl::string_view name,
                                                             const View& view, size_t given) {
  if (given != static_cast<size_t>(view.numel) && device_.holds_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "': ", given,
                                                   " f32 values for ", view.numel, " elements"));
  }
  return device_.Allocate(view.numel * sizeof(float), MemoryCategory::kWorkspace,
                          absl::StrCat(name, ".f32"));
}

absl::Status ShardedOptimizer::ReadParameter(absl::string_view name, absl::Span<float> out) {
  MW_ASSIGN_OR_RETURN(const View view, Parameter(name));
  MW_ASSIGN_OR_RETURN(DeviceBuffer f32, F32Workspace(name, view, out.size()));
  MW_RETURN_IF_ERROR(
      kernels::Cast(device_, *stream_, view.data, view.dtype, f32.data(), DType::kF32, view.numel));
  MW_RETURN_IF_ERROR(device_.CopyAsync(out.data(), f32.data(), f32.size(), *stream_));
  return stream_->Synchronize();
}

absl::Status ShardedOptimizer::AddGradient(absl::string_view name, absl::Span<const float> grad) {
  MW_ASSIGN_OR_RETURN(const View view, Gradient(name));
  MW_ASSIGN_OR_RETURN(DeviceBuffer f32, F32Workspace(name, view, grad.size()));
  MW_RETURN_IF_ERROR(device_.CopyAsync(f32.data(), grad.data(), f32.size(), *stream_));
  MW_RETURN_IF_ERROR(kernels::Accumulate(device_, *stream_, f32.data(), DType::kF32, view.data,
                                         view.dtype, view.numel));
  return stream_->Synchronize();
}

absl::Status ShardedOptimizer::OrderAfterCaller() {
  MW_RETURN_IF_ERROR(stream_->Record(*caller_event_));
  return comm_stream_->Wait(*caller_event_);
}

absl::Status ShardedOptimizer::WaitForCommunication() {
  MW_RETURN_IF_ERROR(OrderAfterCaller());
  return comm_stream_->Synchronize();
}

absl::Status ShardedOptimizer::GatherParameters(int g) {
  MW_RETURN_IF_ERROR(CheckGroup(g, "GatherParameters"));
  if (!rules_.shards_parameters()) return absl::OkStatus();
  ScopedPhase phase(profiler_, absl::StrCat("gather ", layout_.groups[g].name));
  return gatherer_->Gather(g);
}

absl::Status ShardedOptimizer::ReleaseParameters(int g) {
  MW_RETURN_IF_ERROR(CheckGroup(g, "ReleaseParameters"));
  if (rules_.shards_parameters()) gatherer_->Release(g);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::AcquireGradients(int g) {
  MW_RETURN_IF_ERROR(CheckGroup(g, "AcquireGradients"));
  MW_RETURN_IF_ERROR(CheckTrainable(g, "AcquireGradients"));
  if (!rules_.shards_gradients()) return absl::OkStatus();
  Group& group = groups_[g];
  const FlatGroup& flat = layout_.groups[g];
  if (!group.grad_bucket.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("AcquireGradients: group ", g, " already has its gradient buffer"));
  }
  const DType dtype = config_.param_dtype();
  MW_ASSIGN_OR_RETURN(DeviceBuffer bucket,
                      device_.Allocate(flat.padded_numel * DTypeSize(dtype),
                                       MemoryCategory::kGradient,
                                       absl::StrCat(flat.name, ".grad_bucket"), *stream_));
  // Zeroed on the caller's stream, ahead of the backward that adds into it.
  MW_RETURN_IF_ERROR(
      kernels::Fill(device_, *stream_, bucket.data(), dtype, flat.padded_numel, 0.0f));
  group.grad_bucket = std::move(bucket);
  return absl::OkStatus();
}

bool ShardedOptimizer::HoldsGradients(int g) const {
  return g >= 0 && g < static_cast<int>(groups_.size()) && !groups_[g].grad_bucket.empty();
}

absl::Status ShardedOptimizer::ReduceGradients(int g) {
  MW_RETURN_IF_ERROR(CheckGroup(g, "ReduceGradients"));
  MW_RETURN_IF_ERROR(CheckTrainable(g, "ReduceGradients"));
  if (!rules_.shards_gradients()) return absl::OkStatus();
  Group& group = groups_[g];
  if (group.grad_bucket.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ReduceGradients: group ", g, " has no gradient buffer (call AcquireGradients first)"));
  }
  if (shard_group_ != nullptr && group.reductions == config_.gradient_accumulation_steps) {
    // The shard has been summed with its replicas: another micro-batch's
    // gradients would reach this rank's replicas only partly.
    return absl::FailedPreconditionError(absl::StrCat(
        "ReduceGradients: group ", g, " was reduced gradient_accumulation_steps (",
        config_.gradient_accumulation_steps,
        ") times this step already; with mics_shard_size call Step() first"));
  }
  ScopedPhase phase(profiler_, absl::StrCat("reduce ", layout_.groups[g].name));
  // The reduction reads what the caller's backward wrote.
  MW_RETURN_IF_ERROR(OrderAfterCaller());
  MW_RETURN_IF_ERROR(QueueReduction(g));
  // Freed now, while the reduction may still read it: the allocator keeps
  // its block from work not ordered after the reduction (so do the
  // reduction's temporaries, the communication stream's own).
  group.grad_bucket.RecordStream(*comm_stream_);
  group.grad_bucket.Reset();
  // A streamed reduction has run already (its gradients are on the host);
  // an overlapped one runs on while the caller goes on.
  return reducer_->Pace(
      /*in_flight=*/comm_stream_->asynchronous() && !streams_gradients(layout_.groups[g]));
}

absl::Status ShardedOptimizer::QueueReduction(int g) {
  Group& group = groups_[g];
  const FlatGroup& flat = layout_.groups[g];
  GradientReducer::Buffers buffers;
  MW_RETURN_IF_ERROR(reducer_->SizeBuffers(flat, buffers, streams_gradients(flat)));
  if (streams_gradients(flat)) {
    // No shard on the device: the reduction's output (in the reduction's
    // dtype) goes to the host and accumulates there, rounding as the
    // device's accumulating reduction would. Hybrid sharding: the last
    // reduction's pieces come with the earlier ones' sum, summed with the
    // replicas, and land as the whole.
    const bool first = group.reductions++ == 0;
    const bool last = group.reductions == config_.gradient_accumulation_steps;
    const bool replicate = last && shard_group_ != nullptr;
    GradientReducer::Earlier earlier;
    if (replicate && !first) {
      earlier = [&](int64_t begin, int64_t count) {
        return group.host->EarlierGradients(begin, count);
      };
    }
    MW_RETURN_IF_ERROR(reducer_->ReduceScatterPieces(
        flat, group.grad_bucket.data(), buffers,
        [&](int64_t begin, int64_t count, const void* reduced) {
          return group.host->AccumulateGradients(*comm_stream_, reduced, config_.reduce_dtype,
                                                 first || replicate, begin, count);
        },
        replicate, earlier, /*repeatable=*/true,
        [&](int64_t begin, int64_t count) { return group.host->SkipGradients(begin, count); }));
    return last && overlaps_update() ? Speculate(g) : absl::OkStatus();
  }
  const bool final = ++group.reductions == config_.gradient_accumulation_steps;
  MW_RETURN_IF_ERROR(reducer_->ReduceScatter(flat, group.grad_bucket.data(), group.grads.data(),
                                             /*accumulate=*/true, final, buffers));
  if (group.host != nullptr && final) {
    // Offload: the host part's gradients are final; they stream to host now.
    MW_RETURN_IF_ERROR(group.host->StageGradients(*comm_stream_, group.grads.data()));
    if (overlaps_update()) MW_RETURN_IF_ERROR(Speculate(g));
  }
  return absl::OkStatus();
}

void ShardedOptimizer::set_profiler(MemoryProfiler* profiler) {
  profiler_ = profiler;
  if (nvme_ == nullptr) return;
  if (profiler == nullptr) {
    nvme_->set_observer(nullptr);
    return;
  }
  nvme_->set_observer([profiler](const AioEngine::Timing& t) {
    profiler->RecordActivity(t.write ? "nvme write" : "nvme read", FormatBytes(t.bytes),
                             t.submitted, t.finished, t.bytes);
  });
}

absl::Status ShardedOptimizer::Speculate(int g) {
  Group& group = groups_[g];
  const FlatGroup& flat = layout_.groups[g];
  // As Step() would update it if nothing clips: the same scale, bit for bit.
  const double unscale =
      1.0 / (double(comm_.world_size()) * config_.gradient_accumulation_steps * scaler_.scale());
  std::vector<StateTier::Segment> segments;
  hyper_.SegmentsOf(g, update_begin(flat), group.host->numel(),
                    hyper_.StepRules(steps_applied_, static_cast<float>(unscale * 1.0)), segments);
  return overlapped_->Hand(g, *group.host, flat.name, std::move(segments), *comm_stream_,
                           profiler_);
}

void* ShardedOptimizer::UpdateGradients(const FlatGroup& flat, Group& group) {
  if (!device_.holds_bytes()) return nullptr;
  // Held in full where this rank updates only its shard (stage 1).
  if (rules_.shards_updates() && !rules_.shards_gradients()) {
    return ElementOffset(group.grads.data(), update_begin(flat), config_.param_dtype());
  }
  return group.grads.data();
}


void* ShardedOptimizer::ParamsAt(int g, int64_t i) {
  if (!device_.holds_bytes() || residence_->place(g) == ParamResidence::Place::kNvme) {
    return nullptr;
  }
  const FlatGroup& flat = layout_.groups[g];
  // The update range within what the rank holds (the shard itself at
  // stage 3).
  const int64_t at = update_begin(flat) - rules_.held_parameters_begin(flat, shards().rank()) + i;
  return static_cast<char*>(residence_->data(g)) + at * DTypeSize(config_.param_dtype());
}

absl::InlinedVector<ShardedOptimizer::Tier, 2> ShardedOptimizer::TiersOf(const FlatGroup& flat,
                                                                         Group& group) {
  absl::InlinedVector<Tier, 2> tiers;
  if (group.host != nullptr) tiers.push_back({group.host.get(), 0});
  if (group.device_state != nullptr) tiers.push_back({group.device_state.get(), host_numel(flat)});
  return tiers;
}

absl::Status ShardedOptimizer::ZeroGradients(const FlatGroup& flat, Group& group) {
  if (group.grads.empty()) return absl::OkStatus();  // streamed to host: nothing kept
  const int64_t n = rules_.held_gradients(flat);
  return kernels::Fill(device_, *comm_stream_, group.grads.data(), config_.param_dtype(), n, 0.0f);
}

}  // namespace memwall
