"""Planning the user's own PyTorch / Hugging Face model (issue 17): the
published parameter counts of whole families built from their configs on
meta, the GPU attention kernels accounted as torch's own operators save,
descriptions exact at other micro-batch sizes, LoRA's published counts,
and plans through memwall.torch.plan and `memwall plan --model hf:PATH`."""
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

import memwall.hf as hf
import memwall.torch as mt
from memwall import trace as tracing

from test_trace import small

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = os.path.join(ROOT, "configs", "hf")
with open(os.path.join(CONFIGS, "llama-2-7b.json")) as f:
    LLAMA_2_7B = json.load(f)
# Published parameter counts (model cards, papers) of the configs in
# configs/hf/, which carry the published hyperparameters.
FAMILIES = {
    "gpt2": 124_439_808,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "qwen2-72b": 72_706_203_648,
    "mixtral-8x7b": 46_702_792_704,
    "vit-b-16": 86_567_656,
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_families_built_from_their_configs_have_the_published_counts(name):
    model = hf.build(os.path.join(CONFIGS, name + ".json"), "bf16")
    assert sum(p.numel() for p in model.parameters()) == FAMILIES[name]
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_lora_on_llama_2_7b_has_peft_s_published_counts():
    # peft's print_trainable_parameters for Llama-2-7B, r=8 on q_proj and
    # v_proj: "trainable params: 4,194,304 || all params: 6,742,609,920".
    model = hf.lora(hf.build(LLAMA_2_7B, "bf16"), rank=8, targets=("q_proj", "v_proj"))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 4_194_304
    assert sum(p.numel() for p in model.parameters()) == 6_742_609_920
    with pytest.raises(ValueError) as error:
        hf.lora(hf.build(LLAMA_2_7B, "bf16"), targets=("nope",))
    assert str(error.value) == "lora targets nope: no linear layer of the model has those names"


def test_lora_on_gpt2_s_conv1d_has_peft_s_published_counts():
    # GPT-2's attention is a transformers Conv1D; peft's
    # print_trainable_parameters for gpt2, r=8 on c_attn: "trainable params:
    # 294,912 || all params: 124,734,720".
    model = hf.lora(hf.build(os.path.join(CONFIGS, "gpt2.json")), rank=8, targets=("c_attn",))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 294_912
    assert sum(p.numel() for p in model.parameters()) == 124_734_720
    # On the CPU the adapted model starts as the base model (B is zero) and
    # its adapters get gradients.
    config = transformers.GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config)
    torch.manual_seed(0)
    adapted = hf.lora(transformers.GPT2LMHeadModel(config), rank=4, targets=("c_attn",))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    out = adapted(ids, labels=ids)
    assert torch.equal(out.logits, base(ids).logits)
    out.loss.backward()
    assert adapted.transformer.h[0].attn.c_attn.lora_B.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kernel,op", [
    ("flash", lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, True)[0]),
    ("efficient", lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, True)[0]),
])
def test_gpu_attention_kernels_save_what_torch_s_operators_save(kernel, op):
    def saved(fn):
        got = []
        q, k, v = (torch.empty(2, 4, 100, 64, device="meta", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: got.append((tuple(t.shape), t.dtype)) or t, lambda t: t):
            fn(q, k, v)
        return sorted(got, key=str)

    with tracing._KernelMode(kernel):
        ours = saved(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True))
    assert ours == saved(op)


@pytest.mark.parametrize("kernel", ["flash", "efficient"])
def test_gpu_attention_output_is_laid_out_as_the_kernels_write_it(kernel):
    """The GPU kernels write [batch, L, heads, D] and return it transposed
    (torch's meta efficient-attention operator has those strides), so the
    transpose(1, 2).contiguous() after attention in transformers copies
    nothing (the trace kept one [batch x L, hidden] tensor a layer too many
    before)."""
    q = torch.empty(2, 4, 100, 64, device="meta", dtype=torch.bfloat16)
    want = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, q, q, None, True, 0.0, True)[0].stride()
    with tracing._KernelMode(kernel):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.stride() == want
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_description_is_exact_at_a_third_micro_batch(kind):
    with torch.device("meta"):
        model = small(kind)

    def make(batch):
        ids = torch.zeros(batch, 16, dtype=torch.long, device="meta")
        return {"input_ids": ids, "labels": ids}
    d = tracing.describe(model, make, batches=(2, 3))
    t = tracing.trace(model, make(5), attention="auto")
    for stage, s in zip(d["stages"], t.stages):
        for field in ("kept", "output", "input_grad", "forward_flops"):
            fixed, per = stage[field]
            assert fixed + 5 * per == getattr(s, field), (stage["name"], field)
    # Every saved byte but the inputs' is a stage's kept bytes or an output
    # the next stage's backward reads.
    held = sum(s.kept for s in t.stages) + sum(
        a.output for a, b in zip(t.stages, t.stages[1:]) if b.reads_input)
    assert held == t.saved - t.inputs_saved


def test_llama_2_7b_lora_fits_one_24_gib_gpu_at_sequence_4096():
    """Issue 17's question, answered by a dry run: with the optimal
    recomputation planner, yes; without recomputation, no."""
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1}}
    keep = mt.plan(LLAMA_2_7B, seq=4096, lora_rank=8, device_memory="24GiB", config=config)
    assert keep["fits"] is False
    fit = mt.plan(LLAMA_2_7B, seq=4096, lora_rank=8, device_memory="24GiB",
                  config={**config, "activation_checkpointing": {"planner": "optimal"}})
    assert fit["fits"] is True and fit["fits_text"] == "yes"
    assert fit["parameters"] == 6_742_609_920
    at_peak = fit["device"]["at_peak"]
    # Only the adapters train: bf16 gradients, f32 master weights and Adam
    # moments (12 bytes) for peft's 4,194,304 parameters.
    assert at_peak["gradient"] == 4_194_304 * 2
    assert at_peak["optimizer_state"] == 4_194_304 * 12
    assert fit["device"]["needed"] <= 24 * 2**30


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_plan_holds_what_a_real_front_end_step_holds(stage, tmp_path):
    """Issue 17's validation: a small Llama traced on meta and dry-run holds
    the parameters, gradients and optimizer states a real ZeroOptimizer
    step of the same model holds on the host backend (the allocator's
    peaks, byte for byte), and its description keeps the activations the
    front end counts from autograd's saved tensors."""
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    with torch.device("meta"):
        meta = small("llama")

    def make(batch):
        ids = torch.zeros(batch, 16, dtype=torch.long, device="meta")
        return {"input_ids": ids, "labels": ids}
    d = tracing.describe(meta, make, attention="math", batches=(2, 3))
    r = mt.plan(d, batch=2, config=config, device_memory="1GiB", hardware="this-machine")
    model = small("llama")
    opt = mt.ZeroOptimizer(model, None, config)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with mt.profile(opt, tmp_path):
        loss = model(ids, labels=ids).loss
        # What autograd saved, as the profiler counts it, when backward starts.
        saved = sum(b for _, category, b in opt.engine.owners() if category == "activation")
        opt.backward(loss)
        opt.step()
    memory = opt.engine.memory()
    for category in ("parameter", "gradient", "optimizer_state"):
        assert r["device"]["category_peaks"][category] == memory[category]["peak"], category

    def at(figure, b=2):
        return figure[0] + b * figure[1]
    stages = d["stages"]
    held = sum(at(s["kept"]) for s in stages) + sum(
        at(a["output"]) for a, b in zip(stages, stages[1:]) if b["reads_input"])
    assert held + at(d["inputs_saved"]) == saved


def test_the_cli_plans_a_hugging_face_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_2_7B, "num_hidden_layers": 2}))
    cli = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
    env = {**os.environ, "MEMWALL_PYTHON": sys.executable}
    out = subprocess.run([cli, "plan", "--model", "hf:%s" % tmp_path, "--seq", "512", "--json",
                          "--device_memory", "80GiB"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    published = 6_738_415_616 - 30 * 202_383_360  # Llama-2-7B less 30 of its 32 layers
    assert report["parameters"] == published and report["fits"] is True
    # The built-in config trains in f32: torch would run the efficient kernel.
    assert report["traced"] == {"class": "LlamaForCausalLM", "dtype": "f32",
                                "attention": "efficient"}
    described = tmp_path / "described.json"
    # Traced as the CLI traces: at the planned micro-batch and the next.
    described.write_text(json.dumps(hf.describe(path, seq=512, batch=report["micro_batch"])))
    again = subprocess.run([cli, "plan", "--model", "traced:%s" % described, "--json",
                            "--device_memory", "80GiB"], capture_output=True, text=True)
    assert json.loads(again.stdout)["device"] == report["device"]
    other = subprocess.run([cli, "plan", "--model", "traced:%s" % described, "--seq", "256"],
                           capture_output=True, text=True)
    assert other.returncode != 0
    assert ("--seq 256: traced:%s was traced at sequence 512; trace it again at 256"
            % described) in other.stderr
    bad = subprocess.run([cli, "plan", "--model", "hf:%s/none" % tmp_path], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.splitlines()[-1] == (
        "memwall: INVALID_ARGUMENT: --model hf:%s/none: %s/none: no such config.json (expected a "
        "config file or a directory holding config.json)" % (tmp_path, tmp_path))


def test_a_sequence_past_learned_positions_is_refused(tmp_path):
    """GPT-2 and BERT learn a table of positions: a longer sequence cannot
    run, so it is not planned (on meta the lookup past the table raises
    nothing); rotary models (Llama) have no table."""
    for name, cls, limit in [("gpt2", "GPT2LMHeadModel", 1024), ("bert-large", "BertForMaskedLM", 512)]:
        model = hf.build(os.path.join(ROOT, "configs", "hf", "%s.json" % name))
        assert hf.learned_positions(model) == limit
        hf.inputs_for(model, limit)  # the longest it runs
        with pytest.raises(ValueError) as error:
            hf.inputs_for(model, limit + 1)
        assert str(error.value) == (
            "seq %d: %s learns %d positions (its position embedding's rows); expected a sequence "
            "of at most %d" % (limit + 1, cls, limit, limit))
    llama = hf.build({**LLAMA_2_7B, "num_hidden_layers": 1})
    assert hf.learned_positions(llama) is None
    cli = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
    env = {**os.environ, "MEMWALL_PYTHON": sys.executable}
    out = subprocess.run([cli, "plan", "--model", "hf:configs/hf/gpt2.json", "--seq", "4096"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        "memwall: INVALID_ARGUMENT: --model hf:configs/hf/gpt2.json: seq 4096: GPT2LMHeadModel "
        "learns 1024 positions (its position embedding's rows); expected a sequence of at most "
        "1024")


def test_a_config_deeper_than_any_model_is_refused_before_tracing():
    with pytest.raises(ValueError) as error:
        hf.build({**LLAMA_2_7B, "num_hidden_layers": 100000})
    assert str(error.value) == (
        "config: num_hidden_layers 100000; expected at most 4096 layers (the deepest published "
        "models have a few hundred)")


def test_a_failed_trace_says_why(tmp_path):
    """The tracer's own error, not a wait status: a config transformers
    cannot build, and a Python without the front end."""
    cli = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps({**LLAMA_2_7B, "hidden_size": 0}))
    env = {**os.environ, "MEMWALL_PYTHON": sys.executable}
    out = subprocess.run([cli, "plan", "--model", "hf:%s" % zero, "--seq", "16"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 1
    # transformers' own words follow its exception's name.
    assert out.stderr.splitlines()[-1].startswith(
        "memwall: INVALID_ARGUMENT: --model hf:%s: %s: transformers cannot build "
        "LlamaForCausalLM from this config (ZeroDivisionError: " % (zero, zero))
    bare = subprocess.run([cli, "plan", "--model", "hf:%s" % zero],
                          env={**os.environ, "MEMWALL_PYTHON": "/usr/bin/python3"},
                          capture_output=True, text=True)
    assert bare.stderr.splitlines()[-1] == (
        "memwall: FAILED_PRECONDITION: --model hf:%s: /usr/bin/python3 -m memwall.hf exited with 1 "
        "(/usr/bin/python3: Error while finding module specification for 'memwall.hf' "
        "(ModuleNotFoundError: No module named 'memwall')); tracing a Hugging Face model needs "
        "the Python front end with torch and transformers: run tools/python_env.sh and set "
        "MEMWALL_PYTHON=.venv/bin/python" % zero)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_chain_traced_on_meta_is_the_chain_of_a_real_cpu_step(kind):
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.device("meta"):
        meta_model = small(kind)
    meta = tracing.trace(meta_model, {"input_ids": ids.to("meta"), "labels": ids.to("meta")})
    cpu = tracing.trace(small(kind), {"input_ids": ids, "labels": ids})

    def chain(t):
        return [(s.name, s.kept, s.output, s.workspace, s.backward_workspace, s.input_grad,
                 s.reads_input, s.forward_flops) for s in t.stages]
    assert chain(meta) == chain(cpu)
    assert any(s.workspace > 0 for s in meta.stages)
    assert any(s.backward_workspace > 0 for s in meta.stages)


class _Doubling(torch.nn.Module):
    """x -> a = 2x, b = a + 1 (a dropped), c = b * w: b is saved (w's
    gradient), a is a transient beside b."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(256))

    def forward(self, x):
        a = x * 2
        b = a + 1
        del a
        return b * self.w


def test_a_stage_s_workspace_is_its_transient_peak_above_what_it_keeps():
    model = torch.nn.Sequential(_Doubling(), _Doubling())
    x = torch.ones(4, 256, requires_grad=True)  # 4 KiB per [4, 256] f32 tensor
    first, second = tracing.trace(model, (x,)).stages
    # First: a and b live together (8 KiB), then b and c: what it keeps (b)
    # and hands on (c) -- no transient beyond them.
    assert (first.kept, first.output, first.workspace) == (4096, 4096, 0)
    # Second: a and b (8 KiB) above its start; it keeps b and hands on the
    # 4-byte loss; its own output c is summed into the loss and dropped.
    assert (second.kept, second.output, second.workspace) == (4096, 4, 8192 - 4096 - 4)
    assert second.reads_input is False  # 2x does not save x


def test_a_torchvision_resnet_plans_with_its_published_count():
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        model = torchvision.models.resnet50()
    # torchvision's documented parameter count for ResNet-50.
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    r = mt.plan(model, inputs=lambda b: (torch.zeros(b, 3, 224, 224, device="meta"),), batch=8,
                config={"train_micro_batch_size_per_gpu": 8}, device_memory="16GiB")
    assert r["parameters"] == 25_557_032 and r["fits"] is True
    # Planning bf16 LoRA of it leaves the caller's model as it was.
    mt.plan(model, inputs=lambda b: (torch.zeros(b, 3, 224, 224, device="meta",
                                                 dtype=torch.bfloat16),),
            config={"bf16": {"enabled": True}}, lora_rank=4, lora_targets=("fc",))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert isinstance(model.fc, torch.nn.Linear) and model.fc.weight.requires_grad


def test_a_resnet_s_chain_on_meta_is_that_of_a_real_cpu_step():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    cpu_model = torchvision.models.resnet18(num_classes=10)
    with torch.device("meta"):
        meta_model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(2, 3, 64, 64)
    meta = tracing.trace(meta_model, (x.to("meta"),))
    cpu = tracing.trace(cpu_model, (x,))

    def chain(t):
        return [(s.name, s.kept, s.output, s.workspace, s.backward_workspace, s.input_grad,
                 s.reads_input, s.forward_flops) for s in t.stages]
    assert chain(meta) == chain(cpu)
    assert [s.name for s in meta.stages][:4] == ["conv1", "bn1", "layer1.0", "layer1.1"]


def test_mixtral_s_routed_experts_are_traced_on_meta():
    """Mixtral's experts (transformers' grouped-matrix-product path) run on
    meta with their routed rows: the layer's FLOPs equal those torch's
    flop counter finds in a real CPU step of the eager expert loop (every
    token through its top-2 experts), and its saved bytes are within 1%
    of that step's (the two paths keep different index tensors)."""
    with open(os.path.join(CONFIGS, "mixtral-8x7b.json")) as f:
        config = json.load(f)
    config.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                  max_position_embeddings=64)
    meta_model = hf.build(config, "f32")
    meta_ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    meta = tracing.trace(meta_model, {"input_ids": meta_ids, "labels": meta_ids})
    torch.manual_seed(0)
    eager = transformers.MixtralForCausalLM(hf._config({**config,
                                                         "experts_implementation": "eager"}))
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    cpu = tracing.trace(eager, {"input_ids": ids, "labels": ids})
    layer, reference = meta.stage("model.layers.0"), cpu.stage("model.layers.0")
    attention = 2 * 32 * (64 * 64 * 2 + 64 * 32 * 2) + 4 * 2 * 4 * 16 * 16 * 16
    experts = 2 * 32 * 2 * (64 * 256 + 128 * 64)  # 32 tokens x top-2, gate_up and down
    router = 2 * 32 * 64 * 8
    assert layer.forward_flops == reference.forward_flops == attention + experts + router
    assert abs(layer.kept - reference.kept) <= 0.01 * reference.kept
