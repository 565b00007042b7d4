"""memwall.trace (issue 17's first part): models built on torch's meta
device trace for free, with the published parameter counts; a trace on
meta predicts, unit by unit, the activations a real CPU step of the same
model saves, as memwall's profiler counts them through ZeroOptimizer."""
import pytest
import torch
import transformers

import memwall.torch as mt
from memwall import trace as tracing

# Published parameter counts (the models' cards and papers), built from
# their configs' hyperparameters on meta: no weights, no memory.
PUBLISHED = {
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()), 124_439_808),
    "llama-2-7b": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000)), 6_738_415_616),
    "mistral-7b": (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000)), 7_241_732_096),
    "bert-large": (lambda: transformers.BertModel(transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096)), 335_141_888),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_on_meta_are_the_published_ones(name):
    build, published = PUBLISHED[name]
    with torch.device("meta"):
        model = build()
    count = sum(u.parameters for u in tracing.trace(
        model, {"input_ids": torch.zeros(1, 8, dtype=torch.long, device="meta")},
        loss=lambda out: _first(out).sum()).units)
    assert count == published


def _first(out):
    return out.to_tuple()[0] if hasattr(out, "to_tuple") else out


def test_one_llama_7b_layer_saves_what_the_issue_measured():
    """Issue 17's measurement: a LLaMA-7B decoder layer at micro-batch 1,
    sequence 2048, bf16 saves 1133 MiB with eager attention and 925 MiB on
    the SDPA path as traced on meta (memwall's shape zoo declares 513)."""
    saved = {}
    for impl in ("eager", "sdpa"):
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
                hidden_size=4096, intermediate_size=11008, num_hidden_layers=1,
                num_attention_heads=32, vocab_size=32000, attn_implementation=impl))
        model.to(torch.bfloat16)
        ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
        saved[impl] = tracing.trace(model, {"input_ids": ids, "labels": ids}).unit(
            "model.layers.0").saved
    assert saved == {"eager": 1133 * 2**20 + 16 * 2**10, "sdpa": 925 * 2**20 + 16 * 2**10}


def small(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager"))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_meta_trace_predicts_a_real_cpu_step_unit_by_unit(kind, tmp_path):
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.device("meta"):
        meta_model = small(kind)
    meta = tracing.trace(meta_model, {"input_ids": ids.to("meta"), "labels": ids.to("meta")})
    cpu = tracing.trace(small(kind), {"input_ids": ids, "labels": ids})
    assert [(u.name, u.parameters, u.saved, u.output, u.forward_flops) for u in meta.units] == \
        [(u.name, u.parameters, u.saved, u.output, u.forward_flops) for u in cpu.units]
    assert any(u.name.endswith("layers.1") or u.name.endswith("h.1") for u in meta.units)

    # A real training step through ZeroOptimizer, as memwall's profiler
    # counts it (innermost modules), summed into the trace's units.
    model = small(kind)
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 3}})
    units = [u.name for u in meta.units if u.name != "<model>"]
    with mt.profile(opt, tmp_path):
        loss = model(ids, labels=ids).loss
        counted = {}
        for owner, category, bytes_ in opt.engine.owners():
            if category != "activation":
                continue
            unit = max((u for u in units if owner == u or owner.startswith(u + ".")),
                       key=len, default="<model>")
            counted[unit] = counted.get(unit, 0) + bytes_
        opt.backward(loss)
        opt.step()
    assert counted == {u.name: u.saved for u in meta.units if u.saved}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_use_cache_false_traces_on_meta_as_on_cpu(kind):
    """Training's use_cache=False with no attention mask: transformers reads
    the position ids' values (is this a packed batch?). On meta the model's
    own positions are one sequence a row, as on CPU; the caller's own meta
    position ids are refused by name."""
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.device("meta"):
        meta_model = small(kind)
    meta = tracing.trace(meta_model, {"input_ids": ids.to("meta"), "labels": ids.to("meta"),
                                      "use_cache": False})
    cpu = tracing.trace(small(kind), {"input_ids": ids, "labels": ids, "use_cache": False})
    assert [(u.name, u.parameters, u.saved, u.output, u.forward_flops) for u in meta.units] == \
        [(u.name, u.parameters, u.saved, u.output, u.forward_flops) for u in cpu.units]
    assert sum(u.saved for u in meta.units) > 0
    positions = torch.arange(16).expand(2, 16)
    with pytest.raises(ValueError, match="position_ids: on meta with no attention mask and no "
                       "cache, transformers asks their values whether sequences are packed"):
        tracing.trace(meta_model, {"input_ids": ids.to("meta"), "labels": ids.to("meta"),
                                   "use_cache": False, "position_ids": positions.to("meta")})
