// gpt-tiny inputs and weights shared by the engine tests on host and their
// cuda twins, so both compare the same runs.
#ifndef MEMWALL_TESTS_SUPPORT_GPT_RUN_H_
#define MEMWALL_TESTS_SUPPORT_GPT_RUN_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "runtime/tensor.h"

namespace memwall::testing {

// Step `step`'s batch of rank `rank`: two sequences of token ids that follow
// a fixed pattern (the next id is the one 5 ahead), on any device.
inline Batch GptBatch(Device& device, const GptConfig& c, int rank, int step) {
  std::vector<float> input(2 * c.seq), target(2 * c.seq);
  for (int64_t i = 0; i < 2 * c.seq; ++i) {
    const int64_t t = (2 * rank * c.seq + i) * 7 + step * 3;
    input[i] = float(t % c.vocab);
    target[i] = float((t + 5) % c.vocab);
  }
  Batch b;
  b.input = Tensor::FromHost(device, input, {2, c.seq}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::FromHost(device, target, {2 * c.seq}, MemoryCategory::kOther, "data").value();
  return b;
}

// The master weights of every block matrix and of the token embedding of a
// trained gpt, whole: with tile parameters, the tiles put back side by side
// as the columns (blocks) or one below the other as the rows (embedding)
// they are.
inline std::vector<float> WholeWeights(Trainer& t, const GptConfig& config) {
  std::vector<float> all;
  const int64_t h = config.hidden;
  std::vector<float> wte(config.vocab * h);
  if (config.vocab_tiles == 1 || !config.tile_parameters) {
    REQUIRE(t.optimizer().MasterWeights("embed.wte", absl::MakeSpan(wte)).ok());
  } else {
    for (int64_t k = 0; k < config.vocab_tiles; ++k) {
      const auto [begin, end] = GptVocabTile(config, k);
      REQUIRE(t.optimizer()
                  .MasterWeights(absl::StrCat("embed.wte_tile", k),
                                 absl::MakeSpan(wte.data() + begin * h, (end - begin) * h))
                  .ok());
    }
  }
  all.insert(all.end(), wte.begin(), wte.end());
  const std::pair<const char*, std::pair<int64_t, int64_t>> matrices[] = {
      {"qkv_weight", {h, 3 * h}},
      {"attn_proj_weight", {h, h}},
      {"fc_weight", {h, 4 * h}},
      {"mlp_proj_weight", {4 * h, h}}};
  for (int64_t l = 0; l < config.layers; ++l) {
    for (const auto& [name, shape] : matrices) {
      const auto [in, out] = shape;
      std::vector<float> whole(in * out);
      const std::string full = absl::StrCat("block", l, ".", name);
      if (config.tiles == 1 || !config.tile_parameters) {
        REQUIRE(t.optimizer().MasterWeights(full, absl::MakeSpan(whole)).ok());
      } else {
        const int64_t width = out / config.tiles;
        std::vector<float> tile(in * width);
        for (int64_t k = 0; k < config.tiles; ++k) {
          REQUIRE(t.optimizer()
                      .MasterWeights(absl::StrCat(full, "_tile", k), absl::MakeSpan(tile))
                      .ok());
          for (int64_t i = 0; i < in; ++i) {
            std::copy_n(tile.begin() + i * width, width, whole.begin() + i * out + k * width);
          }
        }
      }
      all.insert(all.end(), whole.begin(), whole.end());
    }
  }
  return all;
}

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_GPT_RUN_H_
