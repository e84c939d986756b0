"""The suite mode of scripts/bench.py (``--suite PLAN``): a CIL-ReID corruption suite (clean + 3
settings x T trials = 1 + 3T evaluations) at Market size, side by side in one run:

* ``single``: one clean evaluation, in-process: the unit "one single pass" of the goal;
* ``suite``: ``run_suite`` of the whole plan, in-process (one pass per gallery variant);
* ``separate``: the 1 + 3T evaluations one after another, in-process (what users do today);
* ``floor``: the bare GEMM of one evaluation (bench.py's floor method): every evaluation needs its
  own query x gallery GEMM, so (1 + 3T) x floor bounds the suite from below;
* ``single-cli`` and ``suite-cli``: the same as the command-line processes a user runs (start-up
  included).

The goal (issue 14): the suite within (distinct gallery variants + 1) single passes.
"""

from __future__ import annotations

SUITE_METHODS = ("single", "suite", "separate", "floor", "single-cli", "suite-cli")
SUITE_CHILDREN = ("suite-single", "suite-run", "suite-separate")
SUITE_SIZE = "3368x19732x2048"
SUITE_OPTIONS = {"no_gom": True, "max_rank": 50}  # upstream's metrics: market, CMC to 50, mINP, no GOM


def run_child_method(args) -> dict:
    """One in-process method (in its own child process, timed by bench.timed_runs)."""
    import streameval
    from bench import timed_runs, warm_jit
    from streameval.suite import plan as suite_plan

    warm, note = warm_jit(args.metric, SUITE_OPTIONS)
    suite = suite_plan.load_suite(args.suite, trials=args.trials, metric=args.metric, **SUITE_OPTIONS)

    def single():
        return streameval.evaluate(args._store, metric=args.metric, **SUITE_OPTIONS), None

    def whole():
        result = streameval.run_suite(args._store, suite)
        return result, dict(result.execution)

    def separate():
        results = [streameval.evaluate(args._store, metric=args.metric, query_variant=ev.query,
                                       gallery_variant=ev.gallery, **SUITE_OPTIONS) for ev in suite.evaluations]
        return results, {"evaluations": len(results)}

    fn = {"suite-single": single, "suite-run": whole, "suite-separate": separate}[args._run]
    out = timed_runs(fn, args.repeat)
    result = out.pop("result")
    out["warmup"], out["warmup_s"] = note, warm
    if args._run == "suite-run":
        out["values"] = [r.mAP for r in result.results]
    elif args._run == "suite-separate":
        out["values"] = [r.mAP for r in result]
    return out


def cli_commands(store_path: str, args) -> dict:
    from bench import streameval_command

    base = streameval_command()
    return {"single-cli": base + ["eval", store_path, "--no-gom", "-q", "--metric", args.metric],
            "suite-cli": base + ["suite", store_path, args.suite, "--trials", str(args.trials), "-q", "--metric",
                                 args.metric]}


def run_suite_mode(args, size, store_path: str, how: str) -> dict:
    """Every method side by side, the table and the ratios."""
    from bench import best_process_time, run_child
    from streameval.suite.plan import load_suite

    suite = load_suite(args.suite, trials=args.trials)
    children = {"single": "suite-single", "suite": "suite-run", "separate": "suite-separate", "floor": "floor"}
    commands = cli_commands(store_path, args)
    rows = {}
    for method in args.methods:
        if method in children:
            rows[method] = run_child(args, children[method], store_path)
        else:
            rows[method] = best_process_time(commands[method], args.repeat)
    n_eval, n_gallery = len(suite.evaluations), len(suite.groups())
    print(f"=== suite {args.suite}, T = {args.trials}: {n_eval} evaluations, {n_gallery} gallery variants, "
          f"size {size[0]}x{size[1]}x{size[2]} (store {how}) ===")
    print(f"{'method':<12}{'time (s)':>10}{'peak RSS (MB)':>15}")
    for name, row in rows.items():
        if "time_s" not in row:
            print(f"{name:<12}{'failed':>10}  {row.get('error', '')}")
            continue
        rss = row.get("peak_rss_mb")
        print(f"{name:<12}{row['time_s']:>10.2f}{'' if rss is None else f'{rss:>15.0f}'}")
    ratios = suite_ratios(rows, n_eval, n_gallery)
    agree = rows.get("suite", {}).get("values") == rows.get("separate", {}).get("values")
    if "values" in rows.get("suite", {}) and "values" in rows.get("separate", {}):
        print(f"agreement suite vs separate evaluations (mAP of each): {'identical' if agree else 'DIFFER'}")
    print()
    return {"size": dict(zip(("n_query", "n_gallery", "dim", "n_ids"), size)), "store": store_path, "plan": args.suite,
            "trials": args.trials, "evaluations": n_eval, "gallery_variants": n_gallery, "rows": rows,
            "ratios": ratios, "agree": agree}


def suite_ratios(rows: dict, n_eval: int, n_gallery: int) -> list:
    def time_of(name):
        return rows.get(name, {}).get("time_s")

    goal = n_gallery + 1
    lines = [
        ("suite", "single", f"the suite in single passes (goal <= {goal}: distinct gallery variants + 1)", goal),
        ("separate", "suite", f"speed-up over {n_eval} separate evaluations", None),
        ("suite-cli", "single-cli", f"the suite's process in single eval processes (goal <= {goal})", goal),
    ]
    out = []
    print("ratios:")
    for top, bottom, what, limit in lines:
        if time_of(top) is None or time_of(bottom) is None:
            continue
        ratio = time_of(top) / time_of(bottom)
        verdict = "" if limit is None else f"  ({'met' if ratio <= limit else 'NOT met'})"
        print(f"  {top + ' / ' + bottom:<24}{ratio:>8.2f}  {what}{verdict}")
        out.append({"numerator": top, "denominator": bottom, "ratio": ratio, "goal": limit})
    if time_of("floor") is not None and time_of("single") is not None:
        floor = n_eval * time_of("floor") / time_of("single")
        print(f"  {n_eval} x floor / single      {floor:>8.2f}  the GEMMs alone ({n_eval} query x gallery GEMMs, "
              "one per evaluation), in single passes: a lower bound of the suite")
        out.append({"numerator": f"{n_eval} x floor", "denominator": "single", "ratio": floor, "goal": None})
    return out

