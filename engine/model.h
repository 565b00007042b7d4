// A model made of memwall layers, as the engine takes it: its layers, its
// loss, and one micro-batch's input and target shapes. The engine takes a
// factory rather than a model, because a dry run (the auto strategy, the
// recomputation budget, the out-of-memory advice) consumes a fresh copy
// of the model for every configuration it measures; a factory also keeps
// engine/ free of model names (turning "gpt2-1.5b" into layers belongs to
// models/, see models/spec.h).
#ifndef MEMWALL_ENGINE_MODEL_H_
#define MEMWALL_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layer.h"

namespace memwall {

struct Model {
  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<LossFunction> loss;
  std::vector<int64_t> input, target;  // one micro-batch's shapes
};

// Builds a fresh model for micro-batches of `micro_batch` samples. Every
// call must build the same model (names, shapes, order); errors name what
// is wrong with the model's description.
using ModelFactory = std::function<absl::StatusOr<Model>(int64_t micro_batch)>;

}  // namespace memwall

#endif  // MEMWALL_ENGINE_MODEL_H_
