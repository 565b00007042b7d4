"""memwall.torch on the device torch computes on: a GPU where torch has one
(backend "cuda": the parameters are views of memwall's device memory, the
engine on torch's current stream), else the CPU (backend "host"), the
same tests on the same code path; MEMWALL_TEST_DEVICE=cpu|cuda forces one.
tools/gpu_bundle.sh runs this file on the lent GPU (with the figures of
benchmarks/torch_cuda.py); CI runs it on the CPU.

References are torch's: torch.optim.AdamW on a copy of the model, and
torch.cuda.max_memory_allocated for the memory torch itself holds.

Tolerances: f32, 4 steps at lr 1e-2: every master weight within 1e-5 of
AdamW's (the update divides as torch does; the gradients are the same
kernels' on both sides, summed into memwall's buffer in another order at
most); bf16 parameters with f32 master weights against AdamW in f32: within
2 x lr x steps (Adam's normalised step may flip sign where bf16 gradients
are tiny). Offload against on-device: bit for bit.
"""
import copy
import os

import pytest
import torch

import memwall.torch as mt

DEVICE = os.environ.get("MEMWALL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available()
                                                   else "cpu")
BACKEND = "cuda" if DEVICE == "cuda" else "host"
ON_GPU = pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU (torch sees none)")


def device():
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" \
        else torch.device("cpu")


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 4)).to(device())


def batches(n, size=32):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(size, 16, generator=g).to(device()),
             torch.randn(size, 4, generator=g).to(device())) for _ in range(n)]


def config(stage, dtype="f32", **zero):
    c = {"zero_optimization": dict(stage=stage, **zero),
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def train(model, opt, data):
    """A plain torch loop (inputs in the parameters' dtype); its losses."""
    losses = []
    dtype = next(model.parameters()).dtype
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_matches_torch_adamw(stage, dtype):
    model = mlp()
    reference = copy.deepcopy(model)
    opt = mt.ZeroOptimizer(model, None, config(stage, dtype), backend=BACKEND)
    assert opt.engine.device == ("cuda:%d" % device().index if DEVICE == "cuda" else "host:0")
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    data = batches(4)
    losses = train(model, opt, data)
    ref_losses = train(reference, ref_opt, data)
    steps = len(data)
    if dtype == "f32":
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        tolerance = 1e-5
    else:
        assert losses == pytest.approx(ref_losses, rel=2e-2)
        tolerance = 2 * 1e-2 * steps
    for name, p in reference.named_parameters():
        master = opt.master_weights(name)
        assert master.device == p.device
        worst = (master - p.detach()).abs().max().item()
        assert worst <= tolerance, (name, worst)
    # The allocator's peak of the sum lies between the largest category's
    # peak and the per-category peaks added up.
    peaks = [v["peak"] for c, v in opt.memory().items() if c != "pinned"]
    assert max(peaks) <= opt.engine.requested_peak <= sum(peaks)
    if stage != 3:  # the parameters torch computes with are the engine's memory, on its device
        for p in model.parameters():
            assert p.device == device() and p.dtype == (torch.bfloat16 if dtype == "bf16"
                                                        else torch.float32)


def tiny_gpt2():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    with device():
        return transformers.GPT2LMHeadModel(cfg)


def param_groups(m):
    decay = [p for p in m.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in m.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_gpt2_loop_with_everything_a_loop_uses(stage, tmp_path):
    """The host tests' loop on this device: a transformers GPT-2 (the tied
    wte / lm_head), its position embedding frozen, two param_groups (no
    decay for biases and norms), a LambdaLR warmup, 2 micro-batches of
    accumulation and clipping at 1.0, against torch's AdamW on a copy (f32;
    weights within 2e-5, as the host test allows); a checkpoint after 2 of 4
    steps, loaded by a fresh optimizer that trains the last 2, ends on the
    uninterrupted run's weights bit for bit."""
    def warmup(step):
        return min(1.0, (step + 1) / 3)

    zero = {"zero_optimization": {"stage": stage, "reduce_bucket_size": 2048},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
            "gradient_accumulation_steps": 2, "gradient_clipping": 1.0}
    g = torch.Generator().manual_seed(1)
    data = [[torch.randint(0, 96, (8, 16), generator=g).to(device()) for _ in range(2)]
            for _ in range(4)]

    def run(steps, resume=None, save=None):
        model = tiny_gpt2()
        model.transformer.wpe.weight.requires_grad_(False)
        opt = mt.ZeroOptimizer(model, param_groups(model), zero, backend=BACKEND)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
        start = opt.load_checkpoint(resume)["steps"] if resume else 0
        for _ in range(start):
            schedule.step()
        for step in steps:
            for tokens in data[step]:
                opt.backward(model(tokens, labels=tokens).loss)
            opt.step()
            schedule.step()
            if save is not None and step == 1:
                opt.save_checkpoint(save)
        return opt, {n: opt.master_weights(n) for n, _ in model.named_parameters()}

    opt, weights = run(range(4), save=tmp_path / "ckpt")
    reference = tiny_gpt2()
    reference.transformer.wpe.weight.requires_grad_(False)
    ref_opt = torch.optim.AdamW(param_groups(reference), lr=3e-3, betas=(0.9, 0.95))
    ref_schedule = torch.optim.lr_scheduler.LambdaLR(ref_opt, warmup)
    for step in range(4):
        for tokens in data[step]:
            (reference(tokens, labels=tokens).loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_opt.step()
        ref_opt.zero_grad()
        ref_schedule.step()
    names = [n for g in opt.engine.groups() for n in g["parameters"]]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names  # tied
    for name, p in reference.named_parameters():
        worst = (weights[name] - p.detach()).abs().max().item()
        assert worst <= 2e-5, (name, worst)
    del opt
    _, resumed = run(range(2, 4), resume=tmp_path / "ckpt")
    for name in weights:
        assert torch.equal(resumed[name], weights[name]), name


def test_fp16_scales_the_loss_and_skips_an_overflowing_step():
    """fp16 parameters with the dynamic loss scale: opt.backward(loss)
    scales by opt.loss_scale, the step unscales; the master weights stay
    within 2 x lr x steps of torch's AdamW in f32 (Adam's normalised step
    where fp16 gradients are tiny), and a step with inf gradients is
    skipped with the scale halved and the weights untouched."""
    model = mlp()
    reference = copy.deepcopy(model)
    c = config(2)
    c["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    opt = mt.ZeroOptimizer(model, None, c, backend=BACKEND)
    assert opt.loss_scale == 256.0
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    data = batches(3)
    for x, y in data:
        opt.backward(torch.nn.functional.mse_loss(model(x.half()).float(), y))
        opt.step()
        assert opt.last_step["applied"]
        opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for name, p in reference.named_parameters():
        assert (opt.master_weights(name) - p.detach()).abs().max().item() <= 2 * 1e-2 * 3, name
    before = {n: opt.master_weights(n) for n, _ in model.named_parameters()}
    x, y = data[0]
    opt.backward(torch.nn.functional.mse_loss(model(x.half()).float(), y) * float("inf"))
    opt.step()
    assert not opt.last_step["applied"]
    assert opt.loss_scale == 128.0
    for n, _ in model.named_parameters():
        assert torch.equal(opt.master_weights(n), before[n]), n


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_half_precision_model_is_taken_as_it_is(dtype):
    """A model already in bf16 (or f16) under the matching config: the
    engine reads its initial values in that dtype and widens them exactly,
    so its master weights are torch's .float() of the values, bit for bit,
    and training starts from them."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    model = mlp().to(torch_dtype)
    want = {n: p.detach().float().cpu() for n, p in model.named_parameters()}
    c = config(2, "bf16" if dtype == "bf16" else "f32")
    if dtype == "f16":
        c["fp16"] = {"enabled": True}
    opt = mt.ZeroOptimizer(model, None, c, backend=BACKEND)
    for name, values in want.items():
        assert torch.equal(opt.master_weights(name).cpu(), values), name
    for name, p in model.named_parameters():
        assert p.dtype == torch_dtype and torch.equal(p.detach().float().cpu(), want[name]), name


OFFLOADS = {
    "pinned": {"offload_optimizer": {"device": "cpu"}},
    "pinned, overlapped": {"offload_optimizer": {"device": "cpu", "overlap_step": True},
                           "reduce_bucket_size": 2000},
    "nvme": {"offload_optimizer": {"device": "nvme"}},
    "nvme, parameters too": {"offload_optimizer": {"device": "nvme"},
                             "offload_param": {"device": "nvme"}},
}


@pytest.mark.parametrize("where", sorted(OFFLOADS))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_offload_is_on_device_bit_for_bit(where, dtype, tmp_path):
    """The update on the CPU (pinned host memory, or paged through NVMe
    files), overlapped with backward or not, gives the bits the update on
    the device gives: the same losses and master weights, exactly."""
    zero = copy.deepcopy(OFFLOADS[where])
    stage = 3 if "offload_param" in zero else 2
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key, {}).get("device") == "nvme":
            zero[key]["nvme_path"] = str(tmp_path)
    data = batches(4)
    results = []
    for zero_config in ({}, zero):
        model = mlp()
        opt = mt.ZeroOptimizer(model, None, config(stage, dtype, **zero_config),
                               backend=BACKEND)
        losses = train(model, opt, data)
        masters = {n: opt.master_weights(n) for n, _ in model.named_parameters()}
        results.append((losses, masters))
        del opt
    (losses, masters), (off_losses, off_masters) = results
    assert off_losses == losses
    for name in masters:
        assert torch.equal(off_masters[name], masters[name]), name


def test_state_dict_is_on_the_parameters_device_and_loads_into_torch_adamw():
    """opt.state_dict() in torch's format with its tensors where torch's
    AdamW keeps them (on the parameter's device); torch's AdamW loads it and
    takes the same next step as memwall."""
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, config(2), backend=BACKEND)
    data = batches(3)
    train(model, opt, data[:2])
    saved = opt.state_dict()
    for entry in saved["state"].values():
        assert entry["exp_avg"].device == device() and entry["exp_avg_sq"].device == device()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    ref_opt.load_state_dict(saved)
    train(model, opt, data[2:])
    train(reference, ref_opt, data[2:])
    for name, p in reference.named_parameters():
        assert (opt.master_weights(name) - p.detach()).abs().max().item() <= 1e-5, name


@ON_GPU
@pytest.mark.parametrize("stage", [2, 3])
def test_a_side_stream_is_ordered_with_the_engines(stage):
    """The engine computes on the stream current when the optimizer was
    made (here the default stream). Training inside `with
    torch.cuda.stream(side):` while that stream is held up by a 50 ms sleep
    before each forward and each step: the side stream's kernels must
    wait for the gathers and the update (events), or they would read
    parameters not yet gathered or not yet updated. Same losses and
    weights as training on the default stream, bit for bit."""
    data = batches(4, size=256)
    results = []
    for side in (False, True):
        model = mlp()
        opt = mt.ZeroOptimizer(model, None, config(stage), backend=BACKEND)
        engine_stream = torch.cuda.current_stream()
        losses = []
        stream = torch.cuda.Stream() if side else engine_stream
        with torch.cuda.stream(stream):
            for x, y in data:
                x, y = x.clone(), y.clone()  # made on this stream
                if side:
                    with torch.cuda.stream(engine_stream):
                        torch.cuda._sleep(100_000_000)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                if side:
                    with torch.cuda.stream(engine_stream):
                        torch.cuda._sleep(100_000_000)
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        torch.cuda.synchronize()
        results.append((losses, {n: opt.master_weights(n) for n, _ in model.named_parameters()}))
    assert results[1][0] == results[0][0]
    for name in results[0][1]:
        assert torch.equal(results[1][1][name], results[0][1][name]), name


@ON_GPU
def test_profile_peak_against_torchs_own_count(tmp_path):
    """memwall.torch.profile on a GPU run: the engine's exact books (its
    allocator: parameters, gradients, optimizer states, buffers) plus the
    activations autograd saved. torch.cuda.max_memory_allocated counts
    torch's allocator only (activations, their gradients, workspace; the
    engine's memory is not torch's), so the profile's peak lies between
    the engine's own peak and the two peaks' sum; the activations it saw
    are at most what torch allocated. The figures are printed for
    benchmarks/RESULTS.md."""
    torch.manual_seed(0)
    import transformers
    cfg = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=4096,
                                  n_positions=256)
    with device():
        model = transformers.GPT2LMHeadModel(cfg)
    opt = mt.ZeroOptimizer(model, None, config(2, "bf16"), backend=BACKEND)
    ids = torch.randint(0, 4096, (8, 256), device=device())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with mt.profile(opt, tmp_path) as profile:
        for _ in range(2):
            opt.backward(model(ids, labels=ids).loss)
            opt.step()
            opt.zero_grad()
    torch.cuda.synchronize()
    torch_peak = torch.cuda.max_memory_allocated() - base
    peak = profile.peak()
    engine_peak = opt.engine.requested_peak  # the allocator's own peak of the sum
    activations = peak["by_category"]["activation"]
    print("profile peak %d B (%s; activations %d B), engine allocator peak %d B, torch "
          "max_memory_allocated above the start %d B" % (
              peak["bytes"], peak["phase"], activations, engine_peak, torch_peak))
    assert activations > 0
    assert activations <= torch_peak
    assert engine_peak <= peak["bytes"] <= engine_peak + torch_peak
    assert (tmp_path / "rank0" / "profile.json").exists()


# Three Hugging Face models that fit the GPU: GPT-2 124M (its published
# size), a Llama-shaped 1.1B and a small Mixtral.
HF_MODELS = {
    "gpt2-124m": ("GPT2Config", dict(n_positions=1024)),
    "llama-1.1b": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=5632,
                                       num_hidden_layers=22, num_attention_heads=32,
                                       num_key_value_heads=4, vocab_size=32000,
                                       max_position_embeddings=2048)),
    "mixtral-small": ("MixtralConfig", dict(hidden_size=512, intermediate_size=1408,
                                            num_hidden_layers=4, num_attention_heads=8,
                                            num_key_value_heads=8, num_local_experts=8,
                                            num_experts_per_tok=2, vocab_size=32000)),
}


@ON_GPU
@pytest.mark.parametrize("name", sorted(HF_MODELS))
def test_plan_against_a_measured_step(name):
    """memwall.torch.plan's device peak for a training step against the
    step measured through ZeroOptimizer on the GPU (stage 2, bf16, batch 4
    x 512 tokens): the engine allocator's peak plus torch's
    max_memory_allocated above the model's start, with the attention
    kernel torch picked (SDPA). Within 25%, and the figures printed."""
    import transformers
    kind, kwargs = HF_MODELS[name]
    cfg = getattr(transformers, kind)(**kwargs)
    cfg._attn_implementation = "sdpa"
    batch, seq = 4, 512
    zero = config(2, "bf16")
    planned = mt.plan(cfg, seq=seq, batch=batch, config=zero, device_memory="80GiB")
    torch.manual_seed(0)
    with device():  # initialised on the GPU: a 1.1B model is slow to draw on the CPU
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    opt = mt.ZeroOptimizer(model, None, zero, backend=BACKEND, device_memory="60GiB")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(2):
        opt.backward(model(input_ids=ids, labels=ids).loss)
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    measured = opt.engine.requested_peak + torch.cuda.max_memory_allocated() - base
    predicted = planned["device"]["requested_peak"]  # bytes asked of the allocator
    print("%s: planned %d B, measured %d B (engine + torch), ratio %.3f" % (
        name, predicted, measured, predicted / measured))
    assert abs(predicted / measured - 1) <= 0.25


@ON_GPU
@pytest.mark.parametrize("stage", [2, 3])
def test_a_model_handed_over_on_the_cpu_trains_on_the_gpu(stage):
    """backend "cuda" with a model built on the CPU (as a model too large to
    sit on the GPU beside its states is built): memwall puts its
    parameters into the engine's memory on memwall.torch.device() and its
    buffers there too; it trains to the same bits as the same model built
    on the GPU."""
    import transformers
    results = []
    for on_gpu in (True, False):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
        if on_gpu:
            model = model.to(mt.device())
        assert mt.device() == torch.device("cuda", 0)  # rank 0 of 1
        opt = mt.ZeroOptimizer(model, None, config(stage), backend=BACKEND)
        assert opt.engine.device == str(mt.device())
        assert all(b.device == mt.device() for b in model.buffers())
        if stage != 3:
            assert all(p.device == mt.device() for p in model.parameters())
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3):
            tokens = torch.randint(0, 96, (4, 16), generator=g).to(mt.device())
            loss = model(tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        results.append((losses, {n: opt.master_weights(n) for n, _ in model.named_parameters()}))
    assert results[1][0] == results[0][0]
    for name in results[0][1]:
        assert torch.equal(results[1][1][name], results[0][1][name]), name
