// Device-dispatched kernels on host (real bytes) and meta (no bytes).
#include "kernels/ops.h"

#include <vector>

#include "catch2/catch.hpp"
#include "kernels/cpu/cpu_kernels.h"
#include "runtime/device.h"
#include "runtime/units.h"

namespace memwall::kernels {
namespace {

TEST_CASE("host ops run the selected CPU kernels on device buffers", "[ops]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto stream = device->CreateStream().value();
  const size_t n = 1000;
  auto p = device->Allocate(n * 4, MemoryCategory::kOptimizerState, "master").value();
  auto g = device->Allocate(n * 4, MemoryCategory::kGradient, "grad").value();
  auto m = device->Allocate(n * 4, MemoryCategory::kOptimizerState, "m").value();
  auto v = device->Allocate(n * 4, MemoryCategory::kOptimizerState, "v").value();
  auto low = device->Allocate(n * 2, MemoryCategory::kParameter, "weight").value();
  REQUIRE(Fill(*device, *stream, p.data(), DType::kF32, n, 1.0f).ok());
  REQUIRE(Fill(*device, *stream, g.data(), DType::kF32, n, 0.5f).ok());
  REQUIRE(Fill(*device, *stream, m.data(), DType::kF32, n, 0.0f).ok());
  REQUIRE(Fill(*device, *stream, v.data(), DType::kF32, n, 0.0f).ok());
  CHECK(SumOfSquares(*device, *stream, g.data(), DType::kF32, n).value() == 250.0);
  CHECK_FALSE(HasInfOrNan(*device, *stream, g.data(), DType::kF32, n).value());
  AdamParams params;
  params.lr = 0.01f;
  REQUIRE(AdamUpdate(*device, *stream, params, static_cast<float*>(p.data()), g.data(), DType::kF32,
                     static_cast<float*>(m.data()), static_cast<float*>(v.data()), low.data(),
                     DType::kBF16, n)
              .ok());
  // Step 1 of Adam moves every weight by lr * g / (|g| + eps) ~= lr.
  float want = 1.0f, wm = 0.0f, wv = 0.0f;
  AdamElement(MakeAdamConstants(params), want, 0.5f, wm, wv);
  CHECK(static_cast<float*>(p.data())[n - 1] == want);
  CHECK(std::fabs(want - 0.99f) < 1e-6f);
  CHECK(static_cast<uint16_t*>(low.data())[0] == F32ToBf16(want));

  REQUIRE(Scale(*device, *stream, g.data(), DType::kF32, n, 2.0f).ok());
  REQUIRE(Axpy(*device, *stream, -1.0f, static_cast<const float*>(g.data()),
               static_cast<float*>(m.data()), n).ok());
  REQUIRE(Cast(*device, *stream, g.data(), DType::kF32, low.data(), DType::kF16, n).ok());
  CHECK(static_cast<uint16_t*>(low.data())[3] == F32ToF16(1.0f));
  REQUIRE(Copy(*device, *stream, v.data(), g.data(), n * 4).ok());
  CHECK(static_cast<float*>(v.data())[999] == 1.0f);
}

TEST_CASE("Adam parameters are validated by name", "[ops]") {
  AdamParams params;
  params.beta2 = 1.0f;
  absl::Status status = ValidateAdamParams(params);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) == "adam beta2: expected 0 <= beta2 < 1, got 1");
  params = AdamParams();
  params.step = 0;
  CHECK(std::string(ValidateAdamParams(params).message()) == "adam step: expected >= 1, got 0");
  params = AdamParams();
  params.eps = 0.0f;
  CHECK_THAT(std::string(ValidateAdamParams(params).message()), Catch::Contains("adam eps"));
  params = AdamParams();
  params.lr = -1.0f;
  auto device = CreateDevice({Backend::kMeta, 0, kGiB}).value();
  auto stream = device->CreateStream().value();
  status = AdamUpdate(*device, *stream, params, nullptr, nullptr, DType::kF32, nullptr, nullptr,
                      nullptr, DType::kF32, 10);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Contains("adam lr"));
}

TEST_CASE("meta ops compute nothing and touch no bytes", "[ops][meta]") {
  auto device = CreateDevice({Backend::kMeta, 0, 64 * kGiB}).value();
  auto stream = device->CreateStream().value();
  auto huge = device->Allocate(size_t{40} << 30, MemoryCategory::kParameter, "w").value();
  REQUIRE(huge.data() == nullptr);
  const size_t n = size_t{10} << 30;
  CHECK(Fill(*device, *stream, huge.data(), DType::kF32, n, 1.0f).ok());
  CHECK(SumOfSquares(*device, *stream, huge.data(), DType::kF32, n).value() == 0.0);
  CHECK_FALSE(HasInfOrNan(*device, *stream, huge.data(), DType::kF32, n).value());
  CHECK(AdamUpdate(*device, *stream, AdamParams(), nullptr, nullptr, DType::kF32, nullptr, nullptr,
                   nullptr, DType::kF32, n)
            .ok());
}

}  // namespace
TEST_CASE("int8 quantization round-trips on the host device and refuses block 0", "[ops]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto stream = device->CreateStream().value();
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 4.0f, 4.0f};
  std::vector<int8_t> q(5);
  std::vector<float> absmax(3), back(5);
  REQUIRE(QuantizeInt8(*device, *stream, x.data(), DType::kF32, 5, 2, q.data(), absmax.data())
              .ok());
  REQUIRE(DequantizeInt8(*device, *stream, q.data(), absmax.data(), 5, 2, back.data(),
                         DType::kF32)
              .ok());
  CHECK(absmax == std::vector<float>{2.0f, 4.0f, 4.0f});
  CHECK(q == std::vector<int8_t>{64, -127, 16, 127, 127});  // 63.5 -> 64 (even), 15.875 -> 16
  CHECK(back[1] == -2.0f);
  CHECK(back[4] == 4.0f);
  const absl::Status zero =
      QuantizeInt8(*device, *stream, x.data(), DType::kF32, 5, 0, q.data(), absmax.data());
  CHECK(zero.code() == absl::StatusCode::kInvalidArgument);
  CHECK(zero.message() == "QuantizeInt8: block: expected >= 1, got 0");
  const absl::Status back_zero = DequantizeInt8(*device, *stream, q.data(), absmax.data(), 5, 0,
                                                back.data(), DType::kF32);
  CHECK(back_zero.message() == "DequantizeInt8: block: expected >= 1, got 0");
}

}  // namespace memwall::kernels
