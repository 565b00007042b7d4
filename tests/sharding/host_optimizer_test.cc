// The host side of optimizer offload: a slice in the pinned pool updates
// exactly as the device update would (bitwise, f32 and bf16, Adam and SGD),
// its bytes are counted in the pinned pool, and a full or missing pool is
// reported by name with nothing left allocated.
#include "sharding/host_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "kernels/ops.h"
#include "runtime/tensor.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr int64_t kN = 1000;

std::vector<float> Values(uint32_t seed, float scale) {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = scale * std::sin(0.37f * i + seed);
  return v;
}

struct Setup {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
};

Setup MakeHost(int64_t pinned) {
  DeviceOptions o{Backend::kHost, 0, 64 * kMiB};
  o.pinned_capacity_bytes = pinned;
  Setup s;
  s.device = CreateDevice(o).value();
  s.stream = s.device->CreateStream().value();
  return s;
}

TEST_CASE("a host slice updates bit for bit like the device update", "[offload]") {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool adam : {true, false}) {
      INFO(DTypeName(dtype) << (adam ? ", adam" : ", sgd with momentum"));
      Setup s = MakeHost(16 * kMiB);
      Device& d = *s.device;
      kernels::AdamParams ap;
      ap.lr = 1e-2f;
      ap.weight_decay = 0.01f;
      ap.adamw = true;
      kernels::SgdParams sp;
      sp.lr = 0.05f;
      sp.momentum = 0.9f;
      // The device path: master, moments, low-precision parameters on the device.
      auto master = Tensor::FromHost(d, Values(1, 0.5f), {kN}, MemoryCategory::kOptimizerState, "m").value();
      auto m = Tensor::FromHost(d, std::vector<float>(kN), {kN}, MemoryCategory::kOptimizerState, "a").value();
      auto v = Tensor::FromHost(d, std::vector<float>(kN), {kN}, MemoryCategory::kOptimizerState, "b").value();
      auto slice = HostOptimizerSlice::Create(d, adam ? HostOptimizerSlice::Rule::kAdam
                                                      : HostOptimizerSlice::Rule::kSgd,
                                              true, dtype, kN, "g0")
                       .value();
      REQUIRE(slice->WriteState(0, 0, kN, Values(1, 0.5f).data()).ok());
      auto device_params = Tensor::Empty(d, dtype, {kN}, MemoryCategory::kParameter, "p").value();
      auto host_params = Tensor::Empty(d, dtype, {kN}, MemoryCategory::kParameter, "q").value();
      for (int step = 1; step <= 3; ++step) {
        // The same gradients in the parameter dtype, on the device.
        auto g32 = Tensor::FromHost(d, Values(10 + step, 0.1f), {kN}, MemoryCategory::kGradient, "g").value();
        auto g = Tensor::Empty(d, dtype, {kN}, MemoryCategory::kGradient, "g").value();
        REQUIRE(kernels::Cast(d, *s.stream, g32.data(), DType::kF32, g.data(), dtype, kN).ok());
        auto wide = Tensor::Empty(d, DType::kF32, {kN}, MemoryCategory::kWorkspace, "w").value();
        REQUIRE(kernels::Cast(d, *s.stream, g.data(), dtype, wide.data(), DType::kF32, kN).ok());
        ap.step = step;
        void* low = dtype == DType::kF32 ? nullptr : device_params.data();
        if (adam) {
          REQUIRE(kernels::AdamUpdate(d, *s.stream, ap, master.data_as<float>(), wide.data(),
                                      DType::kF32, m.data_as<float>(), v.data_as<float>(), low,
                                      dtype, kN)
                      .ok());
        } else {
          REQUIRE(kernels::SgdUpdate(d, *s.stream, sp, master.data_as<float>(), wide.data(),
                                     DType::kF32, m.data_as<float>(), low, dtype, kN)
                      .ok());
        }
        REQUIRE(slice->StageGradients(*s.stream, g.data()).ok());
        DeviceBuffer scratch =
            d.AllocatePinned(slice->scratch_bytes(), MemoryCategory::kWorkspace, "scratch").value();
        const StateTier::Segment all{0, kN, ap, sp};
        StateTier::UpdateArgs args;
        args.segments = absl::MakeConstSpan(&all, 1);
        args.scratch = scratch.data();
        REQUIRE(slice->Update(*s.stream, args).ok());
        REQUIRE(slice->Commit(*s.stream, host_params.data()).ok());
      }
      std::vector<float> host_master(kN);
      REQUIRE(slice->ReadState(0, 0, kN, host_master.data()).ok());
      CHECK(std::memcmp(host_master.data(), master.data(), kN * 4) == 0);
      if (dtype != DType::kF32) {
        CHECK(std::memcmp(host_params.data(), device_params.data(), kN * 2) == 0);
      } else {
        CHECK(std::memcmp(host_params.data(), master.data(), kN * 4) == 0);
      }
      // Master, two moments (or master and momentum) and the gradients'
      // landing buffer in the pinned pool; the caller's scratch holds the
      // refreshed parameters only (the update reads 16-bit gradients where
      // they landed, with no f32 copy).
      const AllocatorStats pinned = d.pinned_allocator()->stats();
      const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
      CHECK(pinned.by_category[static_cast<int>(MemoryCategory::kOptimizerState)].current ==
            (adam ? 3 : 2) * kN * 4);
      CHECK(pinned.by_category[static_cast<int>(MemoryCategory::kGradient)].current == kN * size);
      CHECK(pinned.by_category[static_cast<int>(MemoryCategory::kWorkspace)].current == 0);
      CHECK(slice->scratch_bytes() == kN * size);
      // A second update without new gradients is refused.
      const StateTier::Segment all{0, kN, ap, sp};
      StateTier::UpdateArgs args;
      args.segments = absl::MakeConstSpan(&all, 1);
      const absl::Status again = slice->Update(*s.stream, args);
      CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
      CHECK(again.message() == "offloaded optimizer states of 'g0': no gradients staged");
    }
  }
}

TEST_CASE("a missing or full pinned pool is named, and nothing stays allocated", "[offload][errors]") {
  Setup none = MakeHost(0);
  const absl::Status missing =
      HostOptimizerSlice::Create(*none.device, HostOptimizerSlice::Rule::kAdam, true, DType::kBF16, kN, "g0")
          .status();
  CHECK(missing.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(missing.message() ==
        "offloaded optimizer states of 'g0': host:0 has no pinned pool "
        "(DeviceOptions::pinned_capacity_bytes)");
  // Below the pool's first 2 MiB segment: the first allocation (the
  // gradients' landing buffer) fails.
  Setup small = MakeHost(2 * kN * 4 + 1024);
  const absl::Status full =
      HostOptimizerSlice::Create(*small.device, HostOptimizerSlice::Rule::kAdam, true, DType::kBF16, kN, "g0")
          .status();
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(full.message()), Catch::Contains("host:0:pinned"));
  CHECK_THAT(std::string(full.message()),
             Catch::StartsWith("out of memory on host:0:pinned: cannot allocate 1.95 KiB (2000 "
                               "bytes) of gradient for 'g0.grad_host'"));
  CHECK(small.device->pinned_allocator()->stats().requested.current == 0);
}

TEST_CASE("gradients accumulate into the landing buffer piece by piece", "[offload]") {
  Setup s = MakeHost(16 * kMiB);
  auto slice = HostOptimizerSlice::Create(*s.device, HostOptimizerSlice::Rule::kAdam, true,
                                          DType::kBF16, kN, "g0")
                   .value();
  // Two micro-batches of f32 reductions in pieces of 300 (the last 100):
  // element i gets bf16(bf16(a_i) + b_i), the device's accumulating rounding.
  const std::vector<float> a = Values(1, 0.5f), b = Values(2, 0.25f);
  for (int micro = 0; micro < 2; ++micro) {
    const std::vector<float>& v = micro == 0 ? a : b;
    for (int64_t begin = 0; begin < kN; begin += 300) {
      const int64_t count = std::min<int64_t>(300, kN - begin);
      REQUIRE(slice->AccumulateGradients(*s.stream, v.data() + begin, DType::kF32, micro == 0,
                                         begin, count)
                  .ok());
    }
  }
  const uint16_t* landing = static_cast<const uint16_t*>(slice->gradients());
  for (int64_t i = 0; i < kN; ++i) {
    INFO("element " << i);
    REQUIRE(landing[i] == F32ToBf16(Bf16ToF32(F32ToBf16(a[i])) + b[i]));
  }
  const absl::Status outside = slice->AccumulateGradients(*s.stream, a.data(), DType::kF32, false,
                                                          900, 101);
  CHECK(outside.code() == absl::StatusCode::kOutOfRange);
  CHECK(outside.message() == "gradients of 'g0': elements [900, 1001) of 1000");
  CHECK(landing[950] == F32ToBf16(Bf16ToF32(F32ToBf16(a[950])) + b[950]));  // untouched
}

}  // namespace
}  // namespace memwall

namespace memwall {
namespace {

// A slice's initial master weights, and step `step`'s gradients (f32).
std::vector<float> InitialMaster(int64_t numel) {
  std::vector<float> initial(numel);
  for (int64_t i = 0; i < numel; ++i) initial[i] = 0.5f * std::sin(0.37f * i + 1);
  return initial;
}
std::vector<float> StepGradients(int64_t numel, int step) {
  std::vector<float> g(numel);
  for (int64_t i = 0; i < numel; ++i) g[i] = 0.1f * std::cos(0.11f * i + step);
  return g;
}

// Step `step`'s hyperparameters: two segments, the second with weight
// decay, split mid-chunk.
std::vector<StateTier::Segment> StepSegments(int64_t numel, int step) {
  kernels::AdamParams ap;
  ap.lr = 1e-2f;
  ap.adamw = true;
  ap.step = step;
  kernels::SgdParams sp;
  sp.lr = 0.05f;
  sp.momentum = 0.9f;
  kernels::AdamParams decayed = ap;
  decayed.weight_decay = 0.1f;
  const int64_t split = numel / 3;
  return {{0, split, ap, sp}, {split, numel - split, decayed, sp}};
}

// A slice's state and refreshed parameters after `steps` updates of
// `numel` elements (two hyperparameter segments), pinned or on NVMe.
struct Ended {
  std::vector<float> master, first, second;
  std::vector<char> params;
  int64_t workspace_peak = 0;  // pinned workspace: the scratch and the NVMe buffers
  int64_t gradient_pinned = 0;  // the peak of pinned gradient bytes
};

Ended RunSlice(DType dtype, bool adam, int64_t numel, const HostOptimizerSlice::Options& options,
               int steps = 3) {
  Setup s = MakeHost(64 * kMiB);
  Device& d = *s.device;
  auto slice = HostOptimizerSlice::Create(d, adam ? StateTier::Rule::kAdam : StateTier::Rule::kSgd,
                                          true, dtype, numel, "g0", options)
                   .value();
  const std::vector<float> initial = InitialMaster(numel);
  REQUIRE(slice->WriteState(0, 0, numel, initial.data()).ok());
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  auto params = Tensor::Empty(d, dtype, {numel}, MemoryCategory::kParameter, "p").value();
  Ended out;
  for (int step = 1; step <= steps; ++step) {
    const std::vector<float> g32 = StepGradients(numel, step);
    auto wide = Tensor::FromHost(d, g32, {numel}, MemoryCategory::kGradient, "g").value();
    auto g = Tensor::Empty(d, dtype, {numel}, MemoryCategory::kGradient, "g").value();
    REQUIRE(kernels::Cast(d, *s.stream, wide.data(), DType::kF32, g.data(), dtype, numel).ok());
    DeviceBuffer grad_buffer;
    if (options.gradients_on_nvme) {
      // As a streamed reduction: pieces of 700, added to nothing (the
      // step's first micro-batch), so the same values as staged whole.
      for (int64_t begin = 0; begin < numel; begin += 700) {
        const int64_t count = std::min<int64_t>(700, numel - begin);
        REQUIRE(slice
                    ->AccumulateGradients(*s.stream, static_cast<char*>(g.data()) + begin * size,
                                          dtype, true, begin, count)
                    .ok());
      }
      grad_buffer =
          d.AllocatePinned(slice->grad_buffer_bytes(), MemoryCategory::kWorkspace, "grad_buffer")
              .value();
    } else {
      REQUIRE(slice->StageGradients(*s.stream, g.data()).ok());
    }
    DeviceBuffer scratch =
        d.AllocatePinned(slice->scratch_bytes(), MemoryCategory::kWorkspace, "scratch").value();
    const std::vector<StateTier::Segment> segments = StepSegments(numel, step);
    StateTier::UpdateArgs args;
    args.segments = segments;
    args.scratch = scratch.data();
    args.grad_buffer = NvmeStore::AlignUp(grad_buffer.data());
    REQUIRE(slice->Update(*s.stream, args).ok());
    REQUIRE(slice->Commit(*s.stream, params.data()).ok());
  }
  for (int k = 0; k < slice->num_states(); ++k) {
    std::vector<float>& state = k == 0 ? out.master : (k == 1 ? out.first : out.second);
    state.resize(numel);
    REQUIRE(slice->ReadState(k, 0, numel, state.data()).ok());
  }
  out.params.assign(static_cast<char*>(params.data()),
                    static_cast<char*>(params.data()) + numel * size);
  out.workspace_peak =
      d.pinned_allocator()->stats().by_category[static_cast<int>(MemoryCategory::kWorkspace)].peak;
  out.gradient_pinned =
      d.pinned_allocator()->stats().by_category[static_cast<int>(MemoryCategory::kGradient)].peak;
  return out;
}

// Bit for bit the same states and parameters.
void CheckSameEnd(const Ended& got, const Ended& want) {
  CHECK(got.master == want.master);
  CHECK(got.first == want.first);
  CHECK(got.second == want.second);
  CHECK(got.params == want.params);
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

TEST_CASE("the NVMe tier streams its state through bounded buffers, bit for bit the pinned tier",
          "[offload][nvme]") {
  // 5000 elements: with 12 KiB buffers (1024 elements of Adam state) five
  // chunks, the last one partial.
  const int64_t numel = 5000;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool adam : {true, false}) {
      const Ended pinned = RunSlice(dtype, adam, numel, HostOptimizerSlice::Options());
      for (int count : {1, 2, 3, 4, 8}) {
        INFO(DTypeName(dtype) << (adam ? ", adam" : ", sgd") << ", " << count << " buffers");
        auto store = NvmeStore::Open(TempDir(), "chunks.bin").value();
        HostOptimizerSlice::Options options;
        options.store = store.get();
        options.nvme_buffer_bytes = 12288;
        options.nvme_buffer_count = count;
        const Ended nvme = RunSlice(dtype, adam, numel, options);
        CheckSameEnd(nvme, pinned);
        // The slot: five chunks, each state's elements contiguous in it.
        const int states = adam ? 3 : 2;
        CHECK(store->slot_bytes(0) ==
              4 * states * 1024 * 4 + (states * 904 * 4 + 4095) / 4096 * 4096);
        // Pinned memory: the caller's scratch (the refreshed parameters) and
        // at most `count` chunk buffers (plus alignment), whatever the
        // slice's size.
        const int64_t scratch = numel * static_cast<int64_t>(DTypeSize(dtype));
        CHECK(nvme.workspace_peak ==
              scratch + std::min(count, 5) * states * 1024 * 4 + NvmeStore::kAlignment);
        // The gradients in the file too (a scratch slot after the state's):
        // the same update, and no gradient bytes pinned at rest.
        if (count != 1 && count != 3) continue;
        auto with_grads = NvmeStore::Open(TempDir(), "grads.bin").value();
        options.store = with_grads.get();
        options.gradients_on_nvme = true;
        const Ended streamed = RunSlice(dtype, adam, numel, options);
        CheckSameEnd(streamed, pinned);
        CHECK(streamed.gradient_pinned == 0);
        CHECK(with_grads->size() ==
              2 * store->slot_bytes(0) +
                  (numel * static_cast<int64_t>(DTypeSize(dtype)) + 4095) / 4096 * 4096);
        // Each step wrote the gradients once and read them once.
        CHECK(with_grads->bytes_written() - store->bytes_written() ==
              3 * ((numel * static_cast<int64_t>(DTypeSize(dtype)) + 4095) / 4096 * 4096));
      }
    }
  }
}

TEST_CASE("slices sharing one chunk stream update as each alone, with one sync per step",
          "[offload][nvme][stream]") {
  // Two slices of one file, 5 and 3 chunks of 1024 elements (the last ones
  // partial), through 3 buffers: the reads run ahead from the first slice
  // into the second.
  const int64_t sizes[] = {5000, 2100};
  Setup s = MakeHost(64 * kMiB);
  Device& d = *s.device;
  auto store = NvmeStore::Open(TempDir(), "shared.bin").value();
  HostOptimizerSlice::Options options;
  options.store = store.get();
  options.nvme_buffer_bytes = 12288;
  options.nvme_buffer_count = 3;
  std::vector<std::unique_ptr<HostOptimizerSlice>> slices;
  std::vector<Tensor> params;
  for (int k = 0; k < 2; ++k) {
    slices.push_back(HostOptimizerSlice::Create(d, StateTier::Rule::kAdam, true, DType::kBF16,
                                                sizes[k], k == 0 ? "a" : "b", options)
                         .value());
    const std::vector<float> initial = InitialMaster(sizes[k]);
    REQUIRE(slices[k]->WriteState(0, 0, sizes[k], initial.data()).ok());
    params.push_back(
        Tensor::Empty(d, DType::kBF16, {sizes[k]}, MemoryCategory::kParameter, "p").value());
  }
  CHECK(slices[0]->nvme_buffer_count() == 3);
  CHECK(slices[1]->nvme_buffer_count() == 3);
  CHECK(slices[0]->nvme_buffer_stride() == 12288);
  DeviceBuffer buffers =
      d.AllocatePinned(3 * 12288 + NvmeStore::kAlignment, MemoryCategory::kWorkspace, "buffers")
          .value();
  for (int step = 1; step <= 2; ++step) {
    INFO("step " << step);
    std::vector<DeviceBuffer> scratch;
    std::vector<std::vector<StateTier::Segment>> segments;
    for (int k = 0; k < 2; ++k) {
      auto wide = Tensor::FromHost(d, StepGradients(sizes[k], step), {sizes[k]},
                                   MemoryCategory::kGradient, "g")
                      .value();
      auto g = Tensor::Empty(d, DType::kBF16, {sizes[k]}, MemoryCategory::kGradient, "g").value();
      REQUIRE(
          kernels::Cast(d, *s.stream, wide.data(), DType::kF32, g.data(), DType::kBF16, sizes[k])
              .ok());
      REQUIRE(slices[k]->StageGradients(*s.stream, g.data()).ok());
      REQUIRE(s.stream->Synchronize().ok());
      scratch.push_back(
          d.AllocatePinned(slices[k]->scratch_bytes(), MemoryCategory::kWorkspace, "scratch")
              .value());
      segments.push_back(StepSegments(sizes[k], step));
    }
    if (step == 1) {
      // A stream with only the second slice queued: the first's update
      // refuses it, and nothing changes.
      NvmeChunkStream wrong(*store, NvmeStore::AlignUp(buffers.data()), 3, 12288);
      slices[1]->QueueChunks(wrong);
      StateTier::UpdateArgs args;
      args.segments = segments[0];
      args.scratch = scratch[0].data();
      args.nvme_stream = &wrong;
      const absl::Status refused = slices[0]->Update(*s.stream, args);
      CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
      CHECK(refused.message() ==
            "offloaded optimizer states of 'a': chunk 0 of 5 is not next in the NVMe chunk "
            "stream");
    }
    const int64_t syncs = store->syncs(), read = store->bytes_read();
    NvmeChunkStream stream(*store, NvmeStore::AlignUp(buffers.data()), 3, 12288);
    for (int k = 0; k < 2; ++k) slices[k]->QueueChunks(stream);
    for (int k = 0; k < 2; ++k) {
      StateTier::UpdateArgs args;
      args.segments = segments[k];
      args.scratch = scratch[k].data();
      args.nvme_stream = &stream;
      REQUIRE(slices[k]->Update(*s.stream, args).ok());
      if (k == 0) {
        // The first slice's 5 chunks and, read ahead, the second's first.
        CHECK(store->bytes_read() - read == 6 * 12288);
      }
    }
    // The writes are not synced yet: nothing to commit.
    const absl::Status early = slices[0]->Commit(*s.stream, params[0].data());
    CHECK(early.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(early.message() ==
          "NVMe store " + store->path() + ": slot 0 has no written copy to commit");
    REQUIRE(stream.Finish().ok());
    CHECK(store->syncs() - syncs == 1);
    for (int k = 0; k < 2; ++k) REQUIRE(slices[k]->Commit(*s.stream, params[k].data()).ok());
  }
  // Each slice updated alone for two steps: the same state and
  // parameters, bit for bit.
  for (int k = 0; k < 2; ++k) {
    INFO("slice " << k);
    Ended got;
    for (int j = 0; j < 3; ++j) {
      std::vector<float>& state = j == 0 ? got.master : (j == 1 ? got.first : got.second);
      state.resize(sizes[k]);
      REQUIRE(slices[k]->ReadState(j, 0, sizes[k], state.data()).ok());
    }
    got.params.assign(static_cast<char*>(params[k].data()),
                      static_cast<char*>(params[k].data()) + sizes[k] * 2);
    CheckSameEnd(got, RunSlice(DType::kBF16, true, sizes[k], HostOptimizerSlice::Options(), 2));
  }
}

}  // namespace
}  // namespace memwall
