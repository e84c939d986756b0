"""The drop-in adapters (docs/compat.md) against the upstream functions they replace.

tests/data/compat_upstream.npz holds small problems and what upstream returned on them, run
unmodified (tests/data/make_compat_upstream.py wrote it and says how): torchreid's
``evaluate_rank`` (KaiyangZhou/deep-person-reid f8cd150) through its Python path ("py": float64 AP)
and its Cython path ("cy": distances cast to float32, AP summed in float32), and fast-reid's
``ReidEvaluator.process / evaluate`` (JDAI-CV/fast-reid c9bc3ce, Cython path: float32) with the
per-query AP and INP of its Python path.  Its ``cases`` entry (JSON) lists each problem: name,
upstream, max_rank or num_query, metric, AQE, the scalar outputs.  Every problem's ties lie within
one class (positive or negative), where the upstream sorts cannot change a number, except
``tr_ties_across``, whose expected values are upstream's on the matrix with its ties broken by
gallery index (streameval's order).  Where torchreid or fast-reid is installed the same problems
also run live against it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import streameval
from streameval.compat import NO_VALID_QUERY, NoValidQueryError, host_array
from streameval.compat.fastreid import DatasetEvaluator, ReidEvaluator
from streameval.compat.torchreid import evaluate_rank
from streameval.core.errors import OptionError

DATA = np.load(Path(__file__).parent / "data" / "compat_upstream.npz")
CASES = {case["name"]: case for case in json.loads(str(DATA["cases"]))}
TORCHREID = [name for name, case in CASES.items() if case["upstream"] == "torchreid" and not case["cuhk03"]]
FASTREID = [name for name, case in CASES.items() if case["upstream"] == "fast-reid"]
FLOAT32_SUMS = 1e-6  # upstream's float32 accumulations (AP, CMC over repeats) against the exact values
FASTREID_KEYS = ["Rank-1", "Rank-5", "Rank-10", "mAP", "mINP", "metric"]


def torchreid_args(name: str) -> list:
    return [DATA[f"{name}__{key}"] for key in ("distmat", "q_pids", "g_pids", "q_camids", "g_camids")]


def quiet_evaluate_rank(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate_rank(*args, **kwargs)


# ------------------------------------------------------------------------------------ torchreid


@pytest.mark.parametrize("name", TORCHREID)
def test_evaluate_rank_returns_torchreids_cmc_and_map(name):
    case = CASES[name]
    cmc, mAP = quiet_evaluate_rank(*torchreid_args(name), max_rank=case["max_rank"])
    assert cmc.dtype == np.float32 and type(mAP) is float
    np.testing.assert_array_equal(cmc, DATA[f"{name}__py_cmc"])  # float32 of count / queries: the same rounding
    np.testing.assert_array_equal(cmc, DATA[f"{name}__cy_cmc"])
    assert mAP == pytest.approx(case["py_mAP"], abs=1e-12)
    assert mAP == pytest.approx(case["cy_mAP"], abs=FLOAT32_SUMS)


def test_ties_across_classes_follow_the_gallery_index():
    """The vectors of tr_ties_across are upstream's on the matrix with its ties broken by gallery
    index; on the tied matrix itself upstream's numbers are those its argsort happened to give
    (recorded: another mAP on the machine that wrote them)."""
    case = CASES["tr_ties_across"]
    assert case["tied_py_mAP"] != case["py_mAP"]  # the problem does exercise the tie rule
    cmc, mAP = evaluate_rank(*torchreid_args("tr_ties_across"), max_rank=case["max_rank"])
    np.testing.assert_array_equal(cmc, DATA["tr_ties_across__py_cmc"])
    assert mAP == pytest.approx(case["py_mAP"], abs=1e-12)


def test_a_gallery_smaller_than_max_rank_shortens_the_curve_with_torchreids_note():
    with pytest.warns(UserWarning, match="^Note: number of gallery samples is quite small, got 8$"):
        cmc, _ = evaluate_rank(*torchreid_args("tr_small_gallery"))
    assert cmc.shape == (8,)


def test_cuhk03_with_one_image_per_identity_equals_torchreid():
    """One kept image per gallery identity: the draws change nothing, so torchreid's cuhk03 CMC is
    defined; its Cython path sums tenths in float32 (1/6 reads 0.16666669)."""
    case = CASES["tr_sgs_single"]
    cmc, mAP = evaluate_rank(*torchreid_args("tr_sgs_single"), max_rank=10, use_metric_cuhk03=True)
    np.testing.assert_allclose(cmc, DATA["tr_sgs_single__cy_cmc"], rtol=0, atol=FLOAT32_SUMS)
    assert mAP == pytest.approx(case["cy_mAP"], abs=FLOAT32_SUMS)


def test_cuhk03_draws_have_torchreids_distribution():
    """torchreid draws unseeded: the vectors hold the mean of 400 of its runs (seeds 0..399) and
    the standard error.  The cuhk03-sgs preset's expected curve (the limit of infinitely many
    draws) lies within 4.5 standard errors of it; past the 7 gallery identities torchreid's
    Cython curve reads 0 (a per-query curve one entry per identity, zero-filled), streameval's 1."""
    name, identities = "tr_sgs_random", 7
    arrays = dict(zip(("distances", "q_pids", "g_pids", "q_camids", "g_camids"), torchreid_args(name)))
    assert len(np.unique(arrays["g_pids"])) == identities
    expected = streameval.evaluate(arrays, protocol="cuhk03-sgs", sgs_mode="expected", junk_pids=[], max_rank=10,
                                   no_gom=True).cmc
    mean, sem = DATA[f"{name}__cy_cmc_mean"][:identities], DATA[f"{name}__cy_cmc_sem"][:identities]
    assert np.all(np.abs(expected[:identities] - mean) <= 4.5 * sem + FLOAT32_SUMS)
    assert np.all(DATA[f"{name}__cy_cmc_mean"][identities:] == 0)
    cmc, mAP = evaluate_rank(*torchreid_args(name), max_rank=10, use_metric_cuhk03=True)
    assert np.all(cmc[identities - 1:] == 1)
    assert mAP == pytest.approx(CASES[name]["cy_mAP"], abs=FLOAT32_SUMS)


def test_cuhk03_is_the_seeded_preset():
    arrays = dict(zip(("distances", "q_pids", "g_pids", "q_camids", "g_camids"), torchreid_args("tr_sgs_random")))
    sampled = streameval.evaluate(arrays, protocol="cuhk03-sgs", junk_pids=[], max_rank=10, no_gom=True)
    cmc, mAP = evaluate_rank(*torchreid_args("tr_sgs_random"), max_rank=10, use_metric_cuhk03=True)
    np.testing.assert_array_equal(cmc, sampled.cmc.astype(np.float32))
    assert mAP == sampled.mAP


def test_pid_minus_one_is_an_ordinary_pid_as_in_torchreid():
    """torchreid's evaluation has no junk pid: a -1 query finds its -1 gallery image."""
    cmc, mAP = evaluate_rank(np.array([[0.5, 0.1]]), [-1], [-1, 3], [0], [1, 1], max_rank=2)
    assert cmc.tolist() == [0.0, 1.0] and mAP == 0.5


def test_use_cython_changes_nothing():
    args = torchreid_args("tr_float")
    assert [x.tolist() if hasattr(x, "tolist") else x for x in evaluate_rank(*args, max_rank=20, use_cython=False)] \
        == [x.tolist() if hasattr(x, "tolist") else x for x in evaluate_rank(*args, max_rank=20, use_cython=True)]


def test_torch_tensors_give_the_numpy_numbers():
    torch = pytest.importorskip("torch", reason="torch (the test extra installs the CPU build) reads tensors")
    args = torchreid_args("tr_float")
    want_cmc, want_map = evaluate_rank(*args, max_rank=20)
    cmc, mAP = evaluate_rank(*(torch.from_numpy(a) for a in args), max_rank=20)
    np.testing.assert_array_equal(cmc, want_cmc)
    assert mAP == want_map


def test_no_query_with_a_positive_fails_as_torchreid_asserts():
    with pytest.raises(AssertionError, match=f"^{NO_VALID_QUERY}$") as error:
        evaluate_rank(np.array([[0.1, 0.2]]), [1], [2, 2], [0], [1, 1], max_rank=2)
    assert isinstance(error.value, NoValidQueryError)


@pytest.mark.parametrize("name", TORCHREID)
def test_live_torchreid_agrees(name):
    rank = pytest.importorskip("torchreid.metrics.rank", reason="torchreid is not installed in this environment")
    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = torchreid_args(name)
        if name == "tr_ties_across":  # ties across classes: upstream is defined on the index-broken matrix
            source[0] = source[0] + np.arange(source[0].shape[1], dtype=np.float32) * np.float32(1e-3)
        want_cmc, want_map = rank.evaluate_rank(*source, max_rank=case["max_rank"], use_cython=False)
        cmc, mAP = quiet_evaluate_rank(*torchreid_args(name), max_rank=case["max_rank"])
    np.testing.assert_array_equal(cmc, want_cmc)
    assert mAP == pytest.approx(float(want_map), abs=1e-12)


# ------------------------------------------------------------------------------------- fast-reid


def fastreid_cfg(metric: str, aqe: bool = False, rerank: bool = False, roc: bool = False):
    """The TEST section of a fast-reid config (the attributes its ReidEvaluator reads)."""
    return SimpleNamespace(TEST=SimpleNamespace(
        METRIC=metric, ROC=SimpleNamespace(ENABLED=roc),
        AQE=SimpleNamespace(ENABLED=aqe, QE_TIME=1, QE_K=5, ALPHA=3.0),
        RERANK=SimpleNamespace(ENABLED=rerank, K1=5, K2=2, LAMBDA=0.3)))


def run_fastreid(evaluator, name: str, batches: int):
    """reset, process the problem's rows in ``batches`` batches of torch tensors, evaluate."""
    torch = pytest.importorskip("torch", reason="fast-reid's evaluator takes torch tensors")
    feats, pids, camids = (DATA[f"{name}__{key}"] for key in ("feats", "pids", "camids"))
    evaluator.reset()
    for part in np.array_split(np.arange(len(pids)), batches):
        evaluator.process({"targets": torch.from_numpy(pids[part]), "camids": torch.from_numpy(camids[part])},
                          torch.from_numpy(feats[part]))
    return evaluator.evaluate()


@pytest.mark.parametrize("name", FASTREID)
def test_reid_evaluator_returns_fastreids_results(name):
    """Keys, order and scale are fast-reid's; its values are float32 (Cython APs averaged in
    float32, Rank-k of a float32 curve), streameval's exact: they agree to float32 rounding, and
    per query to the float64 AP and INP of fast-reid's Python path."""
    case = CASES[name]
    evaluator = ReidEvaluator(fastreid_cfg(case["metric"], case["aqe"]), case["num_query"])
    results = run_fastreid(evaluator, name, case["batches"])
    assert isinstance(results, OrderedDict) and list(results) == FASTREID_KEYS
    for key in FASTREID_KEYS:
        assert results[key] == pytest.approx(case["results"][key], rel=2e-6), key
    per_query = evaluator.result.per_query
    valid = ~np.isnan(per_query["ap"])
    np.testing.assert_allclose(per_query["ap"][valid], DATA[f"{name}__py_ap"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(per_query["inp"][valid], DATA[f"{name}__py_inp"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(per_query["ap"][valid], DATA[f"{name}__cy_ap"], rtol=0, atol=FLOAT32_SUMS)


def test_the_first_num_query_rows_are_the_queries_and_metric_is_fastreids_mean():
    name = "fr_cosine"
    evaluator = ReidEvaluator(None, CASES[name]["num_query"])  # cfg None: fast-reid's defaults (cosine)
    results = run_fastreid(evaluator, name, 1)
    n = CASES[name]["num_query"]
    feats, pids, camids = (DATA[f"{name}__{key}"] for key in ("feats", "pids", "camids"))
    direct = streameval.evaluate({"qf": feats[:n], "q_pids": pids[:n], "q_camids": camids[:n], "gf": feats[n:],
                                  "g_pids": pids[n:], "g_camids": camids[n:]}, metric="cosine", junk_pids=[],
                                 max_rank=10, no_gom=True)
    assert results["Rank-5"] == direct.rank(5) * 100 and results["mINP"] == direct.mINP * 100
    assert results["metric"] == (direct.mAP + direct.rank(1)) / 2 * 100


def test_euclidean_is_fastreids_squared_distance_and_options_override_the_cfg():
    evaluator = ReidEvaluator(fastreid_cfg("euclidean"), 10, max_rank=20)
    run_fastreid(evaluator, "fr_euclidean_ties", 2)
    assert evaluator.result.metric == "sqeuclidean" and evaluator.result.max_rank == 20


def test_rerank_cfg_is_the_fastreid_flavour():
    name = "fr_cosine"
    evaluator = ReidEvaluator(fastreid_cfg("cosine", rerank=True), CASES[name]["num_query"])
    results = run_fastreid(evaluator, name, 2)
    assert evaluator.result.rerank["flavour"] == "fastreid"
    n = CASES[name]["num_query"]
    feats, pids, camids = (DATA[f"{name}__{key}"] for key in ("feats", "pids", "camids"))
    direct = streameval.evaluate({"qf": feats[:n], "q_pids": pids[:n], "q_camids": camids[:n], "gf": feats[n:],
                                  "g_pids": pids[n:], "g_camids": camids[n:]}, metric="cosine", junk_pids=[],
                                 max_rank=10, no_gom=True, rerank={"flavour": "fastreid", "k1": 5, "k2": 2,
                                                                   "lambda": 0.3})
    assert results["mAP"] == direct.mAP * 100


def test_reset_forgets_the_batches():
    evaluator = ReidEvaluator(fastreid_cfg("cosine"), CASES["fr_cosine"]["num_query"])
    first = run_fastreid(evaluator, "fr_cosine", 3)
    assert run_fastreid(evaluator, "fr_cosine", 3) == first


@pytest.mark.parametrize("cfg, num_query, match", [
    (fastreid_cfg("cosine", roc=True), 5, "TEST.ROC"),
    (fastreid_cfg("hamming"), 5, "TEST.METRIC"),
    (None, 0, "num_query"),
    (None, None, "num_query"),
])
def test_unsupported_settings_are_refused_by_name(cfg, num_query, match):
    with pytest.raises(OptionError, match=match):
        ReidEvaluator(cfg, num_query)


def test_num_query_covering_every_row_is_refused():
    evaluator = ReidEvaluator(None, 10)
    evaluator.process({"targets": np.array([1, 2]), "camids": np.array([0, 1])}, np.ones((2, 4), np.float32))
    with pytest.raises(OptionError, match="gallery is empty"):
        evaluator.evaluate()


def test_the_evaluator_has_fastreids_base_and_methods():
    assert issubclass(ReidEvaluator, DatasetEvaluator)
    assert all(callable(getattr(ReidEvaluator, m)) for m in ("reset", "process", "evaluate", "preprocess_inputs"))


@pytest.mark.parametrize("name", FASTREID)
def test_live_fastreid_agrees(name):
    reid_evaluation = pytest.importorskip("fastreid.evaluation.reid_evaluation",
                                          reason="fast-reid is not installed (or does not import) here")
    case = CASES[name]
    cfg = fastreid_cfg(case["metric"], case["aqe"])
    want = run_fastreid(reid_evaluation.ReidEvaluator(cfg, case["num_query"]), name, case["batches"])
    results = run_fastreid(ReidEvaluator(cfg, case["num_query"]), name, case["batches"])
    assert list(results) == list(want)[:len(FASTREID_KEYS)]
    for key in FASTREID_KEYS:
        assert results[key] == pytest.approx(float(want[key]), rel=2e-6), key


# ----------------------------------------------------------------------------------- the package


def test_importing_the_adapters_loads_nothing_heavy():
    """torch only through fast-reid's base class, where fast-reid is installed."""
    heavy = ("numba", "zarr", "dask") if importlib.util.find_spec("fastreid") else ("torch", "numba", "zarr", "dask")
    code = ("import sys, streameval.compat, streameval.compat.torchreid, streameval.compat.fastreid; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_host_array_takes_cpu_tensors_without_a_copy():
    torch = pytest.importorskip("torch", reason="torch (the test extra installs the CPU build) reads tensors")
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()
    values = host_array(tensor)
    assert values.dtype == np.float32 and np.shares_memory(values, tensor.detach().numpy())
    assert host_array(torch.ones(2, dtype=torch.bfloat16), np.float32).tolist() == [1.0, 1.0]


DISTRIBUTED_RANK = """
import sys, numpy as np, torch.distributed as dist
from streameval.compat.fastreid import ReidEvaluator
from streameval.core.errors import OptionError
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
evaluator = ReidEvaluator(None, 1)
evaluator.process({"targets": np.array([1, 1]), "camids": np.array([0, 1])}, np.eye(2, dtype=np.float32))
try:
    evaluator.evaluate()
except OptionError as error:
    print(error)
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes importing torch: about 10 s on 2 cores
def test_several_torch_distributed_processes_are_refused(tmp_path):
    """Two real processes in one gloo group: each holds half the batches, so each refuses."""
    pytest.importorskip("torch.distributed", reason="torch (the test extra installs the CPU build) runs the group")
    init = f"file://{tmp_path / 'rendezvous'}"
    ranks = [subprocess.Popen([sys.executable, "-c", DISTRIBUTED_RANK, init, str(rank)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert all(out.startswith("torch.distributed runs 2 processes: gather the features") for out, _ in outputs)
