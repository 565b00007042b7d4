// The cuda backend and the CUDA kernel twins, checked against the CPU
// kernels bit for bit (same element math, same rounding). Needs a GPU: the
// binary reports its cases as skipped without one (tools/gpu_check.sh runs
// it on a GPU machine).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "catch2/catch.hpp"
#include "cuda_runtime.h"
#include "tests/support/values.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "runtime/units.h"

namespace memwall {
namespace {

using testing::RandomFloats;

struct Gpu {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
};

Gpu MakeGpu(int64_t capacity = 0) {
  auto device = CreateDevice({Backend::kCuda, 0, capacity});
  REQUIRE(device.ok());
  auto stream = (*device)->CreateStream();
  REQUIRE(stream.ok());
  return {std::move(device).value(), std::move(stream).value()};
}

// Host -> device buffer of the same bytes.
DeviceBuffer Upload(Gpu& gpu, const void* data, size_t bytes, const char* owner) {
  auto buffer = gpu.device->Allocate(bytes, MemoryCategory::kOther, owner);
  REQUIRE(buffer.ok());
  REQUIRE(gpu.device->CopyAsync(buffer->data(), data, bytes, *gpu.stream).ok());
  return std::move(buffer).value();
}

// Bit for bit, except a NaN's payload: a GPU's arithmetic returns its
// canonical NaN (0x7fffffff) where x86 passes the input's on (seen on an
// H200: NaN + x stored as bf16 0x7fff against 0x7fc0). Either way it is a
// NaN, which a step's overflow check skips on. `wide` reads an element as
// f32.
template <typename T, typename Wide>
void CheckSameBits(const std::vector<T>& got, const std::vector<T>& want, Wide wide) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    const bool nan = std::isnan(wide(want[i]));
    CHECK(std::isnan(wide(got[i])) == nan);
    if (!nan) CHECK(std::memcmp(&got[i], &want[i], sizeof(T)) == 0);
  }
}

template <typename T>
std::vector<T> Download(Gpu& gpu, const DeviceBuffer& buffer, size_t n) {
  std::vector<T> out(n);
  REQUIRE(gpu.device->CopyAsync(out.data(), buffer.data(), n * sizeof(T), *gpu.stream).ok());
  REQUIRE(gpu.stream->Synchronize().ok());
  return out;
}

TEST_CASE("cuda devices allocate through the caching allocator within capacity", "[cuda]") {
  Gpu gpu = MakeGpu(64 * kMiB);
  CHECK(gpu.device->name() == "cuda:0");
  auto a = gpu.device->Allocate(3 * kMiB, MemoryCategory::kParameter, "w");
  REQUIRE(a.ok());
  CHECK(a->data() != nullptr);
  CHECK(gpu.device->allocator().stats().reserved.current == 4 * kMiB);
  auto too_much = gpu.device->Allocate(100 * kMiB, MemoryCategory::kActivation, "act");
  CHECK(too_much.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_much.status().message()),
             Catch::Contains("out of memory on cuda:0: cannot allocate 100.00 MiB"));
}

TEST_CASE("cuda capacity larger than the free memory is rejected", "[cuda]") {
  auto device = CreateDevice({Backend::kCuda, 0, int64_t{1} << 50});
  CHECK(device.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(device.status().message()), Catch::Contains("device capacity: cuda:0 has"));
}

TEST_CASE("streams, events and copies order work on the GPU", "[cuda]") {
  Gpu gpu = MakeGpu();
  auto other = gpu.device->CreateStream().value();
  auto event = gpu.device->CreateEvent().value();
  const size_t n = 1 << 20;
  std::vector<float> host = RandomFloats(n, 1, 1.0f);
  DeviceBuffer a = Upload(gpu, host.data(), n * 4, "a");
  auto b = gpu.device->Allocate(n * 4, MemoryCategory::kOther, "b").value();
  REQUIRE(gpu.stream->Record(*event).ok());
  REQUIRE(other->Wait(*event).ok());
  REQUIRE(gpu.device->CopyAsync(b.data(), a.data(), n * 4, *other).ok());
  REQUIRE(other->Synchronize().ok());
  CHECK(event->Query().value());
  std::vector<float> back(n);
  REQUIRE(gpu.device->CopyAsync(back.data(), b.data(), n * 4, *other).ok());
  REQUIRE(other->Synchronize().ok());
  CHECK(std::memcmp(back.data(), host.data(), n * 4) == 0);
}

TEST_CASE("a wrapped caller stream orders work with events and outlives its wrapper",
          "[cuda][stream]") {
  Gpu gpu = MakeGpu();
  CHECK(gpu.device->ordinal() == 0);
  cudaStream_t native = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 1 << 20;
  std::vector<float> host = RandomFloats(n, 2, 1.0f);
  DeviceBuffer a = Upload(gpu, host.data(), n * 4, "a");
  auto b = gpu.device->Allocate(n * 4, MemoryCategory::kOther, "b").value();
  auto event = gpu.device->CreateEvent().value();
  {
    auto caller = gpu.device->WrapStream(native).value();
    CHECK(caller->native_handle() == native);
    // The copy on the caller's stream waits for the work on memwall's.
    REQUIRE(gpu.stream->Record(*event).ok());
    REQUIRE(caller->Wait(*event).ok());
    REQUIRE(gpu.device->CopyAsync(b.data(), a.data(), n * 4, *caller).ok());
  }  // drained, not destroyed
  CHECK(cudaStreamQuery(native) == cudaSuccess);
  std::vector<float> back(n);
  REQUIRE(cudaMemcpyAsync(back.data(), b.data(), n * 4, cudaMemcpyDeviceToHost, native) ==
          cudaSuccess);
  REQUIRE(cudaStreamSynchronize(native) == cudaSuccess);
  CHECK(std::memcmp(back.data(), host.data(), n * 4) == 0);
  REQUIRE(cudaStreamDestroy(native) == cudaSuccess);
  // The legacy default stream (PyTorch's default) wraps as null.
  auto legacy = gpu.device->WrapStream(nullptr).value();
  CHECK(legacy->native_handle() == nullptr);
  REQUIRE(legacy->Synchronize().ok());
}

TEST_CASE("pinned host memory copies to and from the GPU asynchronously", "[cuda][pinned]") {
  DeviceOptions options{Backend::kCuda, 0, 0};
  options.pinned_capacity_bytes = 64 * kMiB;
  auto device = CreateDevice(options).value();
  auto stream = device->CreateStream().value();
  const size_t bytes = 32 * kMiB;
  auto pinned = device->AllocatePinned(bytes, MemoryCategory::kOptimizerState, "staging").value();
  auto on_gpu = device->Allocate(bytes, MemoryCategory::kOptimizerState, "state").value();
  auto* host = static_cast<uint8_t*>(pinned.data());
  for (size_t i = 0; i < bytes; ++i) host[i] = uint8_t(i * 31 + 1);
  REQUIRE(device->CopyAsync(on_gpu.data(), pinned.data(), bytes, *stream).ok());
  REQUIRE(stream->Synchronize().ok());
  std::memset(host, 0, bytes);
  REQUIRE(device->CopyAsync(pinned.data(), on_gpu.data(), bytes, *stream).ok());
  REQUIRE(stream->Synchronize().ok());
  for (size_t i = 0; i < bytes; ++i) REQUIRE(host[i] == uint8_t(i * 31 + 1));
  CHECK(device->pinned_allocator()->device_name() == "cuda:0:pinned");
}

TEST_CASE("CUDA casts, fill, accumulate, scale and axpy equal the CPU kernels bit for bit", "[cuda][kernels]") {
  Gpu gpu = MakeGpu();
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    INFO("n " << n);
    std::vector<float> x = RandomFloats(n, 2, 300.0f);
    if (n > 4) {
      x[1] = std::numeric_limits<float>::infinity();
      x[2] = std::numeric_limits<float>::quiet_NaN();
      x[3] = 1e-40f;
      x[4] = 65519.99f;
    }
    DeviceBuffer dx = Upload(gpu, x.data(), n * 4, "x");
    for (DType to : {DType::kBF16, DType::kF16}) {
      auto d16 = gpu.device->Allocate(n * 2, MemoryCategory::kOther, "y").value();
      REQUIRE(kernels::Cast(*gpu.device, *gpu.stream, dx.data(), DType::kF32, d16.data(), to, n).ok());
      std::vector<uint16_t> want(n);
      cpu.cast(x.data(), DType::kF32, want.data(), to, n);
      REQUIRE(Download<uint16_t>(gpu, d16, n) == want);
      auto back = gpu.device->Allocate(n * 4, MemoryCategory::kOther, "back").value();
      REQUIRE(kernels::Cast(*gpu.device, *gpu.stream, d16.data(), to, back.data(), DType::kF32, n).ok());
      std::vector<float> want_back(n);
      cpu.cast(want.data(), to, want_back.data(), DType::kF32, n);
      const std::vector<float> got_back = Download<float>(gpu, back, n);
      REQUIRE(std::memcmp(got_back.data(), want_back.data(), n * 4) == 0);
    }
    {
      // bf16 += f32, against the CPU kernel.
      std::vector<uint16_t> acc(n);
      cpu.cast(x.data(), DType::kF32, acc.data(), DType::kBF16, n);
      DeviceBuffer dacc = Upload(gpu, acc.data(), n * 2, "acc");
      const std::vector<float> add = RandomFloats(n, 4, 1.0f);
      DeviceBuffer dadd = Upload(gpu, add.data(), n * 4, "add");
      REQUIRE(kernels::Accumulate(*gpu.device, *gpu.stream, dadd.data(), DType::kF32,
                                  dacc.data(), DType::kBF16, n).ok());
      cpu.accumulate(add.data(), DType::kF32, acc.data(), DType::kBF16, n);
      const std::vector<uint16_t> got = Download<uint16_t>(gpu, dacc, n);
      CheckSameBits(got, acc, Bf16ToF32);
    }
    std::vector<float> y = RandomFloats(n, 3, 1.0f);
    DeviceBuffer dy = Upload(gpu, y.data(), n * 4, "y");
    REQUIRE(kernels::Axpy(*gpu.device, *gpu.stream, 0.7f, static_cast<const float*>(dx.data()),
                          static_cast<float*>(dy.data()), n).ok());
    cpu.axpy(0.7f, x.data(), y.data(), n);
    std::vector<float> got = Download<float>(gpu, dy, n);
    const auto same = [](float v) { return v; };
    CheckSameBits(got, y, same);
    REQUIRE(kernels::Scale(*gpu.device, *gpu.stream, dy.data(), DType::kF32, n, 1.0f / 3).ok());
    cpu.scale(y.data(), DType::kF32, n, 1.0f / 3);
    got = Download<float>(gpu, dy, n);
    CheckSameBits(got, y, same);
    REQUIRE(kernels::Fill(*gpu.device, *gpu.stream, dy.data(), DType::kF32, n, -1.25f).ok());
    for (float v : Download<float>(gpu, dy, n)) REQUIRE(v == -1.25f);
  }
}

TEST_CASE("CUDA sum of squares and non-finite checks", "[cuda][kernels]") {
  Gpu gpu = MakeGpu();
  const size_t n = (1 << 20) + 3;
  std::vector<float> x = RandomFloats(n, 4, 5.0f);
  long double exact = 0;
  for (float v : x) exact += (long double)v * v;
  DeviceBuffer dx = Upload(gpu, x.data(), n * 4, "x");
  const double got = kernels::SumOfSquares(*gpu.device, *gpu.stream, dx.data(), DType::kF32, n).value();
  CHECK(std::fabs(got - double(exact)) <= 1e-12 * double(exact));
  // The reduction order is fixed: the same input gives the same bits.
  CHECK(kernels::SumOfSquares(*gpu.device, *gpu.stream, dx.data(), DType::kF32, n).value() == got);
  CHECK_FALSE(kernels::HasInfOrNan(*gpu.device, *gpu.stream, dx.data(), DType::kF32, n).value());
  x[n - 1] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer bad = Upload(gpu, x.data(), n * 4, "bad");
  CHECK(kernels::HasInfOrNan(*gpu.device, *gpu.stream, bad.data(), DType::kF32, n).value());
  CHECK(gpu.device->allocator().OwnerBytes().size() == 2);  // workspaces were freed
}

TEST_CASE("CUDA Adam equals the CPU Adam bit for bit", "[cuda][kernels][adam]") {
  Gpu gpu = MakeGpu();
  const kernels::cpu::KernelTable& cpu = kernels::cpu::Kernels();
  const size_t n = 100003;
  kernels::AdamParams params;
  params.lr = 3e-4f;
  params.weight_decay = 0.1f;
  params.adamw = true;
  params.step = 7;
  const std::vector<float> p0 = RandomFloats(n, 5, 1.0f), g = RandomFloats(n, 6, 0.01f),
                           m0 = RandomFloats(n, 7, 0.001f);
  std::vector<float> v0 = RandomFloats(n, 8, 0.001f);
  for (float& v : v0) v = v * v;
  DeviceBuffer dp = Upload(gpu, p0.data(), n * 4, "p"), dg = Upload(gpu, g.data(), n * 4, "g"),
               dm = Upload(gpu, m0.data(), n * 4, "m"), dv = Upload(gpu, v0.data(), n * 4, "v");
  auto dlow = gpu.device->Allocate(n * 2, MemoryCategory::kParameter, "low").value();
  REQUIRE(kernels::AdamUpdate(*gpu.device, *gpu.stream, params, static_cast<float*>(dp.data()),
                              dg.data(), DType::kF32, static_cast<float*>(dm.data()),
                              static_cast<float*>(dv.data()), dlow.data(), DType::kBF16, n)
              .ok());
  std::vector<float> p = p0, m = m0, v = v0;
  std::vector<uint16_t> low(n);
  cpu.adam(kernels::MakeAdamConstants(params), p.data(), g.data(), DType::kF32, m.data(), v.data(),
           low.data(), DType::kBF16, n);
  const std::vector<float> gp = Download<float>(gpu, dp, n), gm = Download<float>(gpu, dm, n),
                           gv = Download<float>(gpu, dv, n);
  CHECK(std::memcmp(gp.data(), p.data(), n * 4) == 0);
  CHECK(std::memcmp(gm.data(), m.data(), n * 4) == 0);
  CHECK(std::memcmp(gv.data(), v.data(), n * 4) == 0);
  CHECK(Download<uint16_t>(gpu, dlow, n) == low);
  // bf16 gradients, read by both as they are.
  std::vector<uint16_t> g16(n);
  for (size_t i = 0; i < n; ++i) g16[i] = F32ToBf16(g[i]);
  DeviceBuffer dg16 = Upload(gpu, g16.data(), n * 2, "g16");
  REQUIRE(kernels::AdamUpdate(*gpu.device, *gpu.stream, params, static_cast<float*>(dp.data()),
                              dg16.data(), DType::kBF16, static_cast<float*>(dm.data()),
                              static_cast<float*>(dv.data()), nullptr, DType::kF32, n)
              .ok());
  cpu.adam(kernels::MakeAdamConstants(params), p.data(), g16.data(), DType::kBF16, m.data(),
           v.data(), nullptr, DType::kF32, n);
  CHECK(Download<float>(gpu, dp, n) == p);
  CHECK(Download<float>(gpu, dv, n) == v);
}

TEST_CASE("CUDA SGD with momentum equals the CPU SGD bit for bit", "[cuda][kernels][sgd]") {
  Gpu gpu = MakeGpu();
  const size_t n = 70001;
  kernels::SgdParams params;
  params.lr = 0.05f;
  params.momentum = 0.9f;
  params.weight_decay = 1e-4f;
  const std::vector<float> p0 = RandomFloats(n, 9, 1.0f), g = RandomFloats(n, 10, 0.1f),
                           b0 = RandomFloats(n, 11, 0.01f);
  DeviceBuffer dp = Upload(gpu, p0.data(), n * 4, "p"), dg = Upload(gpu, g.data(), n * 4, "g"),
               db = Upload(gpu, b0.data(), n * 4, "buf");
  REQUIRE(kernels::SgdUpdate(*gpu.device, *gpu.stream, params, static_cast<float*>(dp.data()),
                             dg.data(), DType::kF32, static_cast<float*>(db.data()), nullptr,
                             DType::kF32, n)
              .ok());
  std::vector<float> p = p0, b = b0;
  kernels::cpu::Kernels().sgd(params, p.data(), g.data(), DType::kF32, b.data(), nullptr,
                              DType::kF32, n);
  const std::vector<float> gp = Download<float>(gpu, dp, n), gb = Download<float>(gpu, db, n);
  CHECK(std::memcmp(gp.data(), p.data(), n * 4) == 0);
  CHECK(std::memcmp(gb.data(), b.data(), n * 4) == 0);
}

TEST_CASE("CUDA int8 block quantization equals the CPU kernels bit for bit",
          "[cuda][kernels][quantize]") {
  Gpu gpu = MakeGpu();
  // Partial last blocks, a zero block, a constant one, inf and nan blocks,
  // and block sizes above and below the CUDA block's 256 threads.
  for (size_t block : {size_t{1}, size_t{100}, size_t{256}, size_t{4096}}) {
    INFO("block " << block);
    const size_t n = 70001;
    std::vector<float> x = RandomFloats(n, 12, 3.0f);
    for (size_t i = 0; i < 300; ++i) x[i] = 0.0f;
    for (size_t i = 300; i < 700; ++i) x[i] = -0.75f;
    x[5000] = std::numeric_limits<float>::infinity();
    x[9000] = std::numeric_limits<float>::quiet_NaN();
    const size_t blocks = (n + block - 1) / block;
    std::vector<int8_t> q(n);
    std::vector<float> absmax(blocks), back(n);
    kernels::cpu::Kernels().quantize_int8(x.data(), DType::kF32, n, block, q.data(),
                                          absmax.data());
    kernels::cpu::Kernels().dequantize_int8(q.data(), absmax.data(), n, block, back.data(),
                                            DType::kF32);
    DeviceBuffer dx = Upload(gpu, x.data(), n * 4, "x");
    auto dq = gpu.device->Allocate(n, MemoryCategory::kOther, "q");
    auto da = gpu.device->Allocate(blocks * 4, MemoryCategory::kOther, "absmax");
    auto dback = gpu.device->Allocate(n * 4, MemoryCategory::kOther, "back");
    REQUIRE((dq.ok() && da.ok() && dback.ok()));
    REQUIRE(kernels::QuantizeInt8(*gpu.device, *gpu.stream, dx.data(), DType::kF32, n, block,
                                  static_cast<int8_t*>(dq->data()),
                                  static_cast<float*>(da->data()))
                .ok());
    REQUIRE(kernels::DequantizeInt8(*gpu.device, *gpu.stream,
                                    static_cast<const int8_t*>(dq->data()),
                                    static_cast<const float*>(da->data()), n, block,
                                    dback->data(), DType::kF32)
                .ok());
    CHECK(Download<int8_t>(gpu, *dq, n) == q);
    CheckSameBits(Download<float>(gpu, *da, blocks), absmax, [](float v) { return v; });
    CheckSameBits(Download<float>(gpu, *dback, n), back, [](float v) { return v; });
  }
}

}  // namespace
}  // namespace memwall
