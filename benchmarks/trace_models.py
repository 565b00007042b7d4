"""memwall.trace on torch's meta device: the parameters of whole models
against their published counts, the seconds a trace of a whole step takes
(the plan-time budget of issue 17), and the activations one LLaMA-7B layer
saves with eager attention against torch's SDPA path (its math kernel, as
meta runs it, and the GPU's memory-efficient and flash kernels as
memwall.trace accounts them), in the same run.

Usage (after tools/python_env.sh): .venv/bin/python benchmarks/trace_models.py
"""
import time

import torch
import transformers

from memwall import trace as tracing

LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
MODELS = [
    ("GPT-2", lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()), 124_439_808),
    ("Llama-2-7B", lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_7B)),
     6_738_415_616),
    ("Mistral-7B", lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000)), 7_241_732_096),
]


def main():
    print("whole models on meta, micro-batch 1, sequence 1024, f32: one traced training step")
    print("  %-12s %16s %16s %10s %14s" % ("model", "parameters", "published", "trace s",
                                          "saved GiB"))
    for name, build, published in MODELS:
        start = time.perf_counter()
        with torch.device("meta"):
            model = build()
        ids = torch.zeros(1, 1024, dtype=torch.long, device="meta")
        t = tracing.trace(model, {"input_ids": ids, "labels": ids})
        seconds = time.perf_counter() - start
        print("  %-12s %16d %16d %10.1f %14.2f" % (name, t.parameters, published, seconds,
                                                  t.saved / 2**30))
    print("one LLaMA-7B decoder layer, micro-batch 1, sequence 2048, bf16: saved activations")
    print("  (memwall's C++ zoo llama-7b layer declares 513 MiB: models/zoo.h says what it "
          "models)")
    for impl, kernel in (("eager", "math"), ("sdpa", "math"), ("sdpa", "efficient"),
                         ("sdpa", "flash")):
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
                **{**LLAMA_7B, "num_hidden_layers": 1}, attn_implementation=impl))
        model.to(torch.bfloat16)
        ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
        unit = tracing.trace(model, {"input_ids": ids, "labels": ids},
                             attention=kernel).unit("model.layers.0")
        label = impl if impl == "eager" else "%s %s" % (impl, kernel)
        print("  %-16s %10.2f MiB" % (label, unit.saved / 2**20))


if __name__ == "__main__":
    main()
