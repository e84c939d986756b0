"""``streameval.Evaluator`` (docs/evaluator.md): rows added in batches of any size, as numpy arrays or
torch tensors, held in memory up to a buffer budget and then written to a temporary (or named)
store; ``compute()`` is ``evaluate()`` on the concatenated arrays, bit for bit, for every protocol
preset, every chunking and whether or not the rows went to a store."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streameval
from streameval import Evaluator, OptionError, StoreError
from streameval.io.arrays import host_array
from streameval.protocols import PRESETS

HYPOTHESIS = dict(deadline=None, max_examples=8, suppress_health_check=[HealthCheck.too_slow])
TIMING = {"phases", "elapsed_s", "pairs_per_s"}  # the run facts that are times: differ between any two runs
N_QUERY, N_GALLERY, DIM = 30, 160, 8


def problem(seed: int = 0, dtype=np.float32, n_query: int = N_QUERY, n_gallery: int = N_GALLERY) -> dict:
    """Features of a few identities seen by cameras 1-6 (every preset's camera sets: SYSU's 3 and 6
    for queries), junk (-1) and distractor (0) gallery rows, a query of an identity not in the gallery."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((9, DIM))
    q_pids = rng.integers(1, 9, n_query)
    g_pids = rng.integers(-1, 9, n_gallery)
    q_pids[0] = 50
    features = {side: (centres[np.clip(ids, 0, 8)] + rng.standard_normal((len(ids), DIM))).astype(dtype)
                for side, ids in (("q", q_pids), ("g", g_pids))}
    return {"qf": features["q"], "q_pids": q_pids, "q_camids": rng.choice([3, 6], n_query),
            "gf": features["g"], "g_pids": g_pids, "g_camids": rng.integers(1, 7, n_gallery)}


def split(n: int, cuts) -> list[slice]:
    """Rows 0..n in batches ending at ``cuts`` (repeated cuts: batches of no rows)."""
    bounds = [0, *sorted(min(max(c, 0), n) for c in cuts), n]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def fed(evaluator: Evaluator, arrays: dict, q_cuts=(), g_cuts=(), as_batch=lambda a: a) -> Evaluator:
    """``evaluator`` given the rows of ``arrays`` in batches (each column through ``as_batch``)."""
    for side, add, cuts in (("q", evaluator.add_queries, q_cuts), ("g", evaluator.add_gallery, g_cuts)):
        features, pids, camids = arrays[f"{side}f"], arrays[f"{side}_pids"], arrays[f"{side}_camids"]
        for rows in split(len(pids), cuts):
            add(as_batch(features[rows]), as_batch(pids[rows]), as_batch(camids[rows]))
    return evaluator


def without_timing(value):
    if isinstance(value, dict):
        return {key: without_timing(item) for key, item in value.items() if key not in TIMING}
    return value


def assert_same(result, expected) -> None:
    """Every value of the two results equal (times aside), per-query arrays bit for bit."""
    got, want = (json.dumps(without_timing(r.to_dict(per_query=True)), sort_keys=True) for r in (result, expected))
    assert got == want
    assert result.per_query.keys() == expected.per_query.keys()
    for name, values in expected.per_query.items():
        assert result.per_query[name].dtype == values.dtype, name
        assert np.array_equal(result.per_query[name], values, equal_nan=values.dtype.kind == "f"), name


# ------------------------------------------------------------------------------ equal to evaluate()


@pytest.mark.parametrize("protocol", sorted(PRESETS))
@pytest.mark.parametrize("budget", ["256MiB", 0], ids=["held-until-compute", "spilled-while-adding"])
def test_every_preset_equals_evaluate_on_the_whole_arrays(protocol, budget):
    arrays = problem(1)
    rng = np.random.default_rng(2)
    ev = fed(Evaluator(protocol=protocol, buffer_budget=budget, chunk_rows=16), arrays,
             rng.integers(0, N_QUERY, 4), rng.integers(0, N_GALLERY, 9))
    assert_same(ev.compute(), streameval.evaluate(arrays, protocol=protocol))
    ev.close()


@settings(**HYPOTHESIS)
@given(q_cuts=st.lists(st.integers(0, N_QUERY), max_size=6), g_cuts=st.lists(st.integers(0, N_GALLERY), max_size=20),
       dtype=st.sampled_from([np.float32, np.float16, np.float64]),
       protocol=st.sampled_from(["market", "cuhk03-sgs", "sysu-all"]),
       chunking=st.sampled_from([{}, {"query_block": 7}, {"gallery_chunk": 23},
                                 {"query_block": 4, "gallery_chunk": 50}]),
       budget=st.sampled_from(["256MiB", 0, 700, "3kB"]), chunk_rows=st.sampled_from([8192, 11, 64]))
def test_random_batches_and_chunkings_equal_evaluate(q_cuts, g_cuts, dtype, protocol, chunking, budget, chunk_rows):
    arrays = problem(3, dtype)
    options = {"protocol": protocol, **chunking}
    with Evaluator(buffer_budget=budget, chunk_rows=chunk_rows, **options) as ev:
        assert_same(fed(ev, arrays, q_cuts, g_cuts).compute(), streameval.evaluate(arrays, **options))


@settings(**{**HYPOTHESIS, "max_examples": 4})
@given(g_cuts=st.lists(st.integers(0, N_GALLERY), max_size=12), budget=st.sampled_from(["256MiB", 0]),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_cpu_torch_tensors_equal_evaluate_on_their_arrays(g_cuts, budget, dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs its CPU build)")
    tensors = {key: torch.from_numpy(values) for key, values in problem(4).items()}
    for key in ("qf", "gf"):
        tensors[key] = tensors[key].to(getattr(torch, dtype)).requires_grad_()  # detached by the evaluator
    arrays = {key: host_array(values, key) for key, values in tensors.items()}  # bfloat16 -> float32
    with Evaluator(buffer_budget=budget) as ev:
        assert_same(fed(ev, tensors, [7], g_cuts).compute(), streameval.evaluate(arrays))


def test_lists_of_batches_of_any_size_one_row_and_none_included():
    arrays = problem(5)
    ev = Evaluator()
    pieces = split(N_GALLERY, [1, 1, 2, 40, 159])  # sizes 1, 0, 1, 38, 119, 1
    ev.add_gallery([arrays["gf"][s] for s in pieces], [arrays["g_pids"][s] for s in pieces],
                   tuple(arrays["g_camids"][s] for s in pieces))
    ev.add_queries(arrays["qf"][:1], arrays["q_pids"][:1], arrays["q_camids"][:1])
    ev.add_queries(arrays["qf"][1:], list(arrays["q_pids"][1:]), list(arrays["q_camids"][1:]))  # ids as lists
    assert_same(ev.compute(), streameval.evaluate(arrays))


def test_compute_again_after_more_rows_and_after_reset():
    arrays, other = problem(6), problem(7)
    for budget in ("256MiB", 0):
        ev = fed(Evaluator(buffer_budget=budget), {**arrays, "gf": arrays["gf"][:100], "g_pids": arrays["g_pids"][:100],
                                                   "g_camids": arrays["g_camids"][:100]}, g_cuts=[50])
        first = ev.compute()
        assert_same(ev.compute(), first)  # computing again changes nothing
        ev.add_gallery(arrays["gf"][100:], arrays["g_pids"][100:], arrays["g_camids"][100:])
        assert_same(ev.compute(), streameval.evaluate(arrays))
        ev.reset()
        assert_same(fed(ev, other, [3], [77]).compute(), streameval.evaluate(other))
        ev.close()


def test_options_go_to_evaluate():
    arrays = problem(8)
    options = {"metric": "cosine", "max_rank": 20, "no_gom": True, "open_set": True, "ranked_list": 3,
               "queries": "worst:2", "verification": True, "precision": "float64", "trials": 3}
    ev = fed(Evaluator(buffer_budget=0, **options), arrays, [10], [60, 61])
    result, expected = ev.compute(), streameval.evaluate(arrays, **options)
    assert_same(result, expected)
    assert result.ranked_lists.section() == expected.ranked_lists.section()
    ev.close()


# ------------------------------------------------------------------------------ memory and the store


def test_held_rows_stay_within_the_buffer_budget():
    """Adding 2 MiB of gallery rows in small batches with a 64 KiB budget: the memory allocated
    while adding peaks near the budget and a store chunk, not near the gallery."""
    rng = np.random.default_rng(9)
    batch = 64
    ev = Evaluator(buffer_budget="64KiB", chunk_rows=256)
    ev.add_queries(rng.standard_normal((4, 64), dtype=np.float32), np.arange(4), np.ones(4, int))
    tracemalloc.start()
    try:
        for start in range(0, 8192, batch):
            features = rng.standard_normal((batch, 64), dtype=np.float32)
            ev.add_gallery(features, np.arange(batch) % 9, np.zeros(batch, int))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 512 << 10, peak  # of 2 MiB added
    assert ev.compute().n_gallery == 8192
    ev.close()


def temporary_store(ev: Evaluator) -> str:
    """The path of the evaluator's temporary store, as its repr names it."""
    return repr(ev).rsplit(" in ", 1)[1].rstrip(")")


def test_the_temporary_store_is_removed_by_reset_close_and_garbage_collection():
    arrays = problem(10)
    for end in ("reset", "with", "gc"):
        ev = fed(Evaluator(buffer_budget=0), arrays, g_cuts=[80])
        path = temporary_store(ev)
        assert os.path.isdir(path) and os.path.basename(os.path.dirname(path)).startswith("streameval-")
        if end == "reset":
            ev.reset()
        elif end == "with":
            with ev:
                ev.compute()
        else:
            del ev
            gc.collect()
        assert not os.path.exists(os.path.dirname(path)), end


def test_the_temporary_store_is_removed_at_interpreter_exit(tmp_path):
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import streameval
        ev = streameval.Evaluator(buffer_budget=0)
        ev.add_gallery(np.ones((3, 4), np.float32), [1, 2, 3], [1, 1, 2])
        print(repr(ev).rsplit(" in ", 1)[1].rstrip(")"))
        assert "torch" not in sys.modules  # numpy batches: torch is never imported
        global_keeps_it = ev
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert path.startswith(str(tmp_path))
    assert not os.path.exists(os.path.dirname(path))
    assert os.listdir(tmp_path) == []


def test_a_named_store_is_kept_and_is_a_normal_store(tmp_path):
    arrays = problem(11)
    path = tmp_path / "val.zarr"
    ev = fed(Evaluator(buffer_budget="2kB", path=path, chunk_rows=32), arrays, [9], [50, 51, 120])
    assert path.is_dir()  # past the budget: written there already
    result = ev.compute()
    assert_same(result, streameval.evaluate(arrays))
    ev.close()
    assert path.is_dir()
    streameval.validate_values(streameval.open_store(path))
    assert_same(streameval.evaluate(str(path)), result)
    store = streameval.open_store(path)
    assert (len(store.query), len(store.gallery), store.gallery.chunk_rows) == (N_QUERY, N_GALLERY, 32)
    assert np.array_equal(store.gallery.features[:], arrays["gf"])
    assert np.array_equal(store.query.pids[:], arrays["q_pids"])


def test_a_named_store_is_written_by_compute_even_within_the_budget_and_replaced_after_reset(tmp_path):
    arrays, other = problem(12), problem(13, n_gallery=40)
    path = tmp_path / "val.zarr"
    ev = fed(Evaluator(path=path), arrays)
    assert not path.exists()
    ev.compute()
    assert len(streameval.open_store(path).gallery) == N_GALLERY
    ev.reset()
    assert len(streameval.open_store(path).gallery) == N_GALLERY  # kept until rows go there again
    assert_same(fed(ev, other).compute(), streameval.evaluate(other))
    assert len(streameval.open_store(path).gallery) == 40


def test_a_named_store_never_replaces_what_is_there_unasked(tmp_path):
    path = tmp_path / "val.zarr"
    streameval.write_store(path, *problem(14).values())
    with pytest.raises(StoreError, match="already exists; pass --overwrite"):
        Evaluator(path=path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep me")
    with pytest.raises(OptionError, match="is not a streameval store"):
        Evaluator(path=notes, overwrite=True)
    assert (notes / "mine.txt").read_text() == "keep me"
    with pytest.raises(OptionError, match="does not exist"):
        Evaluator(path=tmp_path / "missing" / "val.zarr")
    arrays = problem(15)
    ev = fed(Evaluator(path=path, overwrite=True), arrays)
    assert_same(ev.compute(), streameval.evaluate(arrays))


# ------------------------------------------------------------------------------ errors


def added_batches(ev: Evaluator, side: str, batches) -> None:
    add = ev.add_queries if side == "query" else ev.add_gallery
    for batch in batches:
        add(*batch)


@pytest.mark.parametrize("budget", ["256MiB", 0])
def test_a_refused_batch_is_named_and_adds_nothing(budget):
    arrays = problem(16)
    ev = fed(Evaluator(buffer_budget=budget), arrays, g_cuts=[40, 80, 120])  # gallery batches 0-3
    f, p, c = arrays["gf"][:5], arrays["g_pids"][:5], arrays["g_camids"][:5]
    bad_values = f.copy()
    bad_values[3, 1] = np.nan
    refusals = [
        ((f[:, :4], p, c), "gallery batch 4 has dimension 4, earlier batches 8"),
        ((f.astype(np.float16), p, c), "gallery batch 4 has dtype float16, earlier batches float32"),
        ((f, p[:4], c), "gallery batch 4 pids has shape (4,) but features have 5 rows"),
        ((f, p, c.astype(float)), "gallery batch 4 camids have dtype float64; expected integers"),
        ((bad_values, p, c), "gallery batch 4 features hold non-finite values (NaN or inf), first at row 3"),
        ((f[0], p, c), "gallery batch 4 features must be 2-D (rows x dim), got shape (8,)"),
        (([f, f[:, :4]], [p, p], [c, c]), "gallery batch 5 has dimension 4, earlier batches 8"),
    ]
    for batch, message in refusals:
        with pytest.raises(StoreError, match=re.escape(message)):
            ev.add_gallery(*batch)
    with pytest.raises(OptionError, match="features are a list of 2 batches, so camids must be a list of as many"):
        ev.add_gallery([f, f], [p, p], c)
    message = "query batch 1 features hold non-finite values (NaN or inf), first at row 0"
    with pytest.raises(StoreError, match=re.escape(message)):
        ev.add_queries(np.full((2, 8), np.inf, np.float32), [1, 2], [3, 3])
    assert_same(ev.compute(), streameval.evaluate(arrays))  # nothing of the refused calls was added
    ev.close()


def test_the_first_batch_sets_dimension_and_dtype_for_both_sides():
    ev = Evaluator()
    ev.add_queries(np.zeros((0, 3), np.float32), [], [])  # no rows: sets nothing
    ev.add_queries(np.ones((2, 6), np.float16), [1, 2], [3, 6])
    with pytest.raises(StoreError, match="gallery batch 0 has dimension 3, earlier batches 6"):
        ev.add_gallery(np.ones((2, 3), np.float16), [1, 2], [1, 1])
    with pytest.raises(StoreError, match="gallery batch 0 has dtype float32, earlier batches float16"):
        ev.add_gallery(np.ones((2, 6), np.float32), [1, 2], [1, 1])


def test_compute_without_queries_or_gallery_says_what_is_missing():
    ev = Evaluator()
    with pytest.raises(OptionError, match=r"none added yet to the query and the gallery \(add_queries, add_gallery\)"):
        ev.compute()
    ev.add_gallery(np.ones((2, 4), np.float32), [1, 2], [1, 1])
    with pytest.raises(OptionError, match=r"none added yet to the query \(add_queries\)"):
        ev.compute()


def test_options_are_checked_when_the_evaluator_is_made():
    refusals = [
        ({"metric": "hamming"}, OptionError, "metric must be one of"),
        ({"protocol": "no-such-protocol"}, OptionError, "no-such-protocol"),
        ({"max_rank": 0}, OptionError, "max_rank must be"),
        ({"gom_norm": "sideways"}, OptionError, "gom"),
        ({"trials": 99}, OptionError, "trials must be"),
        ({"verification": True, "far": [2]}, OptionError, "far (--far) takes FAR targets from 0 to 1"),
        ({"rerank": "nope"}, OptionError, "rerank must be one of"),
        ({"buffer_budget": "lots"}, OptionError, "cannot read a memory size from 'lots'"),
        ({"buffer_budget": -1}, OptionError, "buffer_budget must be a non-negative integer"),
        ({"chunk_rows": 0}, OptionError, "chunk_rows must be a positive integer"),
        ({"gallery_variant": "blur"}, OptionError, "an Evaluator's rows have none"),
        ({"no_such_option": 1}, TypeError, "Evaluator() got unexpected keyword argument(s): no_such_option"),
    ]
    for options, error, message in refusals:
        with pytest.raises(error, match=re.escape(message)):
            Evaluator(**options)


def test_a_cpu_tensor_is_read_without_a_copy_and_a_sparse_one_is_refused():
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs its CPU build)")
    tensor = torch.ones((3, 4), requires_grad=True)
    assert np.shares_memory(host_array(tensor, "features"), tensor.detach().numpy())
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(StoreError, match=r"gallery batch 0 features is a sparse_coo tensor; save it dense"):
        Evaluator().add_gallery(sparse, [1, 2, 3], [1, 1, 1])


def test_the_training_loops_of_the_docs_run_and_equal_evaluate():
    """docs/evaluator.md's two loops (separate loaders; one loader with num_query queries first),
    run as written on a small linear model, give evaluate's result on the model's features."""
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs its CPU build)")
    loops = re.findall(r"```python\n(.*?)```", (Path(__file__).parents[1] / "docs" / "evaluator.md").read_text(), re.S)
    assert len(loops) == 2
    arrays = problem(17)
    torch.manual_seed(0)
    model = torch.nn.Linear(DIM, 6)

    def loader(images, pids, camids, rows: int) -> list:
        columns = [torch.from_numpy(np.asarray(column)) for column in (images, pids, camids)]
        return [tuple(column[s] for column in columns) for s in split(len(pids), range(rows, len(pids), rows))]

    with torch.no_grad():
        features = {side: model(torch.from_numpy(arrays[f"{side}f"])).numpy() for side in ("q", "g")}
    expected = streameval.evaluate({**arrays, "qf": features["q"], "gf": features["g"]}, protocol="market",
                                   metric="cosine")
    sides = {side: [arrays[f"{side}{key}"] for key in ("f", "_pids", "_camids")] for side in ("q", "g")}
    first = {"query_loader": loader(*sides["q"], 8), "gallery_loader": loader(*sides["g"], 32), "model": model,
             "epoch": 1}
    exec(loops[0], first)
    assert_same(first["result"], expected)
    both = [np.concatenate(pair) for pair in zip(sides["q"], sides["g"])]  # queries first, then the gallery
    second = {"evaluator": first["evaluator"], "model": model, "num_query": N_QUERY,
              "test_loader": loader(*both, 16)}  # batch 1 holds the last queries and the first gallery rows
    exec(loops[1], second)  # features with gradients: the evaluator detaches them
    assert_same(second["evaluator"].compute(), expected)
