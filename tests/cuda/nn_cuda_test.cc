// The CUDA twins of the neural-network kernels (kernels/nn.h on a cuda
// device) against the CPU kernels (the same ops on a host device): the same
// bits wherever nn_math.h promises them, cuBLAS GEMM within f32 rounding of
// OpenBLAS. Needs a GPU: reports its cases as skipped without one.
#include <cmath>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/values.h"
#include "kernels/nn.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "runtime/units.h"

namespace memwall::kernels {
namespace {

using testing::RandomFloats;
using testing::SameBits;

// One backend: a device, a stream, and the tensors of a run by name.
struct Side {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::vector<Tensor> keep;

  explicit Side(Backend backend) {
    device = CreateDevice({backend, 0, 512 * kMiB}).value();
    stream = device->CreateStream().value();
  }
  float* Put(const std::vector<float>& values) {
    keep.push_back(Tensor::FromHost(*device, values, {int64_t(values.size())},
                                    MemoryCategory::kOther, "test")
                       .value());
    return keep.back().data_as<float>();
  }
  std::vector<float> Get(const float* p, size_t n) {
    for (const Tensor& t : keep) {
      if (t.data_as<float>() == p) {
        std::vector<float> all = t.ToHost(*stream).value();
        all.resize(n);
        return all;
      }
    }
    FAIL("not a tensor of this side");
    return {};
  }
};

constexpr int64_t kRows = 300, kH = 200, kS = 70, kMatrices = 6, kVocab = 517, kSeq = 50;

// Every NN op on one side; the outputs in a fixed order.
std::vector<std::vector<float>> RunAll(Side& s, double* loss) {
  Device& d = *s.device;
  Stream& st = *s.stream;
  std::vector<std::vector<float>> out;
  const std::vector<float> xv = RandomFloats(kRows * kH, 1, 2.0f), dyv = RandomFloats(kRows * kH, 2, 1.0f);
  float* x = s.Put(xv);
  float* dy = s.Put(dyv);
  float* gamma = s.Put(RandomFloats(kH, 3, 1.0f));
  float* beta = s.Put(RandomFloats(kH, 4, 1.0f));
  float* y = s.Put(std::vector<float>(kRows * kH));
  float* stats = s.Put(std::vector<float>(2 * kRows));
  float* dx = s.Put(std::vector<float>(kRows * kH));
  float* dg = s.Put(std::vector<float>(kH, 0.5f));
  float* db = s.Put(std::vector<float>(kH, -0.5f));
  REQUIRE(LayerNormForward(d, st, x, gamma, beta, kRows, kH, y, stats).ok());
  REQUIRE(LayerNormBackward(d, st, dy, x, stats, gamma, kRows, kH, dx, dg, db).ok());
  for (auto [p, n] : {std::pair{y, kRows * kH}, {stats, 2 * kRows}, {dx, kRows * kH}, {dg, kH},
                      {db, kH}}) {
    out.push_back(s.Get(p, n));
  }
  float* gelu = s.Put(std::vector<float>(kRows * kH));
  REQUIRE(GeluForward(d, st, x, gelu, kRows * kH).ok());
  out.push_back(s.Get(gelu, kRows * kH));
  REQUIRE(GeluBackward(d, st, x, dy, dx, kRows * kH).ok());
  out.push_back(s.Get(dx, kRows * kH));

  float* scores = s.Put(RandomFloats(kMatrices * kS * kS, 5, 3.0f));
  float* dp = s.Put(RandomFloats(kMatrices * kS * kS, 6, 1.0f));
  REQUIRE(CausalSoftmaxForward(d, st, scores, kMatrices, kS).ok());
  REQUIRE(CausalSoftmaxBackward(d, st, scores, dp, kMatrices, kS).ok());
  out.push_back(s.Get(scores, kMatrices * kS * kS));
  out.push_back(s.Get(dp, kMatrices * kS * kS));

  std::vector<float> targets(kRows);
  for (int64_t r = 0; r < kRows; ++r) targets[r] = float((r * 13) % kVocab);
  float* logits = s.Put(RandomFloats(kRows * kVocab, 7, 4.0f));
  float* t = s.Put(targets);
  float* dl = s.Put(std::vector<float>(kRows * kVocab));
  REQUIRE(CheckIds(d, st, t, kRows, kVocab, "target").ok());
  *loss = CrossEntropy(d, st, logits, t, kRows, kVocab, 1.0f / kRows, dl).value();
  out.push_back(s.Get(dl, kRows * kVocab));

  float* bcast = s.Put(std::vector<float>(kRows * kH));
  float* colsum = s.Put(std::vector<float>(kH, 1.0f));
  REQUIRE(BroadcastRows(d, st, beta, kRows, kH, bcast).ok());
  REQUIRE(ColumnSum(d, st, x, kRows, kH, colsum).ok());
  out.push_back(s.Get(bcast, kRows * kH));
  out.push_back(s.Get(colsum, kH));

  std::vector<float> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[r] = float((r * 7) % 11);  // repeated ids
  float* id = s.Put(ids);
  float* wte = s.Put(RandomFloats(kVocab * kH, 8, 1.0f));
  float* wpe = s.Put(RandomFloats(kSeq * kH, 9, 1.0f));
  float* emb = s.Put(std::vector<float>(kRows * kH));
  float* dwte = s.Put(std::vector<float>(kVocab * kH, 0.0f));
  float* dwpe = s.Put(std::vector<float>(kSeq * kH, 0.0f));
  REQUIRE(EmbeddingForward(d, st, id, wte, 0, kVocab, wpe, kRows, kSeq, kH, emb).ok());
  REQUIRE(EmbeddingBackward(d, st, id, dy, kRows, kSeq, kH, 0, kVocab, dwte, dwpe).ok());
  out.push_back(s.Get(emb, kRows * kH));
  out.push_back(s.Get(dwte, kVocab * kH));
  out.push_back(s.Get(dwpe, kSeq * kH));
  // A tile of the vocabulary, [3, 8): its rows only, and no position table.
  float* tile_out = s.Put(std::vector<float>(kRows * kH, -1.0f));
  float* dtile = s.Put(std::vector<float>(5 * kH, 0.0f));
  REQUIRE(EmbeddingForward(d, st, id, wte + 3 * kH, 3, 8, wpe, kRows, kSeq, kH, tile_out).ok());
  REQUIRE(EmbeddingBackward(d, st, id, dy, kRows, kSeq, kH, 3, 8, dtile, nullptr).ok());
  out.push_back(s.Get(tile_out, kRows * kH));
  out.push_back(s.Get(dtile, 5 * kH));
  return out;
}

TEST_CASE("the CUDA NN kernels return the CPU kernels' bits", "[cuda][nn]") {
  Side host(Backend::kHost), gpu(Backend::kCuda);
  double host_loss = 0, gpu_loss = 0;
  const auto on_host = RunAll(host, &host_loss);
  const auto on_gpu = RunAll(gpu, &gpu_loss);
  REQUIRE(on_host.size() == on_gpu.size());
  for (size_t i = 0; i < on_host.size(); ++i) {
    INFO("output " << i);
    CHECK(SameBits(on_host[i], on_gpu[i]));
  }
  // The loss uses each platform's logf once per row.
  CHECK(gpu_loss == Approx(host_loss).epsilon(1e-6));
}

TEST_CASE("cuBLAS GEMM agrees with OpenBLAS for every transpose", "[cuda][gemm]") {
  Side host(Backend::kHost), gpu(Backend::kCuda);
  const int64_t m = 67, n = 45, k = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      std::vector<std::vector<float>> results;
      for (Side* s : {&host, &gpu}) {
        float* a = s->Put(RandomFloats(m * k, 10, 1.0f));
        float* b = s->Put(RandomFloats(k * n, 11, 1.0f));
        float* c = s->Put(RandomFloats(m * n, 12, 1.0f));
        REQUIRE(Gemm(*s->device, *s->stream, ta, tb, m, n, k, 0.5f, a, ta ? m : k, b,
                     tb ? k : n, 2.0f, c, n)
                    .ok());
        results.push_back(s->Get(c, m * n));
      }
      for (int64_t i = 0; i < m * n; ++i) {
        CHECK(results[1][i] == Approx(results[0][i]).margin(1e-4).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("CheckIds reads device ids back to name the bad one", "[cuda][nn]") {
  Side gpu(Backend::kCuda);
  float* ids = gpu.Put({1, 2, 7, 3});
  const absl::Status bad = CheckIds(*gpu.device, *gpu.stream, ids, 4, 5, "token");
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.message()) == "token 2 is 7; expected an id in 0..4");
}

}  // namespace
}  // namespace memwall::kernels
