"""opt.communication() on 2 real ranks, each posed as a node (the config's
ranks_per_node): every collective's bytes cross between the nodes as the
topology says, stage 3 gathers the model (torch's parameter count) twice a
step, and ZeRO++'s quantized weight gathers (zero_quantized_weights) move
about a quarter of the f32 gathers' bytes while the losses stay within 1%
of the exact run's; all of ZeRO++ through the optimizer's config."""
import pytest

from conftest import run_ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("communication")
    return {mode: run_ranks(2, "communication.py", tmp / mode, mode)
            for mode in ("exact", "qwz", "zeropp")}


def test_link_bytes_cross_between_the_posed_nodes(runs):
    for rank in runs["exact"]:
        assert rank["nodes"] == 2
        step = rank["step"]
        # Two nodes: every byte of a gather or scatter crosses once, an
        # all-reduce's twice; nothing stays inside a node of one rank.
        for name, c in step.items():
            assert c["intra_node_bytes"] == 0, name
            assert c["inter_node_bytes"] == (2 if name == "AllReduce" else 1) * c["bytes"], name
        # Stage 3 gathers the f32 model for forward and for backward, the
        # tied embedding (96 x 32) again for the LM head each time; groups
        # are padded to the ranks.
        assert step["AllGather"]["bytes"] >= 2 * 4 * (rank["numel"] + 96 * 32)
        assert step["AllGather"]["bytes"] < 2 * 4 * (rank["numel"] + 96 * 32) * 1.02
        assert len(rank["arrived_last"]) == 2


def test_quantized_weight_gathers_move_a_quarter_and_train_alike(runs):
    exact, quantized = runs["exact"][0], runs["qwz"][0]
    e, q = exact["step"]["AllGather"], quantized["step"]["AllGather"]
    assert q["calls"] == e["calls"]
    # f32 to int8 levels plus an f32 scale per 256 elements.
    assert 0.25 * e["bytes"] <= q["bytes"] <= (0.25 + 1 / 256) * e["bytes"] + 8 * q["calls"]
    assert quantized["step"]["ReduceScatter"] == exact["step"]["ReduceScatter"]
    for r in (0, 1):
        for a, b in zip(runs["exact"][r]["losses"], runs["qwz"][r]["losses"]):
            assert abs(a - b) <= 0.01 * a
        # Quantized, not exact: the weights the forward saw differ.
        assert runs["exact"][r]["losses"][1:] != runs["qwz"][r]["losses"][1:]


def test_zeropp_keys_work_through_the_optimizer(runs):
    """All of ZeRO++ through ZeroOptimizer's config: the gradients cross
    the nodes as an all-to-all of int8 (no reduce-scatter spans them), the
    later gathers of a step inside the blocks of 2 (here both nodes), and
    the losses stay within 1% of the exact run's."""
    exact, zeropp = runs["exact"][0]["step"], runs["zeropp"][0]["step"]
    assert zeropp["AllToAll"]["calls"] > 0 and exact["AllToAll"]["calls"] == 0
    # Each rank its own node: the reduce-scatter inside a node has one rank.
    assert zeropp["ReduceScatter"]["calls"] == 0
    # f32 sums as int8 levels and a scale per 256: about a quarter.
    assert zeropp["AllToAll"]["bytes"] <= (0.25 + 1 / 256) * exact["ReduceScatter"]["bytes"] + \
        16 * zeropp["AllToAll"]["calls"]
    assert runs["zeropp"][0]["sums"][1] < runs["exact"][0]["sums"][1]
    for r in (0, 1):
        for a, b in zip(runs["exact"][r]["losses"], runs["zeropp"][r]["losses"]):
            assert abs(a - b) <= 0.01 * a
