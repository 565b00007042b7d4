// memwall._memwall: the engine facade (engine/engine.h) for Python, and
// nothing else. The torch glue in memwall/torch.py drives it; every
// collective, update and allocation happens here, in the engine.
//
// Memory crosses the boundary without copies: parameter and gradient views
// are returned as DLPack capsules over the engine's own memory (host RAM on
// the host backend, device memory of the engine's GPU on cuda), which
// torch.from_dlpack wraps; the capsule owns nothing. A view is valid while
// the engine lives and, at stage 3 or for stage 2-3 gradients, until its
// group is released or reduced; the glue keeps those rules. On cuda the
// views are read and written in the order of the stream the engine was
// given (the `stream` argument: PyTorch's current stream's handle), which
// the engine's own streams order themselves against with events. Values
// going in come as the address of a contiguous buffer in host memory, as
// torch's data_ptr() gives it for a CPU tensor: initial parameters in the
// model's dtype (f32, bf16 or f16), states as f32 with their element count.
//
// Errors: an absl::Status becomes a memwall.Error (a RuntimeError) whose
// message is "<CODE>: <message>", so Python callers see the same text the
// command prints; its class is also the Python exception its code means
// (STYLE.md): kInvalidArgument memwall.InvalidArgumentError (a ValueError),
// kNotFound memwall.NotFoundError (a FileNotFoundError), kResourceExhausted
// memwall.OutOfMemoryError (a MemoryError); every other code memwall.Error
// itself (kDataLoss's message names the file).
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dlpack/dlpack.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_kernels.h"
#include "models/traced.h"
#include "planning/plan.h"
#include "profiler/report.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/memory.h"
#include "runtime/mpi_communicator.h"
#include "runtime/units.h"

namespace py = pybind11;

namespace memwall {
namespace {

// memwall.Error, raised for every failed engine call, and its subclasses
// by status code.
PyObject* error_type = nullptr;
PyObject* invalid_argument_type = nullptr;
PyObject* not_found_type = nullptr;
PyObject* out_of_memory_type = nullptr;
PyObject* deadline_exceeded_type = nullptr;

PyObject* ErrorTypeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return invalid_argument_type;
    case absl::StatusCode::kNotFound: return not_found_type;
    case absl::StatusCode::kResourceExhausted: return out_of_memory_type;
    case absl::StatusCode::kDeadlineExceeded: return deadline_exceeded_type;
    default: return error_type;
  }
}

[[noreturn]] void Raise(const absl::Status& status) {
  const std::string text =
      absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
  PyErr_SetString(ErrorTypeFor(status.code()), text.c_str());
  throw py::error_already_set();
}

// memwall.<name>, a subclass of memwall.Error and of `builtin`.
PyObject* ErrorSubclass(py::module_& m, const char* name, PyObject* builtin) {
  PyObject* bases = PyTuple_Pack(2, error_type, builtin);
  PyObject* type = PyErr_NewException(absl::StrCat("memwall.", name).c_str(), bases, nullptr);
  Py_DECREF(bases);
  m.attr(name) = py::handle(type);
  return type;
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Value(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(value).value();
}

// One parameter as the glue registers it.
struct ParameterArg {
  std::string name;
  std::vector<int64_t> shape;
  uintptr_t values = 0;  // address of NumElements(shape) values in host memory; 0: none (meta)
  std::string dtype = "f32";  // of the values: "f32", "bf16" or "f16" (widened exactly)
  bool trainable = true;
  int hyper_group = 0;
};

// A parameter's initial values as the engine keeps them, f32, read in
// `arg`'s own dtype (widened by the CPU cast kernel, exactly): the glue
// passes a bf16 or f16 model's memory as it is, rather than an f32 copy of
// every parameter beside the model.
std::vector<float> InitialValues(const ParameterArg& arg) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (arg.dtype != DTypeName(dtype)) continue;
    std::vector<float> out(static_cast<size_t>(NumElements(arg.shape)));
    kernels::cpu::Kernels().cast(reinterpret_cast<const void*>(arg.values), dtype, out.data(),
                                 DType::kF32, out.size());
    return out;
  }
  Raise(absl::InvalidArgumentError(absl::StrCat(
      "parameter '", arg.name, "': values dtype '", arg.dtype, "'; expected f32, bf16 or f16")));
}

py::str CategoryName(MemoryCategory category) {
  return py::str(std::string(MemoryCategoryName(category)));
}

// [(owner, category, bytes)].
py::list OwnerList(const std::vector<OwnerBytes>& owners) {
  py::list out;
  for (const OwnerBytes& o : owners) {
    out.append(py::make_tuple(o.owner, CategoryName(o.category), o.bytes));
  }
  return out;
}

// A DLPack capsule ("dltensor", the protocol torch.from_dlpack reads) of a
// 1-D view of `view` on `device`. It owns only its own description: the
// memory stays the engine's.
py::capsule DLPackOf(const ModelStates::View& view, Device& device) {
  struct Owned {
    DLManagedTensor managed;
    int64_t shape[1];
  };
  auto* owned = new Owned{};
  DLTensor& t = owned->managed.dl_tensor;
  t.data = view.data;
  t.device = device.backend() == Backend::kCuda
                 ? DLDevice{kDLCUDA, device.ordinal()}
                 : DLDevice{kDLCPU, 0};
  t.ndim = 1;
  switch (view.dtype) {
    case DType::kF32: t.dtype = DLDataType{kDLFloat, 32, 1}; break;
    case DType::kF16: t.dtype = DLDataType{kDLFloat, 16, 1}; break;
    case DType::kBF16: t.dtype = DLDataType{kDLBfloat, 16, 1}; break;
  }
  owned->shape[0] = view.numel;
  t.shape = owned->shape;
  t.strides = nullptr;  // compact
  t.byte_offset = 0;
  owned->managed.manager_ctx = owned;
  owned->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<Owned*>(self->manager_ctx);
  };
  // The capsule's destructor frees the description only when no consumer
  // took it (a consumer renames the capsule "used_dltensor" and calls the
  // deleter itself).
  PyObject* capsule = PyCapsule_New(&owned->managed, "dltensor", [](PyObject* self) {
    if (PyCapsule_IsValid(self, "dltensor")) {
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(self, "dltensor"));
      managed->deleter(managed);
    }
  });
  if (capsule == nullptr) {
    delete owned;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

// What the engine reads from a config that a torch front end needs before
// an engine exists: the accumulation, the micro-batch, the parameter dtype
// and the DeepSpeed settings not applied (errors: the engine's, naming the
// key).
py::dict ConfigValues(const std::string& config_json) {
  const Config c = Value(ParseConfig(config_json));
  py::dict d;
  d["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  d["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  d["not_applied"] = c.not_applied;
  d["param_dtype"] = std::string(DTypeName(c.param_dtype()));
  const RecomputeConfig& r = c.activation_checkpointing;
  d["recomputes"] = r.planner != "none" || r.number_checkpoints > 0;
  d["offloads_activations"] = r.offload;
  return d;
}

// Rank 0's `text` on every rank of the world: what one rank decided
// (a choice made from rates measured on it) taken by all. Collective; a
// rank waits at most `timeout` seconds (0: forever) for the others.
std::string ShareFromRank0(const std::string& text, double timeout) {
  const MpiPlace place = Value(MpiWorld());
  if (place.size == 1) return text;
  CommunicatorOptions options;
  options.timeout = timeout == 0 ? absl::InfiniteDuration() : absl::Seconds(timeout);
  const std::unique_ptr<MpiCommunicator> comm = Value(MpiCommunicator::Create(options));
  int64_t length = place.rank == 0 ? static_cast<int64_t>(text.size()) : 0;
  Check(comm->AllReduceHost(&length, 1, MPI_INT64_T, MPI_MAX, "the shared text's length"));
  if (length > INT_MAX) {
    Raise(absl::InvalidArgumentError(absl::StrCat("share_from_rank0: ", length,
                                                  " bytes exceed MPI's int count")));
  }
  // Every other rank contributes zeros: the maximum is rank 0's bytes.
  std::string shared(static_cast<size_t>(length), '\0');
  if (place.rank == 0) shared = text;
  Check(comm->AllReduceHost(shared.data(), static_cast<int>(length), MPI_UNSIGNED_CHAR, MPI_MAX,
                            "the shared text"));
  return shared;
}

// memwall plan for a traced model (models/traced.h): the report's JSON.
std::string PlanTraced(const std::string& description, const std::string& config_json,
                       int64_t gpus, const std::string& device_memory,
                       const std::string& host_memory, const std::string& nvme, int64_t batch,
                       bool auto_strategy, const std::string& hardware, bool vary_micro_batch) {
  PlanOptions options;
  auto model = std::make_shared<const TracedModel>(Value(ParseTracedModel(description, "<memory>")));
  options.model = model->model;
  DescribeTraced(*model, options);
  options.factory = TracedModelFactory(model);
  options.config_text = config_json;
  options.gpus = gpus;
  options.device_bytes = Value(ParseBytes(device_memory, "device_memory"));
  options.host_bytes = Value(ParseBytes(host_memory, "host_memory"));
  options.nvme_bytes = Value(ParseBytes(nvme, "nvme"));
  options.batch = batch;
  options.json = true;
  options.auto_strategy = auto_strategy;
  options.hardware = hardware;
  options.vary_micro_batch = vary_micro_batch;
  if (hardware == "this-machine") options.runtime_allowance = 0;
  return Value(PlanReport(options));
}

// The engine with the Python-facing calls.
// The profiler's peak: {"bytes", "phase", "phase_path", "by_category":
// {...}, "top_owners": [(owner, category, bytes)]}.
py::dict PeakOf(const MemoryProfiler& profiler) {
  const PeakSnapshot peak = profiler.peak();
  py::dict out, by_category;
  out["bytes"] = peak.bytes;
  out["phase"] = peak.phase;
  out["phase_path"] = peak.phase_path;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    by_category[CategoryName(static_cast<MemoryCategory>(c))] = peak.by_category[c];
  }
  out["by_category"] = by_category;
  out["top_owners"] = OwnerList(peak.top_owners);
  return out;
}

// memwall.Profiler: the memory profiler over a framework's own memory,
// declared record by record (memwall.torch.profile of a loop without a
// ZeroOptimizer). It reports as `memwall profile` does, naming `device`.
class PyProfiler {
 public:
  PyProfiler(const std::string& device, int64_t capacity_bytes) {
    if (capacity_bytes < 1) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("capacity_bytes: expected >= 1, got ", capacity_bytes)));
    }
    // A meta device: its allocator, which holds nothing, only carries the
    // capacity; every byte is a declared record.
    device_ = Value(CreateDevice({Backend::kMeta, 0, capacity_bytes}));
    profiler_ = std::make_unique<MemoryProfiler>(device_->allocator(), size_t{1} << 16, device);
  }

  // `bytes` (negative: released) of `category` ("parameter", "gradient",
  // ...) held by `owner`.
  void Record(const std::string& category, const std::string& owner, int64_t bytes) {
    for (MemoryCategory c : kAllMemoryCategories) {
      if (MemoryCategoryName(c) == category) return profiler_->RecordExternal(c, owner, bytes);
    }
    Raise(absl::InvalidArgumentError(absl::StrCat("category: expected a memory category name, "
                                                  "got '", category, "'")));
  }

  MemoryProfiler& profiler() { return *profiler_; }

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<MemoryProfiler> profiler_;
};

class PyEngine {
 public:
  PyEngine(const std::string& config_json,
           const std::vector<std::pair<std::string, std::vector<ParameterArg>>>& groups,
           const std::string& backend, const std::string& device_memory,
           const std::string& pinned_memory, int simulate_ranks, uint64_t seed,
           double collective_timeout, int device_ordinal, std::optional<uintptr_t> stream) {
    Config config = Value(ParseConfig(config_json));
    EngineOptions options;
    options.backend = Value(ParseBackend(backend));
    options.device_bytes = Value(ParseBytes(device_memory, "device_memory"));
    options.pinned_bytes = Value(ParseBytes(pinned_memory, "pinned_memory"));
    options.simulate_ranks = simulate_ranks;
    options.seed = seed;
    if (!(collective_timeout >= 0)) {
      Raise(absl::InvalidArgumentError(absl::StrCat(
          "collective_timeout: expected seconds >= 0 (0: wait forever), got ", collective_timeout)));
    }
    options.collective_timeout = collective_timeout == 0 ? absl::InfiniteDuration()
                                                         : absl::Seconds(collective_timeout);
    options.device_ordinal = device_ordinal;
    if (stream.has_value()) options.caller_stream = reinterpret_cast<void*>(*stream);
    options.oom_advice = false;  // the auto strategy needs memwall's own layers
    options.save_names = {"save_checkpoint", "load_checkpoint"};
    std::vector<ParameterGroup> parameter_groups;
    for (const auto& [name, parameters] : groups) {
      ParameterGroup group{name, {}};
      for (const ParameterArg& p : parameters) {
        ParameterInit init{p.name, p.shape, {}, p.trainable, p.hyper_group};
        if (p.values != 0) init.values = InitialValues(p);
        group.parameters.push_back(std::move(init));
      }
      parameter_groups.push_back(std::move(group));
    }
    engine_ = Value(Engine::Create(options, config, std::move(parameter_groups)));
  }

  Engine& engine() { return *engine_; }
  ModelStates& states() { return engine_->states(); }

  py::capsule Parameter(const std::string& name) {
    return DLPackOf(Value(states().Parameter(name)), engine_->device());
  }
  py::capsule Gradient(const std::string& name) {
    return DLPackOf(Value(states().Gradient(name)), engine_->device());
  }

  void AddGradient(const std::string& name, uintptr_t data, int64_t numel) {
    const auto* values = reinterpret_cast<const float*>(data);
    Check(states().AddGradient(name, absl::MakeConstSpan(values, numel)));
  }

  py::dict Step() {
    const StepResult r = Value(engine_->Step());
    py::dict out;
    out["applied"] = r.applied;
    out["grad_norm"] = r.grad_norm;
    out["loss_scale"] = r.loss_scale;
    return out;
  }

  void SetHyperparameters(int index, float lr, float beta1, float beta2, float eps,
                          float weight_decay, float momentum) {
    Check(states().SetHyperparameters(index, {lr, beta1, beta2, eps, weight_decay, momentum}));
  }

  // Collective: state `which` of group g, all its padded elements, as f32
  // bytes.
  py::bytes GatherState(int g, int which) {
    const std::vector<float> out = Value(states().GatherState(g, which));
    return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
  }

  void SetState(int g, int which, uintptr_t data, int64_t numel) {
    const auto* values = reinterpret_cast<const float*>(data);
    Check(states().SetState(g, which, absl::MakeConstSpan(values, numel)));
  }

  py::dict Progress() {
    const ModelStates::Progress p = states().progress();
    py::dict out;
    out["steps_applied"] = p.steps_applied;
    out["steps_skipped"] = p.steps_skipped;
    out["loss_scale"] = p.loss_scale;
    out["clean_steps"] = p.clean_steps;
    out["overflows_left"] = p.overflows_left;
    return out;
  }

  void SetProgress(const py::dict& d) {
    ModelStates::Progress p;
    p.steps_applied = d["steps_applied"].cast<int64_t>();
    p.steps_skipped = d["steps_skipped"].cast<int64_t>();
    p.loss_scale = d["loss_scale"].cast<float>();
    p.clean_steps = d["clean_steps"].cast<int>();
    p.overflows_left = d["overflows_left"].cast<int>();
    states().set_progress(p);
  }

  py::dict Peak() { return PeakOf(engine_->profiler()); }

  // Bytes by category: {"parameter": {"current": ..., "peak": ...}, ...},
  // from the device's allocator, and under "pinned" its pinned pool's.
  py::dict Memory() {
    py::dict out;
    auto add = [](py::dict& into, const AllocatorStats& stats) {
      for (int c = 0; c < kNumMemoryCategories; ++c) {
        const MemoryStat& s = stats.by_category[c];
        py::dict entry;
        entry["current"] = s.current;
        entry["peak"] = s.peak;
        into[CategoryName(static_cast<MemoryCategory>(c))] = entry;
      }
    };
    add(out, engine_->device().allocator().stats());
    if (CachingAllocator* pinned = engine_->device().pinned_allocator()) {
      py::dict host;
      add(host, pinned->stats());
      out["pinned"] = host;
    }
    return out;
  }

  py::list Groups() {
    py::list out;
    const FlatLayout& layout = states().layout();
    for (const FlatGroup& g : layout.groups) {
      py::dict d;
      d["name"] = g.name;
      d["trainable"] = g.trainable;
      d["numel"] = g.numel;
      d["padded_numel"] = g.padded_numel;
      py::list names, offsets;
      for (int p : g.parameters) {
        names.append(states().parameters()[p].name);
        offsets.append(layout.placements[p].offset);
      }
      d["parameters"] = names;
      d["offsets"] = offsets;
      out.append(d);
    }
    return out;
  }

 private:
  std::unique_ptr<Engine> engine_;
};

}  // namespace
}  // namespace memwall

PYBIND11_MODULE(_memwall, m) {
  using memwall::PyEngine;
  m.doc() = "memwall's engine facade (engine/engine.h); use memwall.torch";
  memwall::error_type = PyErr_NewException("memwall.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(memwall::error_type);
  memwall::invalid_argument_type =
      memwall::ErrorSubclass(m, "InvalidArgumentError", PyExc_ValueError);
  memwall::not_found_type = memwall::ErrorSubclass(m, "NotFoundError", PyExc_FileNotFoundError);
  memwall::out_of_memory_type =
      memwall::ErrorSubclass(m, "OutOfMemoryError", PyExc_MemoryError);
  memwall::deadline_exceeded_type =
      memwall::ErrorSubclass(m, "DeadlineExceededError", PyExc_TimeoutError);
  m.def("blas_description", &memwall::kernels::cpu::BlasDescription,
        "The OpenBLAS kernel set this process runs its GEMMs with, and how it was chosen.");
  m.def(
      "better_blas_core",
      [] {
        return memwall::kernels::cpu::BetterBlasCore(memwall::kernels::cpu::CpuFlags(),
                                                     memwall::kernels::cpu::BlasCore());
      },
      "The OpenBLAS core this CPU runs better than the generic one OpenBLAS fell back to; "
      "empty when OpenBLAS knows the CPU.");
  m.def(
      "choose_blas_core",
      []() -> py::dict {
        py::dict set;  // the variables the switch set, for os.environ
        if (memwall::kernels::cpu::ChooseBlasCoreInProcess().empty()) return set;
        for (const char* name : {"OPENBLAS_CORETYPE", "MEMWALL_BLAS_CORE_FROM"}) {
          set[name] = std::getenv(name);
        }
        return set;
      },
      "Where OpenBLAS fell back to a generic kernel on a CPU it does not know and the user "
      "did not set OPENBLAS_CORETYPE, switches this process to the better core in place; "
      "returns the environment variables that records (empty when nothing changed).");
  m.def("world_size", [] { return memwall::Value(memwall::MpiWorld()).size; },
        "The number of MPI ranks this process runs among (1 without mpirun); initialises "
        "MPI, no collective.");
  m.def("rank", [] { return memwall::Value(memwall::MpiWorld()).rank; },
        "This process's MPI rank (0 without mpirun); initialises MPI, no collective.");
  m.def("open_join_ports", [](int size) { return memwall::Value(memwall::OpenJoinPorts(size)); },
        py::arg("size"),
        "On rank 0 of a job started without mpirun (torchrun: each process an MPI singleton): "
        "size - 1 MPI port names, one per other rank, to hand to them for join_world. MPI must "
        "start with OMPI_MCA_pmix_server_uri naming an ompi-server all the processes reach.");
  m.def("join_world",
        [](int rank, int size, const std::vector<std::string>& ports) {
          absl::Status joined;
          {
            py::gil_scoped_release release;  // connect and accept wait for the other ranks
            joined = memwall::JoinWorld(rank, size, ports);
          }
          memwall::Check(joined);
        },
        py::arg("rank"), py::arg("size"), py::arg("ports"),
        "Collective over the `size` processes: joins them into one MPI world (ranks as "
        "given), which rank(), world_size() and every engine use from then on. The same "
        "ports on every rank (open_join_ports'); OMPI_MCA_pmix_server_uri as for it.");
  m.def("cuda_ordinal", [](int rank) { return memwall::Value(memwall::CudaOrdinalForRank(rank)); },
        py::arg("rank"),
        "The GPU the cuda backend gives rank `rank` (rank modulo the GPUs this process sees; "
        "runtime/device.h CudaOrdinalForRank); memwall.Error without a GPU.");
  m.def("abort_ranks", &memwall::AbortRanks, py::arg("code") = 1,
        "Ends every rank of a multi-rank MPI job (no-op on one rank).");
  m.def("config_values", &memwall::ConfigValues, py::arg("config"),
        "The values a config sets that a torch front end needs before an engine exists "
        "(gradient_accumulation_steps, train_micro_batch_size_per_gpu, param_dtype, "
        "not_applied: DeepSpeed settings memwall has no counterpart for, recomputes: "
        "whether activation_checkpointing asks for a plan other than none, "
        "offloads_activations: whether it may offload), as the engine parses them.");
  m.def("share_from_rank0", &memwall::ShareFromRank0, py::arg("text"), py::arg("timeout"),
        "Rank 0's text on every rank (collective; waits at most timeout seconds, 0: "
        "forever).");
  m.def("plan", &memwall::PlanTraced, py::arg("description"), py::arg("config"),
        py::arg("gpus"), py::arg("device_memory"), py::arg("host_memory"), py::arg("nvme"),
        py::arg("batch"), py::arg("auto_strategy"), py::arg("hardware"),
        py::arg("vary_micro_batch") = true,
        "memwall plan of a traced model's description (JSON text): the report's JSON text "
        "(memwall.plan/1, or memwall.plan-auto/1 with auto_strategy, which with "
        "vary_micro_batch false keeps the config's micro-batch and accumulation).");

  py::class_<memwall::ParameterArg>(m, "Parameter")
      .def(py::init([](std::string name, std::vector<int64_t> shape, uintptr_t values,
                       bool trainable, int hyper_group, std::string dtype) {
             return memwall::ParameterArg{std::move(name), std::move(shape), values,
                                          std::move(dtype), trainable, hyper_group};
           }),
           py::arg("name"), py::arg("shape"), py::arg("values") = 0, py::arg("trainable") = true,
           py::arg("hyper_group") = 0, py::arg("dtype") = "f32",
           "values: the address of the parameter's contiguous initial values in host memory "
           "(0: none, meta), in `dtype` (\"f32\", \"bf16\" or \"f16\"; the engine keeps "
           "them in f32, widened exactly).");

  py::class_<memwall::PyProfiler>(m, "Profiler",
                         "The memory profiler over a framework's own memory, declared record by "
                         "record: profile.txt/.json, trace.json and profile.html as `memwall "
                         "profile` writes them, naming `device`.")
      .def(py::init<const std::string&, int64_t>(), py::arg("device"), py::arg("capacity_bytes"))
      .def("record", &memwall::PyProfiler::Record, py::arg("category"), py::arg("owner"),
           py::arg("bytes"),
           "Declares `bytes` (negative: released) of `category` (a memory category's name) "
           "held by `owner`.")
      .def("begin_phase", [](memwall::PyProfiler& p, const std::string& name) { p.profiler().BeginPhase(name); })
      .def("end_phase", [](memwall::PyProfiler& p) { return p.profiler().EndPhase(); })
      .def("peak", [](memwall::PyProfiler& p) { return memwall::PeakOf(p.profiler()); })
      .def("current",
           [](memwall::PyProfiler& p) {
             const memwall::CategoryBytes current = p.profiler().current();
             py::dict out;
             for (int c = 0; c < memwall::kNumMemoryCategories; ++c) {
               out[memwall::CategoryName(static_cast<memwall::MemoryCategory>(c))] = current[c];
             }
             return out;
           },
           "The bytes held now by category.")
      .def("owners", [](memwall::PyProfiler& p) { return memwall::OwnerList(p.profiler().owners()); },
           "Live bytes per (owner, category, bytes), largest first.")
      .def("terminal_report",
           [](memwall::PyProfiler& p) { return memwall::TerminalReport(p.profiler()); })
      .def("write_reports", [](memwall::PyProfiler& p, const std::string& dir) {
        memwall::Check(memwall::WriteReports(p.profiler(), dir));
      });

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::string&,
                    const std::vector<std::pair<std::string, std::vector<memwall::ParameterArg>>>&,
                    const std::string&, const std::string&, const std::string&, int, uint64_t,
                    double, int, std::optional<uintptr_t>>(),
           py::arg("config_json"), py::arg("groups"), py::arg("backend") = "host",
           py::arg("device_memory") = "1GiB", py::arg("pinned_memory") = "0",
           py::arg("simulate_ranks") = 1, py::arg("seed") = 1,
           py::arg("collective_timeout") = 600.0, py::arg("device_ordinal") = -1,
           py::arg("stream") = py::none(),
           "device_ordinal: the GPU on cuda (-1: by rank); stream: on cuda, the handle of the "
           "stream the caller computes on (torch.cuda.current_stream().cuda_stream; 0 is the "
           "legacy default stream), whose order the views are read and written in; None: "
           "the engine's own.")
      .def_property_readonly("device", [](PyEngine& e) { return e.engine().device().name(); },
                             "The engine's device: \"host:0\", \"cuda:1\", ...")
      .def_property_readonly(
          "requested_peak",
          [](PyEngine& e) { return e.engine().device().allocator().stats().requested.peak; },
          "The most bytes the engine's device allocator held at once, all categories together "
          "(the peak of the sum, not memory()'s per-category peaks added up).")
      .def_property_readonly("rank", [](PyEngine& e) { return e.engine().communicator().rank(); })
      .def_property_readonly("world_size",
                             [](PyEngine& e) { return e.engine().communicator().world_size(); })
      .def_property_readonly("stage", [](PyEngine& e) { return e.engine().config().zero.stage; })
      .def_property_readonly(
          "overlaps_update",
          [](PyEngine& e) { return e.states().overlaps_update(); },
          "Whether the offloaded update runs during backward (offload_optimizer.overlap_step).")
      .def_property_readonly("param_dtype",
                             [](PyEngine& e) {
                               return std::string(memwall::DTypeName(e.states().param_dtype()));
                             })
      .def_property_readonly("loss_scale", [](PyEngine& e) { return e.states().loss_scale(); })
      .def_property_readonly("steps", [](PyEngine& e) { return e.engine().steps(); })
      .def_property_readonly("num_hyper_groups", [](PyEngine& e) { return e.states().num_hyper_groups(); })
      .def("groups", &PyEngine::Groups)
      .def("group_of", [](PyEngine& e, const std::string& name) { return memwall::Value(e.states().GroupOf(name)); })
      .def("parameter", &PyEngine::Parameter)
      .def("gradient", &PyEngine::Gradient)
      .def("add_gradient", &PyEngine::AddGradient)
      .def("gather", [](PyEngine& e, int g) { memwall::Check(e.states().Gather(g)); })
      .def("release", [](PyEngine& e, int g) { memwall::Check(e.states().Release(g)); })
      .def("acquire_gradients", [](PyEngine& e, int g) { memwall::Check(e.states().AcquireGradients(g)); })
      .def("reduce_gradients", [](PyEngine& e, int g) { memwall::Check(e.states().ReduceGradients(g)); })
      .def("step", &PyEngine::Step)
      .def(
          "communication",
          [](PyEngine& e) {
            const memwall::Communicator& comm = e.engine().communicator();
            py::dict collectives;
            for (int c = 0; c < memwall::kNumCollectives; ++c) {
              const auto kind = static_cast<memwall::Collective>(c);
              const memwall::CollectiveStats s = comm.stats(kind);
              py::dict d;
              d["calls"] = s.calls;
              d["bytes"] = s.bytes;
              d["intra_node_bytes"] = s.intra_node_bytes;
              d["inter_node_bytes"] = s.inter_node_bytes;
              collectives[py::str(std::string(memwall::CollectiveName(kind)))] = d;
            }
            const memwall::LinkBytes link = comm.total_link_bytes();
            py::dict out;
            out["nodes"] = comm.nodes();
            out["collectives"] = collectives;
            out["intra_node_bytes"] = link.intra_node;
            out["inter_node_bytes"] = link.inter_node;
            out["arrived_last"] = comm.arrivals().last;
            out["wait_caused_s"] = comm.arrivals().cost;
            return out;
          },
          "This rank's collectives so far (runtime/communicator.h): per collective calls, "
          "logical bytes and link bytes inside and across nodes (the whole job's), their sums, "
          "the nodes, and per rank the collectives it arrived last to and the seconds the others "
          "waited for it then.")
      .def("abort_step", [](PyEngine& e) { memwall::Check(e.states().AbortStep()); })
      .def("redone_updates", [](PyEngine& e) { return e.states().redone_updates(); })
      .def("set_hyperparameters", &PyEngine::SetHyperparameters)
      .def("learning_rate",
           [](PyEngine& e, int index) { return memwall::Value(e.states().LearningRate(index)); },
           "The rate group `index` trains with at the next step (the config's scheduler "
           "applied to its lr).")
      .def("master_weights",
           [](PyEngine& e, const std::string& name) {
             return memwall::Value(e.states().MasterWeights(name));
           })
      .def("memory", &PyEngine::Memory)
      .def("begin_phase", [](PyEngine& e, const std::string& name) { e.engine().profiler().BeginPhase(name); })
      .def("end_phase", [](PyEngine& e) { return e.engine().profiler().EndPhase(); })
      .def("record_activation",
           [](PyEngine& e, const std::string& owner, int64_t bytes) {
             e.engine().profiler().RecordExternal(memwall::MemoryCategory::kActivation, owner, bytes);
           },
           "Declares `bytes` (negative: released) of activations held outside the allocator.")
      .def("peak", &PyEngine::Peak)
      .def("owners",
           [](PyEngine& e) { return memwall::OwnerList(e.engine().profiler().owners()); },
           "The profiler's live bytes per (owner, category, bytes), largest first.")
      .def("write_reports",
           [](PyEngine& e, const std::string& dir) {
             memwall::Check(memwall::WriteReports(e.engine().profiler(), dir));
           })
      .def_property_readonly("num_states", [](PyEngine& e) { return e.states().num_states(); })
      .def_property_readonly("state_names",
                             [](PyEngine& e) { return e.states().state_names(); })
      .def("gather_state", &PyEngine::GatherState)
      .def("set_state", &PyEngine::SetState)
      .def("progress", &PyEngine::Progress)
      .def("set_progress", &PyEngine::SetProgress)
      .def("save_checkpoint",
           [](PyEngine& e, const std::string& dir, int keep) {
             return memwall::Value(e.engine().SaveCheckpoint(dir, keep));
           })
      .def("load_checkpoint", [](PyEngine& e, const std::string& path) {
        const memwall::LoadedCheckpoint loaded = memwall::Value(e.engine().LoadCheckpoint(path));
        py::dict out;
        out["path"] = loaded.path;
        out["steps"] = loaded.steps;
        out["skipped"] = loaded.skipped;
        return out;
      });
}
