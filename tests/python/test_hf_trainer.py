"""Hugging Face transformers' Trainer, its own training loop, with a
ZeroOptimizer (memwall.trainer): on 1 rank and on 2 real MPI ranks at ZeRO
stages 0-3 it trains as a plain Trainer with torch.optim.AdamW on one
process does (workers/hf_trainer.py), and trainer.save_model writes the
trained weights, which from_pretrained reads back; a last batch the ranks
cannot share is refused, not dropped silently. A Trainer user's DeepSpeed
config with "auto" values (config=) is filled as transformers' own
DeepSpeed integration fills it and trains as the plain Trainer does.

Tolerances (f32): the mean over ranks of each rank's logged loss equals the
reference's within 1e-5 relative; every master weight is within 2e-5 of
AdamW's after 4 steps (as test_zero_optimizer); the saved weights are the
master weights exactly."""
import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
from tiny_gpt2 import tiny_gpt2  # noqa: E402


def check_losses_and_weights(results):
    ranks = len(results)
    reference = results[0]["reference_losses"]
    assert len(reference) == 4
    for step, want in enumerate(reference):
        mean = sum(r["losses"][step] for r in results) / ranks
        assert mean == pytest.approx(want, rel=1e-5), "step %d" % step
    for r, result in enumerate(results):
        assert result["weight_error"] <= 2e-5, r


def check(results):
    check_losses_and_weights(results)
    assert results[0]["saved_error"] == 0.0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_trainer_on_two_ranks_trains_as_one_process_with_torch_adamw(ranks_runner, tmp_path,
                                                                          stage):
    check(ranks_runner(2, "hf_trainer.py", stage, tmp_path / "saved"))


def test_the_trainer_under_torchrun_alone_trains_as_one_process_with_torch_adamw(tmp_path):
    """torchrun starts the 2 ranks (no MPI job, torch.distributed not
    initialised: memwall.trainer hides the ranks from accelerate): memwall
    joins them through torchrun's store, and the Trainer trains as under
    mpirun, not as two single-rank copies (which would each take the whole
    batch: losses and weights off the reference)."""
    from conftest import torchrun_ranks
    check(torchrun_ranks(2, "hf_trainer.py", tmp_path / "out", 3, tmp_path / "saved"))


def test_the_trainer_on_one_rank(ranks_runner, tmp_path):
    check(ranks_runner(1, "hf_trainer.py", 3, tmp_path / "saved"))


def test_a_last_partial_batch_that_cannot_be_split_across_ranks_is_refused(ranks_runner,
                                                                            tmp_path):
    """30 samples are 7 global batches of 4 and 2 left over, which 2 ranks
    cannot share evenly: without dataloader_drop_last the Trainer is told
    so before training, on every rank."""
    for result in ranks_runner(2, "hf_trainer.py", 0, tmp_path / "saved", 30):
        assert result["error"] == (
            "TrainingArguments.dataloader_drop_last: 30 samples are not whole global batches of "
            "4 (2 per rank x 2 ranks), and the last one cannot be split evenly across the ranks: "
            "set dataloader_drop_last=True")


@pytest.mark.parametrize("stage, scheduler", [(2, "engine"), (3, "trainer")])
def test_a_deepspeed_config_with_auto_values_trains_as_the_trainer_with_torch_adamw(
        ranks_runner, stage, scheduler):
    """The ds_config.json a Trainer user has (transformers' documented zero2
    and zero3 layouts, "auto" throughout), given as config=: on 2 ranks the
    Trainer trains as a plain Trainer with its own AdamW (weight decay but
    on biases and norms, max_grad_norm 1.0, a linear schedule with warm-up)
    on one process, whether the config's WarmupDecayLR or the Trainer's
    scheduler sets the rate; the DeepSpeed knobs memwall has no counterpart
    for are named in a warning."""
    results = ranks_runner(2, "hf_trainer_ds.py", stage, scheduler)
    check_losses_and_weights(results)
    for r, result in enumerate(results):
        assert result["lrs"] == pytest.approx(result["reference_lrs"], rel=1e-6), r
        assert result["reference_lrs"] == [0.0, 0.0015, 0.003, 0.0015]
        knobs = ["steps_per_print", "wall_clock_breakdown"]
        if stage == 3:
            knobs = ["zero_optimization.sub_group_size",
                     "zero_optimization.stage3_param_persistence_threshold",
                     "zero_optimization.stage3_max_reuse_distance"] + knobs
        assert result["warnings"] == [
            "memwall: DeepSpeed settings with no memwall counterpart, not applied: "
            + ", ".join(knobs)], r


AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
            "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
        "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}


def transformers_fill(config, args, model, steps):
    """What transformers' own DeepSpeed integration makes of `config`:
    HfTrainerDeepSpeedConfig's filling methods on accelerate's config
    object (its constructor checks that deepspeed is installed, which the
    filling never uses)."""
    import accelerate.utils.deepspeed
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    methods = {k: v for k, v in vars(HfTrainerDeepSpeedConfig).items() if not k.startswith("__")}
    filled = type("Filled", (accelerate.utils.deepspeed.HfDeepSpeedConfig,), methods)(
        copy.deepcopy(config))
    filled.mismatches, filled._dtype = [], None
    filled.trainer_config_process(args)
    filled.trainer_config_finalize(args, model, steps)
    return filled.config


@pytest.mark.parametrize("arguments", [
    {},
    {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 4, "learning_rate": 1e-3,
     "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6, "weight_decay": 0.1,
     "max_grad_norm": 0.5, "warmup_steps": 3},
    {"bf16": True, "warmup_steps": 0.25}])  # a ratio of the steps
def test_auto_values_are_filled_as_transformers_deepspeed_integration_fills_them(tmp_path,
                                                                                 arguments):
    import transformers
    import memwall.trainer
    _, model = tiny_gpt2()
    args = memwall.trainer.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                             report_to=[], **arguments)
    assert memwall.trainer.fill_auto(AUTO, args, model, 1, 40) == \
        transformers_fill(AUTO, args, model, 40)


def test_a_deepspeed_config_is_refused_where_memwall_cannot_follow_it(tmp_path):
    import memwall
    import memwall.trainer
    _, model = tiny_gpt2()
    args = memwall.trainer.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                             report_to=[], per_device_train_batch_size=2)
    mismatched = copy.deepcopy(AUTO)
    mismatched["train_micro_batch_size_per_gpu"] = 8
    mismatched["optimizer"]["params"]["lr"] = 1e-3
    with pytest.raises(ValueError) as error:
        memwall.trainer.deepspeed_config(mismatched, args, model, 2, 10)
    assert str(error.value) == (
        "config: values that disagree with the TrainingArguments (set them to \"auto\" to take "
        "the arguments'):\n- train_micro_batch_size_per_gpu=8 vs per_device_train_batch_size=2\n"
        "- optimizer.params.lr=0.001 vs learning_rate=5e-05")
    # What memwall cannot do is the engine's to refuse, when it reads the config.
    scattered = copy.deepcopy(AUTO)
    scattered["zero_optimization"]["contiguous_gradients"] = False
    with pytest.raises(ValueError) as error:
        memwall._memwall.config_values(
            json.dumps(memwall.trainer.deepspeed_config(scattered, args, model, 2, 10)))
    assert str(error.value) == (
        "INVALID_ARGUMENT: zero_optimization.contiguous_gradients: expected true (memwall's "
        "gradients always lie in contiguous flat buckets), got false")
    unfilled = copy.deepcopy(AUTO)
    unfilled["zero_optimization"]["allgather_bucket_size"] = "auto"
    with pytest.raises(ValueError) as error:
        memwall.trainer.deepspeed_config(unfilled, args, model, 2, 10)
    assert str(error.value) == (
        "config: zero_optimization.allgather_bucket_size: \"auto\" is filled only where "
        "transformers' DeepSpeed integration fills it; give a value")


def test_with_a_config_the_trainer_makes_no_torch_optimizer_of_its_own(tmp_path):
    """create_optimizer (which user code may call before train()) would make
    a torch AdamW the run then kept: with config= it is refused by name."""
    import memwall.trainer
    _, model = tiny_gpt2()
    args = memwall.trainer.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                             report_to=[], max_steps=1)
    trainer = memwall.trainer.Trainer(model=model, args=args, train_dataset=[], config=AUTO)
    with pytest.raises(ValueError) as error:
        trainer.create_optimizer()
    assert str(error.value) == (
        "create_optimizer: with config=, memwall.trainer builds the ZeroOptimizer when train() "
        "starts (the config's schedule needs the number of steps)")


def test_the_engine_schedule_reports_the_rate_each_step_trained_with():
    """With the config's scheduler the Trainer's lr_scheduler is the engine's
    (memwall.trainer._EngineSchedule): get_last_lr() is the rate the last
    step trained with (linear warm-up over 4 steps to 0.01: 0, then
    0.0025), and a state saved by another scheduler is refused, not
    ignored."""
    import torch
    import memwall.torch as mt
    import memwall.trainer
    model = torch.nn.Linear(4, 2)
    opt = mt.ZeroOptimizer(model, None, {"scheduler": {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4,
        "warmup_type": "linear"}}})
    schedule = memwall.trainer._EngineSchedule(opt)
    rates = []
    for _ in range(2):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        schedule.step()
        rates.append(schedule.get_last_lr())
    assert rates == [[0.0], [pytest.approx(0.0025, rel=1e-6)]]
    schedule.load_state_dict(schedule.state_dict())  # its own: nothing to carry
    with pytest.raises(ValueError) as error:
        schedule.load_state_dict({"last_epoch": 3, "base_lrs": [0.01]})
    assert str(error.value) == (
        "lr_scheduler.load_state_dict: the config's scheduler is the engine's, whose step its "
        "checkpoint holds; got the state of another scheduler (keys base_lrs, last_epoch)")
