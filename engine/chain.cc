#include "engine/chain.h"

#include <algorithm>

#include "runtime/status.h"

namespace memwall {

absl::StatusOr<Chain> ChainOf(const std::vector<std::unique_ptr<Layer>>& layers,
                              std::vector<int64_t> input, DType dtype) {
  Chain chain;
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  std::vector<int64_t> shape = std::move(input);
  for (const auto& layer : layers) {
    MW_ASSIGN_OR_RETURN(std::vector<int64_t> out, layer->OutputShape(shape));
    int64_t numel = 1;
    for (int64_t d : out) numel *= d;
    ChainLayer c;
    c.name = layer->name();
    c.output = numel * size;
    c.saved = layer->ActivationBytes(shape, dtype) - c.output;
    c.grad_input = layer->InputGradientBytes(shape);
    c.forward_flops = layer->ForwardFlops(shape);
    c.recomputable = layer->Recomputable();
    chain.recompute_held = std::max(chain.recompute_held, layer->RecomputeHeldBytes());
    if (const auto selective = layer->Selective(shape, dtype)) {
      c.has_selective = true;
      c.selective_saved = selective->saved_bytes - c.output;
      c.selective_recomputed = selective->recomputed_bytes;
      c.selective_flops = selective->extra_flops;
    }
    chain.layers.push_back(std::move(c));
    shape = std::move(out);
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  chain.loss_grad = 4 * numel;  // the loss's f32 gradient of the last output
  return chain;
}

}  // namespace memwall
