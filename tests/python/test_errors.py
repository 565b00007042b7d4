"""Bad use of memwall.torch gets an error that names the cause, and leaves
the model as it was."""
import re

import pytest
import torch

import memwall
import memwall.torch as mt


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_parameter_not_given_to_the_optimizer():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, model[0].parameters(), {})
    assert str(error.value) == (
        "parameter '2.weight' of the model requires grad but was not given to the optimizer; "
        "pass it in a param_group, or freeze it (requires_grad=False)")
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)


def test_a_parameter_that_is_not_the_models():
    model, other = mlp(), torch.nn.Linear(3, 5)
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, list(model.parameters()) + [other.weight], {})
    assert str(error.value) == (
        "param_groups[0]: a parameter of shape (5, 3) is not a parameter of the model")


@pytest.mark.parametrize("stage", [0, 3])
def test_a_model_changed_after_wrapping(stage):
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": stage}})
    model.add_module("extra", torch.nn.Linear(2, 2))
    with pytest.raises(memwall.Error) as error:
        opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: the model changed after wrapping: parameter 'extra.weight' is "
        "new; build the ZeroOptimizer after the model is final")


def test_a_model_moved_out_of_memwalls_memory():
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 1}})
    model[0].weight.data = model[0].weight.data.clone()
    with pytest.raises(memwall.Error) as error:
        opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: the model changed after wrapping: parameter '0.weight' no longer "
        "lies in memwall's memory (was the model moved or cast?)")


@pytest.mark.parametrize("config, message", [
    ({"activation_checkpointing": {"planner": "optimal", "offload": True}},
     "activation_checkpointing.offload (or cpu_checkpointing): memwall.torch's activations are "
     "CPU tensors already, with no device memory to offload them from; set it false "
     "(recomputation alone is planned and applied)"),
    ({"activation_checkpointing": {"planner": "selective"}},
     "activation_checkpointing.planner \"selective\": memwall.torch recomputes whole blocks, and "
     "a traced block offers no selective mode (its attention alone); use full, uniform:K, sqrt "
     "or optimal"),
    ({"zero_optimization": {"stage": "auto"}},
     "zero_optimization.stage \"auto\": memwall chooses by tracing the model and dry-running "
     "each configuration; pass ZeroOptimizer(..., example_inputs=...): one batch as the model's "
     "forward takes it (a dict of keyword arguments, a tuple of positional ones, or one tensor)"),
    ({"zero_optimization": {"stage": 0, "mics_shard_size": 2}},
     "INVALID_ARGUMENT: zero_optimization.mics_shard_size: expected stage 1, 2 or 3 with it (it "
     "shards the states inside groups of ranks), got stage 0"),
    ({"zero_optimization": {"stagee": 1}},
     "INVALID_ARGUMENT: zero_optimization.stagee: unknown key (known here: "
     "allgather_bucket_size, allgather_partitions, contiguous_gradients, mics_shard_size, "
     "offload_optimizer, "
     "offload_param, overlap_comm, reduce_bucket_size, reduce_scatter, stage, "
     "stage3_gather_16bit_weights_on_model_save, stage3_gather_on_use, "
     "stage3_max_live_parameters, stage3_max_reuse_distance, "
     "stage3_param_persistence_threshold, stage3_prefetch_bucket_size, sub_group_size, "
     "zero_hpz_partition_size, zero_quantization_block_size, zero_quantized_gradients, "
     "zero_quantized_weights)"),
])
def test_a_config_it_cannot_honour(config, message):
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, None, config)
    assert str(error.value) == message
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)


def test_backward_passes_that_do_not_match_the_accumulation():
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"gradient_accumulation_steps": 2})
    for _ in range(3):
        opt.backward(model(torch.ones(1, 4)).sum())
    with pytest.raises(memwall.Error) as error:
        opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: step(): 3 backward passes since the last step; the config's "
        "gradient_accumulation_steps is 2")


def test_a_hyperparameter_the_update_refuses():
    model = mlp()
    before = model[0].weight.data_ptr()
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, [{"params": model.parameters(), "betas": (0.9, 1.5)}], {})
    assert str(error.value) == "param_groups[0]: adam beta2: expected 0 <= beta2 < 1, got 1.5"
    assert model[0].weight.data_ptr() == before  # still torch's own memory
    opt = mt.ZeroOptimizer(model, None, {})
    opt.param_groups[0]["lr"] = -1.0  # as a broken schedule would
    with pytest.raises(ValueError) as error:  # sent before the step's first gradient
        opt.backward(model(torch.ones(2, 4)).sum())
        opt.step()
    assert str(error.value) == "param_groups[0]: adam lr: expected a finite value >= 0, got -1"


def test_a_backend_that_does_not_take_the_models_device():
    model = mlp()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError) as error:
            mt.ZeroOptimizer(model, None, {}, backend="cuda")
        assert str(error.value) == (
            'backend "cuda" trains on a GPU, and torch sees none (torch.cuda.is_available() '
            "is False)")
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, None, {}, backend="meta")
    assert str(error.value) == (
        'backend: expected "host" (a model on the CPU) or "cuda" (a model on one GPU), '
        "got 'meta'")
    # A model on torch's meta device is on no device the host backend has.
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(mlp().to("meta"), None, {})
    assert str(error.value) == (
        'backend "host" trains a model on the CPU; got parameters on meta '
        '(backend="cuda" trains a model on one GPU)')


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_device_without_a_gpu_is_the_cpu():
    assert mt.device() == torch.device("cpu")
    # The engine's rule, which device() takes on a GPU, says why it has none.
    with pytest.raises(memwall.Error) as error:
        memwall._memwall.cuda_ordinal(0)
    assert str(error.value) == "UNAVAILABLE: --backend cuda: no usable GPU on this machine"


def test_a_stage3_parameter_read_outside_its_module():
    """Stage 3 gathers a module's parameters around its own forward; a
    parent reading a child's weight directly would compute with the
    released placeholder: the saved-tensor hook refuses it by name."""

    class Parent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(4, 4)
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.nn.functional.linear(self.first(x), self.inner.weight)

    torch.manual_seed(0)
    model = Parent()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 3}})
    with pytest.raises(memwall.Error) as error:
        model(torch.ones(2, 4))
    assert str(error.value) == (
        "FAILED_PRECONDITION: parameter 'inner.weight' was used while released: stage 3 "
        "gathers a module's parameters only around that module's own forward, and this one was "
        "read outside it (a parent reading child.weight?); call it through its module")
    del opt


def test_a_float64_model_is_refused_at_construction():
    model = mlp().double()
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, None, {})
    assert str(error.value) == (
        "parameter '0.weight' is torch.float64; memwall keeps f32 master weights and computes in "
        "f32 or the config's bf16/fp16: convert the model first (model.float())")
    assert model[0].weight.dtype == torch.float64  # untouched


def test_a_profile_directory_that_is_a_file_fails_on_entering(tmp_path):
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {})
    path = tmp_path / "a-file"
    path.write_text("x")
    with pytest.raises(NotADirectoryError) as error:
        with mt.profile(opt, path):
            raise AssertionError("the block ran")
    assert str(error.value) == "profile directory %s: not a directory" % path
    with mt.profile(opt, tmp_path / "reports"):  # a good one still profiles
        opt.backward(model(torch.ones(2, 4)).sum())
        opt.step()
    assert (tmp_path / "reports" / "rank0" / "profile.json").is_file()


def test_engine_errors_are_the_python_exceptions_their_codes_mean(tmp_path):
    """An engine error is a memwall.Error and, by its status code, the
    exception Python code catches (STYLE.md): a bad config a ValueError, a
    missing checkpoint a FileNotFoundError, memory the device cannot give a
    MemoryError; the message is the command's text."""
    with pytest.raises(ValueError) as bad:
        mt.ZeroOptimizer(mlp(), None, {"zero_optimization": {"stage": 9}})
    assert isinstance(bad.value, memwall.Error)
    assert type(bad.value) is memwall.InvalidArgumentError
    assert str(bad.value).startswith("INVALID_ARGUMENT: zero_optimization.stage: ")
    opt = mt.ZeroOptimizer(mlp(), None, {})
    with pytest.raises(FileNotFoundError) as missing:
        opt.load_checkpoint(str(tmp_path / "none"))
    assert isinstance(missing.value, memwall.NotFoundError)
    assert str(missing.value) == "NOT_FOUND: checkpoint %s: no such directory" % (tmp_path / "none")
    with pytest.raises(MemoryError) as full:
        mt.ZeroOptimizer(torch.nn.Linear(1024, 1024), None, {}, device_memory="1MiB")
    assert isinstance(full.value, memwall.OutOfMemoryError)
    assert str(full.value).startswith(
        "RESOURCE_EXHAUSTED: out of memory on host:0: cannot allocate 4.00 MiB (4198400 bytes) "
        "of parameter for '<model>'")
    # Codes with no Python counterpart stay memwall.Error (a RuntimeError).
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 1}})
    model.add_module("extra", torch.nn.Linear(2, 2))
    with pytest.raises(memwall.Error) as state:
        opt.step()
    assert type(state.value) is memwall.Error and isinstance(state.value, RuntimeError)


def test_master_weights_of_a_name_the_model_lacks():
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {})
    with pytest.raises(FileNotFoundError) as error:
        opt.master_weights("3.weight")
    assert isinstance(error.value, memwall.NotFoundError)
    assert str(error.value) == "NOT_FOUND: parameter '3.weight': not registered"


def test_gathered_parameters_refused_mid_step_and_nested():
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 3},
                                         "gradient_accumulation_steps": 2})
    opt.backward(model(torch.ones(2, 4)).sum())
    with pytest.raises(memwall.Error) as error:
        with opt.gathered_parameters():
            pass
    assert str(error.value) == (
        "FAILED_PRECONDITION: gathered_parameters(): a step is in progress (1 backward passes "
        "since the last step); enter it between steps")
    opt.backward(model(torch.ones(2, 4)).sum())
    opt.step()
    with opt.gathered_parameters():
        with pytest.raises(memwall.Error) as error:
            with opt.gathered_parameters():
                pass
        assert str(error.value) == "FAILED_PRECONDITION: gathered_parameters(): already inside one"
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, w in weights.items():
        assert torch.equal(w, opt.master_weights(name)), name


@pytest.mark.parametrize("options,config,message", [
    ({"maximize": True}, {}, "param_groups[0]: maximize=True is not implemented by memwall's "
                             "update (only False is)"),
    ({"amsgrad": True}, {}, "param_groups[0]: amsgrad=True is not implemented by memwall's "
                            "update (only False is)"),
    ({"nesterov": True, "momentum": 0.9}, {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
     "param_groups[0]: nesterov=True is not implemented by memwall's update (only False is)"),
    ({"dampening": 0.1}, {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
     "param_groups[0]: dampening=0.1 is not implemented by memwall's update (only 0 is)"),
    ({"lr_decay": 0.5}, {}, "param_groups[0]: unknown option 'lr_decay'; memwall's update takes "
                            "lr, betas, eps, weight_decay and momentum"),
])
def test_a_param_group_option_the_update_does_not_implement(options, config, message):
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, [{"params": list(model.parameters()), **options}], config)
    assert str(error.value) == message
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)


def test_torch_defaults_and_kernel_choices_are_accepted_and_add_param_group_refused():
    model = mlp()
    opt = mt.ZeroOptimizer(model, [{"params": list(model.parameters()), "maximize": False,
                                    "amsgrad": False, "foreach": True, "fused": None}], {})
    with pytest.raises(memwall.Error) as error:
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    assert str(error.value) == (
        "FAILED_PRECONDITION: add_param_group: the engine's parameters and groups are fixed when "
        "the ZeroOptimizer is built; pass every param_group to it")
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("call, named", [
    ("state_dict", "state_dict()"), ("load_state_dict", "load_state_dict()"),
    ("gathered_parameters", "gathered_parameters()"), ("opt.state", "opt.state"),
    ("save_checkpoint", "save_checkpoint()")])
def test_a_collective_called_on_rank_0_alone_times_out_by_name(ranks_runner, call, named):
    """`if rank == 0: opt.state_dict()` (or another collective call) with
    collective_timeout=2 at stage 3: rank 0 gets a TimeoutError naming the
    call every rank must make, not a 600 s hang
    (workers/rank0_only_state_dict.py)."""
    results = ranks_runner(2, "rank0_only_state_dict.py", call)
    assert results[0]["is_memwall_error"]
    assert results[0]["error"].startswith(
        "DeadlineExceededError: DEADLINE_EXCEEDED: %s is collective: every rank calls it, in "
        "the same order, and not every rank did (" % named)
    # Rank 1 is named from the board: it posted fewer of the communicator's
    # collectives than rank 0 (which counts the call it waits in).
    ended = re.search(
        "not every rank joined within 2s \\(a rank failed, is stuck or stopped calling "
        "collectives\\); never arrived: rank 1, which had posted ([0-9]+) of this communicator's "
        "MPI collectives to this rank's ([0-9]+); the communicator is unusable now: end the job "
        "and resume from the last checkpoint\\)$", results[0]["error"])
    assert ended, results[0]["error"]
    assert int(ended.group(1)) < int(ended.group(2))
    assert results[1]["error"] == ""


def test_a_collective_timeout_below_zero_is_refused():
    model = mlp()
    with pytest.raises(ValueError) as error:
        mt.ZeroOptimizer(model, None, {}, collective_timeout=-1)
    assert str(error.value) == (
        "INVALID_ARGUMENT: collective_timeout: expected seconds >= 0 (0: wait forever), got -1")


def test_torchrun_without_torch_distributed_or_its_store_is_refused(monkeypatch):
    """A process torchrun started as rank 1 of 2 (its environment), with
    torch.distributed not initialised and no agent store to join the ranks
    through (older torchrun rendezvous): refused before MPI starts, naming
    what to do, rather than training as a rank of 1."""
    from memwall import _join
    for name, value in (("TORCHELASTIC_RUN_ID", "test"), ("RANK", "1"), ("WORLD_SIZE", "2"),
                        ("TORCHELASTIC_USE_AGENT_STORE", "False")):
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError) as error:
        _join.join_torch_ranks()
    assert str(error.value) == (
        "torchrun started this process as rank 1 of 2, and torch.distributed is not "
        "initialised: memwall joins torchrun's ranks over torch.distributed, or over torchrun's "
        "own store where the rendezvous gives one (TORCHELASTIC_USE_AGENT_STORE is 'False' "
        "here); call torch.distributed.init_process_group() before memwall")
