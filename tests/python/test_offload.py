"""Optimizer offload, parameter paging and the NVMe tier through
ZeroOptimizer: the same training as torch.optim.AdamW (within 1e-6), with
the model states where the config puts them, to the byte (one process)."""
import copy
import os

import pytest
import torch

import memwall.torch as mt


def train(zero, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 4))
    reference = copy.deepcopy(model)
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key, {}).get("device") == "nvme":
            zero[key]["nvme_path"] = str(tmp_path)
    config = {"zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    opt = mt.ZeroOptimizer(model, None, config)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(4):
        x, y = torch.randn(32, 8), torch.randn(32, 4)
        opt.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for name, p in reference.named_parameters():
        assert torch.allclose(opt.master_weights(name), p.detach(), rtol=0, atol=1e-6), name
    memory = opt.memory()
    device = {c: v["current"] for c, v in memory.items() if c != "pinned" and v["current"]}
    pinned = {c: v["current"] for c, v in memory["pinned"].items() if v["current"]}
    return opt, opt.engine.groups(), device, pinned


def nvme_files(directory, prefix):
    """The sizes of this process's open files that were created in
    `directory` as `prefix`*: the NVMe tier removes a file's name as soon
    as it opens it (so no run leaves one behind), and /proc/self/fd still
    shows it, as "(deleted)"."""
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/%s" % fd)
        except OSError:
            continue
        if target.startswith("%s/%s" % (directory, prefix)) and target.endswith(" (deleted)"):
            sizes.append(os.fstat(int(fd)).st_size)
    assert not list(directory.glob(prefix + "*"))  # no name in the directory
    return sizes


def test_half_the_optimizer_on_the_cpu(tmp_path):
    _, groups, device, pinned = train(
        {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, tmp_path)
    # Per group: the first half (rounded) of its elements update on the
    # host with an f32 master copy, m and v (12 bytes) and their gradients
    # staged there (4); the rest keep m and v (8) on the device, whose
    # parameters are the f32 master weights.
    n = [g["padded_numel"] for g in groups]
    k = [min(e, int(0.5 * e + 0.5)) for e in n]  # llround
    assert device == {"parameter": 4 * sum(n), "gradient": 4 * sum(n),
                      "optimizer_state": 8 * (sum(n) - sum(k))}
    assert pinned == {"gradient": 4 * sum(k), "optimizer_state": 12 * sum(k)}


def test_parameter_paging_leaves_nothing_on_the_device_at_rest(tmp_path):
    _, groups, device, pinned = train(
        {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
        tmp_path)
    n = sum(g["padded_numel"] for g in groups)
    assert device == {}
    assert pinned == {"parameter": 4 * n, "gradient": 4 * n, "optimizer_state": 12 * n}


def test_the_nvme_tier_keeps_the_optimizer_state_in_a_file(tmp_path):
    opt, groups, device, pinned = train(
        {"stage": 3, "overlap_comm": True, "offload_optimizer": {"device": "nvme"}}, tmp_path)
    n = sum(g["padded_numel"] for g in groups)
    assert device == {"parameter": 4 * n}
    assert pinned == {"gradient": 4 * n}
    files = nvme_files(tmp_path, "memwall-optimizer-")
    assert len(files) == 1 and files[0] >= 12 * n


@pytest.mark.parametrize("buffers", [1, 3])
def test_parameters_on_nvme_leave_the_host_only_buffers(tmp_path, buffers):
    """offload_param on "nvme" (with the optimizer there too): the same
    training as torch's AdamW; at rest the device holds nothing, and pinned
    memory the page buffers only, each the largest shard in whole 4096-byte
    blocks (the gradients go to the optimizer's file as they are reduced)."""
    opt, groups, device, pinned = train(
        {"stage": 3, "overlap_comm": True, "offload_optimizer": {"device": "nvme"},
         "offload_param": {"device": "nvme", "max_in_cpu": 0, "buffer_count": buffers}},
        tmp_path)
    n = [g["padded_numel"] for g in groups]
    page = max((4 * e + 4095) // 4096 * 4096 for e in n)
    assert device == {}
    assert pinned == {"workspace": buffers * page + 4096}
    files = nvme_files(tmp_path, "memwall-params-")
    assert len(files) == 1
    assert files[0] == sum(2 * ((4 * e + 4095) // 4096 * 4096) for e in n)


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_the_update_overlapped_with_backward_is_the_step_time_update(device, tmp_path):
    """offload_optimizer.overlap_step: each group's CPU update runs during
    backward; with a LambdaLR warm-up changing the rate every step and
    clipping that applies on some steps, the weights are bit for bit those
    of the update at the step, and only the steps that clipped were
    computed twice (the rate reaches the engine before backward)."""
    ends, redone = [], []
    for overlap in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 4))
        offload = {"device": device, "overlap_step": overlap}
        if device == "nvme":
            offload["nvme_path"] = str(tmp_path)
        config = {"zero_optimization": {"stage": 2, "offload_optimizer": offload},
                  "gradient_clipping": 0.5,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
        opt = mt.ZeroOptimizer(model, None, config)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))
        clipped = 0
        for step in range(6):
            torch.manual_seed(100 + step)
            x, y = torch.randn(32, 8), torch.randn(32, 4) * (8 if step % 2 else 0.1)
            opt.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            schedule.step()
            clipped += opt.last_step["grad_norm"] > 0.5
        ends.append({name: opt.master_weights(name) for name, _ in model.named_parameters()})
        redone.append((opt.engine.redone_updates(), clipped))
    for name in ends[0]:
        assert torch.equal(ends[0][name], ends[1][name]), name
    assert redone[0] == (0, redone[0][1])  # no overlap: nothing to compute again
    assert 0 < redone[1][1] < 6  # some steps clipped, some did not
    assert redone[1][0] == redone[1][1]  # only those were computed twice
