"""`memwall max-params --model hf:CONFIG`: the Hugging Face model traced once
and scaled in depth. Its answer is checked against traces of the real
models at that depth and one more (transformers builds them; `memwall plan`
traces each): the one fits under the config it wrote, the other does not,
with the same device memory to the byte."""
import json
import os
import subprocess
import sys

from conftest import ROOT


def _run(*args):
    env = {**os.environ, "MEMWALL_PYTHON": sys.executable}
    done = subprocess.run([os.path.join(ROOT, "bazel-bin", "cli", "memwall"), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_gpt2_scaled_in_depth_agrees_with_the_real_deeper_models(tmp_path):
    machine = ["--device_memory", "4GiB", "--host_memory", "0"]
    found = _run("max-params", "--model", "hf:configs/hf/gpt2.json", *machine, "--json",
                 "--out", tmp_path / "chosen.json")
    assert found["schema"] == "memwall.max-params/1"
    assert found["depth_key"] == "n_layer" and found["fits"]
    depth = found["size"]
    assert found["model"] == "hf:configs/hf/gpt2.json with n_layer = %d" % depth
    assert 1 < depth < 100
    with open(os.path.join(ROOT, "configs", "hf", "gpt2.json")) as f:
        config = json.load(f)
    plans = {}
    for layers in (depth, depth + 1):
        path = tmp_path / ("gpt2-%d.json" % layers)
        path.write_text(json.dumps({**config, "n_layer": layers}))
        plans[layers] = _run("plan", "--model", "hf:%s" % path, *machine, "--json",
                             "--config", tmp_path / "chosen.json")
    assert plans[depth]["fits"] and not plans[depth + 1]["fits"]
    assert plans[depth]["parameters"] == found["parameters"]
    assert plans[depth]["device"]["needed"] == found["device_needed"]
    assert found["next"]["parameters"] == plans[depth + 1]["parameters"]
    assert found["next"]["fits_text"] == plans[depth + 1]["fits_text"]
