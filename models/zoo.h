// A shape-only zoo: models memwall does not compute but must plan, profile
// and dry-run. Each layer declares its parameters, output shape, saved
// activation bytes and FLOPs exactly as a computing layer would; on meta it
// allocates what it declares (so the allocator's books hold), and on a
// device with bytes its forward fails with kUnimplemented naming the layer.
//
// Models (inputs):
//   resnet50     images f32 [batch, 3, size, size]  (25.56M parameters)
//   resnest269   images f32 [batch, 3, size, size]  (a ResNeSt-269-like
//                network, 110.93M parameters against the published 110.9M:
//                deep stem, bottleneck blocks [3, 30, 48, 8] with radix-2
//                split attention; strided 3x3 convolutions stand in for its
//                parameter-free average-pool downsampling)
//   llama-7b     token ids [batch, seq]             (RMSNorm, SwiGLU)
//   llama2-70b   token ids [batch, seq]             (and grouped-query
//                attention, 8 key/value heads)
// Activation bytes count the tensors a training framework keeps for backward
// (in the run's activation dtype): every convolution's and normalisation's
// output, attention probabilities, the MLP's intermediate products, and each
// block's output. They model an implementation, not Hugging Face's: checked
// against transformers' LlamaForCausalLM traced on meta (memwall.trace;
// benchmarks/trace_models.py), one llama-7b block at sequence 2048 in bf16
// declares 513 MiB here, where Hugging Face's saves 1133 MiB with eager
// attention, 925 MiB on SDPA's math kernel and 381 MiB with a GPU's flash
// or memory-efficient kernel (which keep no probabilities). To plan a Hugging Face model use `memwall plan --model hf:PATH`
// (models/traced.h); the zoo stays for planning without Python.
#ifndef MEMWALL_MODELS_ZOO_H_
#define MEMWALL_MODELS_ZOO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layer.h"

namespace memwall {

// The zoo's model names.
std::vector<std::string> ZooModels();

// The model's layers; kNotFound lists the names. `seq` sets a transformer's
// sequence length (ignored by CNNs).
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> MakeZooModel(const std::string& name,
                                                                 int64_t seq);

// SUM of the layers' declared parameter elements.
int64_t CountParameters(const std::vector<std::unique_ptr<Layer>>& layers);

}  // namespace memwall

#endif  // MEMWALL_MODELS_ZOO_H_
