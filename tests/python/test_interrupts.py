"""An exception or Ctrl-C anywhere in a training step leaves the glue and
the engine in step: the interrupted step is forgotten on both sides (or,
interrupted after the engine's update, done), so a step retried afterwards
trains exactly as an uninterrupted run, bit for bit; a backward that never
ended is noticed, not trained on."""
import re
import signal
import time
import warnings

import numpy as np
import pytest
import torch

import memwall
import memwall.torch as mt


class _FailAt:
    """The engine, raising KeyboardInterrupt before its n-th call (what a
    Ctrl-C between two of the glue's engine calls would do)."""

    def __init__(self, engine, n):
        self.engine, self.n, self.calls = engine, n, 0

    def __getattr__(self, name):
        value = getattr(self.engine, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise KeyboardInterrupt("before engine call %d (%s)" % (self.n, name))
            return value(*args, **kwargs)
        return call


X = torch.linspace(-1, 1, 8).view(2, 4)


def build(stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": stage}})


def train_step(model, opt):
    opt.backward(model(X).sum())
    opt.step()


def weights(model, opt):
    return torch.cat([opt.master_weights(n).flatten() for n, _ in model.named_parameters()])


def reference(stage, steps):
    model, opt = build(stage)
    for _ in range(steps):
        train_step(model, opt)
    return weights(model, opt)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_step_interrupted_between_any_two_engine_calls(stage):
    two, three = reference(stage, 2), reference(stage, 3)
    n = 0
    while True:
        n += 1
        model, opt = build(stage)
        real = opt._engine
        opt._engine = _FailAt(real, n)
        try:
            train_step(model, opt)
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
        opt._engine = real
        if not interrupted:
            break  # n passed every engine call of a step
        applied = opt.engine.progress()["steps_applied"]
        for _ in range(2):  # the interrupted step again (if undone), and one more
            train_step(model, opt)
        got = weights(model, opt)
        assert torch.equal(got, three if applied else two), "interrupted before call %d" % n
    assert n > 10  # every call of a step was interrupted once


def test_a_backward_interrupted_inside_torch_is_noticed_not_trained_on():
    """The interrupt lands in autograd between two of the glue's hooks: the
    last layer's gradients have reached the engine, the first's not."""

    class Interrupt(torch.autograd.Function):
        armed = True

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if Interrupt.armed:
                Interrupt.armed = False
                raise KeyboardInterrupt("in autograd")
            return grad

    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)]
    model = torch.nn.Sequential(*layers)

    def forward(x):
        return layers[1](Interrupt.apply(layers[0](x)))

    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 2}})
    with pytest.raises(KeyboardInterrupt):
        forward(X).sum().backward()  # torch's own call, not opt.backward
    with pytest.raises(memwall.Error) as error:
        with pytest.warns(RuntimeWarning, match="the last backward did not finish"):
            opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: step(): the last backward did not finish (interrupted?); this "
        "step's gradients were dropped: run its micro-batches again")
    forward(X).sum().backward()
    opt.step()
    # torch.optim.AdamW from the same weights, one step: the interrupted
    # backward's partial gradients are not in it.
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    adam = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)
    ref(X).sum().backward()
    adam.step()
    for (name, _), want in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(opt.master_weights(name), want.detach(), rtol=0, atol=1e-7), name


class _Alarm(Exception):
    pass


def test_real_signals_landing_anywhere_in_training():
    """A SIGALRM per attempt at a random moment of a stage-3 step (forward,
    backward or the update), its handler raising in whatever Python runs,
    as a timeout's would (KeyboardInterrupt for every other attempt): each
    interrupted step is retried until the engine has applied it (at least
    16 steps and 8 alarms), and the run ends bit for bit where an
    uninterrupted one of as many steps does."""
    steps = 16
    model, opt = build(3)
    train_step(model, opt)  # the first step warms up
    start = time.perf_counter()
    train_step(model, opt)
    took = time.perf_counter() - start  # one step, to spread the alarms over
    random = np.random.default_rng(7)
    kinds, fired = [_Alarm, KeyboardInterrupt], []

    def alarm(signum, frame):
        # Only inside a training step (the test's own bookkeeping around it
        # is not what is tested), and not inside torch's grad-mode context
        # managers, which an exception there leaves switched (torch.no_grad's
        # __enter__ half done disables gradients for good, under any
        # optimizer: torch's own step() is decorated the same way).
        if frame.f_code.co_filename.endswith(("grad_mode.py", "_contextlib.py")):
            return
        while frame is not None and frame.f_code is not train_step.__code__:
            frame = frame.f_back
        if frame is not None:
            fired.append(1)
            raise kinds[len(fired) % 2]()

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a backward noticed unfinished
            attempts = 0
            while opt.engine.progress()["steps_applied"] < steps or len(fired) < steps // 2:
                attempts += 1
                assert attempts < 3000, "%d alarms, %d steps" % (
                    len(fired), opt.engine.progress()["steps_applied"])
                signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-5, 2 * took))
                try:
                    train_step(model, opt)
                except (_Alarm, KeyboardInterrupt):
                    pass
                except memwall.Error as error:
                    # Interrupted after a backward ended, before step(): the
                    # retried forward and backward make another micro-batch,
                    # which step() refuses (torch would add them up),
                    # dropping the step's gradients.
                    assert re.fullmatch(
                        "FAILED_PRECONDITION: step\\(\\): [0-9]+ backward passes since the last "
                        "step; the config's gradient_accumulation_steps is 1", str(error))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    applied = opt.engine.progress()["steps_applied"]
    assert torch.equal(weights(model, opt), reference(3, applied))
