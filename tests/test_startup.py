"""What a user waits for before the first number: imports, and numba loading the kernels.

* ``import streameval`` and ``streameval --help`` load none of the heavy libraries.
* An evaluation loads each kernel it calls once, from numba's cache, in one specialisation per
  working precision: no call compiles another one (seconds) because an argument's type drifted,
  whatever the metric, GOM mode or path (evaluate, update), and kernels the options do not use are
  not loaded at all.

Each check runs in a fresh process, as a user's run does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("numba", "zarr", "dask", "distributed", "matplotlib")
ENTRY_POINTS = ("engine.kernels.row_terms", "engine.kernels.pair_distances", "engine.kernels.distance_range",
                "features.closed_set.slots.update_slots", "features.gom.statistic.update_hist",
                "engine.kernels.rank_summaries", "engine.kernels.gom_curves")
WORKING_PRECISION = ENTRY_POINTS[:5]  # kernels with an argument in the working precision


def run_python(code: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


LOADED_HEAVY = f"json.dumps(sorted(name for name in {HEAVY!r} if name in sys.modules))"


def test_import_and_help_load_no_heavy_library():
    assert json.loads(run_python(f"import json, sys, streameval; print({LOADED_HEAVY})")) == []
    help_output = run_python(f"""
        import atexit, json, sys
        atexit.register(lambda: print({LOADED_HEAVY}))
        from streameval.entry import main
        sys.argv = ["streameval", "--help"]
        main()
    """)
    assert "Usage: streameval" in help_output
    assert json.loads(help_output.splitlines()[-1]) == []


EVALUATIONS = """
    import importlib, json, os, sys, tempfile
    import numpy as np
    import streameval

    rng = np.random.default_rng(0)
    nq, ng, dim = 12, 90, 6
    problem = dict(qf=rng.standard_normal((nq, dim), dtype=np.float32), q_pids=rng.integers(1, 5, nq),
                   q_camids=rng.integers(0, 2, nq), gf=rng.standard_normal((ng, dim), dtype=np.float32),
                   g_pids=rng.integers(-1, 6, ng), g_camids=rng.integers(0, 2, ng))
    with tempfile.TemporaryDirectory() as tmp:
        store, state = os.path.join(tmp, "s.zarr"), os.path.join(tmp, "state")
        streameval.write_store(store, problem["qf"], problem["q_pids"], problem["q_camids"], problem["gf"],
                               problem["g_pids"], problem["g_camids"])
        for options in json.loads(sys.argv[1]):
            streameval.evaluate(store, state=state, overwrite_state=True, **options)
            streameval.append_gallery(store, problem["gf"][:9], problem["g_pids"][:9], problem["g_camids"][:9])
            streameval.update(store, state)
    def kernel(path):
        module, name = path.rsplit(".", 1)
        return getattr(importlib.import_module("streameval." + module), name)

    print(json.dumps({path: [str(types) for types in kernel(path).signatures] for path in sys.argv[2:]}))
"""


def loaded_signatures(runs: list) -> dict:
    """Each entry point's loaded specialisations after evaluating and updating with each of ``runs``."""
    return json.loads(run_python(EVALUATIONS, json.dumps(runs), *ENTRY_POINTS))


def test_each_kernel_is_loaded_once_per_working_precision():
    loaded = loaded_signatures([
        {"precision": "float32", "metric": "cosine"}, {"precision": "float32", "gom_norm": "fixed:0:3"},
        {"precision": "float32", "gom_norm": "none", "metric": "sqeuclidean"}, {"precision": "float64"},
        {"precision": "float64", "no_gom": True, "metric": "euclidean"},
    ])
    for name in WORKING_PRECISION:
        assert len(loaded[name]) == 2, (name, loaded[name])
        assert sorted("float32" in types for types in loaded[name]) == [False, True], loaded[name]
    for name in ("engine.kernels.rank_summaries", "engine.kernels.gom_curves"):  # no argument in the working precision
        assert len(loaded[name]) == 1, (name, loaded[name])


def test_closed_set_evaluation_loads_no_gom_kernel():
    loaded = loaded_signatures([{"no_gom": True}])
    gom = ("engine.kernels.gom_curves", "engine.kernels.distance_range", "features.gom.statistic.update_hist")
    assert all(loaded[name] == [] for name in gom)
    assert all(len(loaded[name]) == 1 for name in ENTRY_POINTS if name not in gom)
