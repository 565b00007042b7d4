// GPT: a decoder-only transformer (GPT-2's layout) with real f32 compute on
// host and cuda (kernels/nn.h). Token and position embeddings; pre-LayerNorm blocks (causal
// multi-head self-attention, then an MLP with 4x hidden and GELU), each one
// Layer with residuals inside; a final LayerNorm and an LM head tied to the
// token embedding; cross-entropy loss.
//
// Tensors: the model's input is token ids [batch, seq] stored as f32 (exact
// below 2^24); activations are [batch * seq, hidden]; the loss's target is
// the next-token ids [batch * seq] as f32.
#ifndef MEMWALL_MODELS_GPT_H_
#define MEMWALL_MODELS_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layer.h"

namespace memwall {

struct GptConfig {
  int64_t vocab = 256;
  int64_t seq = 64;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  // Memory-centric tiling of each block's four weight matrices (qkv, the
  // attention projection and the MLP pair; hidden must divide by it): each
  // is computed in `tiles` blocks of its output columns, in order, its input
  // gradient accumulating block by block (tile 0 writes, the others add).
  // With tile_parameters (the default) each block of columns is a
  // parameter of its own ("<weight>_tile<t>", initialised as those columns
  // of the untiled weight), which gathering on use
  // (zero_optimization.stage3_gather_on_use) gathers, computes and
  // releases in turn, so the device holds one tile at a time; without, one
  // parameter holds them all, computed in the same blocks, which the tiled
  // one equals bit for bit (the same GEMMs in the same order, on the same
  // values). tiles 1 is the plain operator: a tiled model starts from its
  // weights and, on host, computes its outputs bit for bit (each output
  // element is the same dot product; cuBLAS may choose another algorithm
  // for a narrower GEMM), but adds the input gradient in another order
  // (by blocks), so training agrees with it to rounding, not bit for bit
  // (tests/engine/trainer_test.cc gives the tolerance). A checkpoint records
  // the tiles, and `memwall export` writes the plain model's tensors.
  int64_t tiles = 1;
  // The same for the token embedding, which the LM head shares (tied):
  // its vocabulary in `vocab_tiles` tiles of consecutive tokens
  // (GptVocabTile; 1..vocab, sizes differing by at most one: 50257 in 8 is
  // 1 x 6283 and 7 x 6282). The embedding's forward and backward and the
  // head's logits GEMMs run tile by tile, the head's input gradient
  // accumulating tile by tile (tile 0 writes, the others add). With
  // tile_parameters each tile is a parameter of its own ("wte_tile<t>",
  // those rows of the untiled table) that gathering on use gathers, uses
  // and releases in turn, in the embedding and in the head; the tiles'
  // gradients stay on the device from the head's backward to the
  // embedding's, which adds to them last and reduces them.
  int64_t vocab_tiles = 1;
  bool tile_parameters = true;
  // Fine-tuning: the first `frozen_blocks` transformer blocks are frozen
  // (ParameterDecl::trainable false: no gradient, no optimizer state); their
  // backward computes only their input's gradient. 0..layers.
  int64_t frozen_blocks = 0;
};

// Named presets: "gpt-tiny" (byte-level, trains in seconds on this
// machine), "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "gpt3-6.7b",
// "gpt3-13b" (hidden 5120 = 40 heads x 128, so 12.85B parameters: the
// paper's d_model of 5140 does not split into its heads), "gpt3-175b".
// kNotFound lists the names.
absl::StatusOr<GptConfig> GptPreset(const std::string& name);

// A preset with optional overrides: "gpt2-124m:layers=2,seq=256" (keys vocab,
// seq, hidden, heads, layers, tiles, vocab_tiles, frozen_blocks, params), or the bare family "gpt"
// with a shape: "gpt:layers=48,hidden=6400,heads=50,seq=2048" or "gpt:params=80e9"
// (GptShapeForParameters). Errors name the key or the preset.
absl::StatusOr<GptConfig> ParseGptModel(const std::string& spec);

// The model as ParseGptModel reads it back, with the keys that change its
// parameters or what trains ("gpt:vocab=256,seq=64,hidden=64,heads=4,
// layers=2"; tiles, vocab_tiles and frozen_blocks only when set, so that
// descriptions made before those keys existed still match): what a
// checkpoint records of the model it holds.
std::string GptDescription(const GptConfig& config);

// The shape rule for a parameter count (GPT-3's family): layers = heads =
// hidden / 128 and 12 layers hidden^2 = `parameters`, hidden rounded to a
// multiple of 128; vocabulary 50257, sequence 2048. gpt3-175b is the rule's
// own shape (hidden 12288).
GptConfig GptShapeForParameters(double parameters);

// Tile t of the vocabulary (GptConfig::vocab_tiles): tokens [first, second).
// The first vocab % vocab_tiles tiles hold one token more than the rest.
std::pair<int64_t, int64_t> GptVocabTile(const GptConfig& config, int64_t t);

// Parameters of the model (the LM head is tied, so not counted twice).
int64_t GptParameterCount(const GptConfig& config);

// The most parameters (and attention scores per sequence) a shape may
// have: sizes stay far from int64 overflow.
constexpr double kMaxGptParameters = 1e18;

// The most layers a shape may have (a dry run holds an object, a chain
// link and a flat group per layer, so this bounds its host memory).
constexpr int64_t kMaxGptLayers = 100000;

// Checks positivity, divisibility and size (at most kMaxGptParameters and
// kMaxGptLayers); errors name the field.
absl::Status ValidateGptConfig(const GptConfig& config);

// The layers: "embed", "block0" .. "block<L-1>", "head".
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> MakeGpt(const GptConfig& config);

// Mean cross-entropy of logits [rows, vocab] against target ids [rows].
class CrossEntropyLoss final : public LossFunction {
 public:
  absl::StatusOr<float> Compute(LayerContext& ctx, const Tensor& logits, const Tensor& target,
                                Tensor& grad_logits) override;
};

}  // namespace memwall

#endif  // MEMWALL_MODELS_GPT_H_
