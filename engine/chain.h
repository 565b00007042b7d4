// The chain a recomputation planner sees, from a model's own declarations
// (Layer::ActivationBytes, InputGradientBytes, Selective, ForwardFlops).
#ifndef MEMWALL_ENGINE_CHAIN_H_
#define MEMWALL_ENGINE_CHAIN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpointing/plan.h"
#include "engine/layer.h"
#include "runtime/dtype.h"

namespace memwall {

// The chain of `layers` for one micro-batch whose first input has shape
// `input`, activations stored in `dtype`. Errors: the first layer that
// rejects its input shape.
absl::StatusOr<Chain> ChainOf(const std::vector<std::unique_ptr<Layer>>& layers,
                              std::vector<int64_t> input, DType dtype);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_CHAIN_H_
