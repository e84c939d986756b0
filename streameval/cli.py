"""Command line: ``streameval eval | update | append | synth | convert | validate | plot | aggregate |
protocols``.

Errors in the input end as one line on stderr and a non-zero exit code (2: bad option,
3: bad store or data, 4: cluster), never as a traceback.  Every output path is checked before any
work starts (``outputs``).  The engine (numpy, numba, zarr, dask) is imported inside the commands,
so ``--help`` answers at once.
"""

from __future__ import annotations

import json
import sys
import time

import click

from . import outputs
from .choices import METRICS, PRECISIONS
from .errors import StreamevalError
from .plan import parse_bytes

EXIT_INTERRUPTED = 130  # the shell's convention for Ctrl-C


class _Group(click.Group):
    """Every failure as one ``error:`` line and its exit code: StreamevalError, Ctrl-C, the file
    system, and click's own usage errors (which it would print as a usage block)."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.ClickException as exc:
            command = f" (see '{exc.ctx.command_path} --help')" if getattr(exc, "ctx", None) else ""
            click.echo(f"error: {exc.format_message()}{command}", err=True)
            code = exc.exit_code
        except click.Abort:  # Ctrl-C at a confirmation prompt
            click.echo("error: interrupted (Ctrl-C)", err=True)
            code = EXIT_INTERRUPTED
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except StreamevalError as exc:
            _fail(ctx, str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail(ctx, "interrupted (Ctrl-C); outputs already written are complete, nothing was half-written",
                  EXIT_INTERRUPTED)
        except MemoryError:
            _fail(ctx, "out of memory; lower --memory-budget (or --query-block / --gallery-chunk)", 3)
        except OSError as exc:  # the file system refused (full disk, permissions) outside a checked write
            where = f" '{exc.filename}'" if exc.filename else ""
            _fail(ctx, f"{exc.strerror or exc}{where}", 3)


def _fail(ctx, message: str, code: int):
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="streameval")
def main():
    """Exact out-of-core ReID evaluation over chunked zarr features.

    CMC, mAP, mINP and the GOM open-set metrics (mReP, mFR, MREP, MFR, ...), computed by streaming
    the gallery in chunks: the query x gallery distance matrix is never built.

    \b
    Typical session:
      streameval synth demo.zarr --queries 3368 --gallery 19732 --dim 2048
      streameval eval demo.zarr --json result.json
      streameval plot result.json result.png

    Metric definitions and options explained: docs/metrics.md and docs/options.md in the repository.
    """


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _bytes(ctx, param, value):
    try:
        return parse_bytes(value)
    except StreamevalError as exc:
        raise click.BadParameter(str(exc)) from None


def _key_values(ctx, param, values):
    """KEY=VALUE pairs to a dict; true/false/numbers become Python values (fsspec expects them typed)."""
    options = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        options[key] = {"true": True, "false": False}.get(raw.lower(), _number_or_text(raw))
    return options


def _number_or_text(raw: str):
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _options(*decorators):
    """Apply click option decorators in the order listed (as if stacked above a command)."""
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


def _result_options(defaults: bool):
    """The options that decide the numbers (METRICS.md section 5).  ``defaults``: eval's defaults;
    otherwise None, meaning "as recorded in the state" (update)."""
    def option(*names, default=None, help, **kwargs):
        if not defaults:
            default, help = None, help + " Default: as in the state."
        return click.option(*names, default=default, show_default=defaults and default is not None, help=help,
                            **kwargs)

    return _options(
        option("--metric", type=click.Choice(METRICS),
               help="Distance." + (" Default: the store's default_metric attribute (euclidean if unset)." if defaults
                                   else "")),
        option("--protocol", default="market", metavar="NAME|FILE",
               help="Who is scored against whom: a preset ('streameval protocols' lists them: market, none, "
                    "cuhk03-sgs, sysu-all, sysu-indoor, regdb, vehicleid, mars, ...) or a .toml/.json protocol file "
                    "(docs/protocols.md)."),
        option("--junk-pids", callback=_int_list,
               help="Comma-separated pids ignored by the ranking. Default: the protocol's (Market-1501 junk is -1)."),
        option("--denominator", type=click.Choice(["skip", "zero"]),
               help="Queries without a positive: skip them (default of the protocols) or count them as 0 (layumi's scripts)."),
        option("--cmc", type=click.Choice(["first-hit", "identity-dedup"]),
               help="CMC flavour. Default: the protocol's (identity-dedup for SYSU-MM01)."),
        option("--trials", type=click.IntRange(min=0),
               help="Number of gallery trials (masks over one pass; 0: none). Default: the protocol's (10 for SYSU, VehicleID)."),
        option("--trial-source", metavar="draw|official:PATH|mangye16-random",
               help="Where trial galleries come from: seeded draws, an official permutation table, or mangye16's random."),
        option("--shots", type=click.IntRange(min=1), help="Gallery rows per group in each trial (SYSU multi-shot: 10)."),
        option("--seed", type=int, help="Seed of the trial and sgs draws (hash-based: the same for any chunking)."),
        option("--sgs-mode", type=click.Choice(["sampled", "expected", "both"]),
               help="cuhk03-sgs: sampled repeats, the exact expectation over all draws, or both."),
        option("--sgs-repeats", type=click.IntRange(min=1), help="cuhk03-sgs: sampled repeats (default 10)."),
        option("--camera-rule", type=click.Choice(["same-id-same-cam", "separate-cameras"]),
               help="cuhk03-sgs: torchreid's rule (default) or open-reid's separate camera sets."),
        option("--direction", type=click.Choice(["both", "v2t", "t2v"]), help="regdb: which directions to run (default both)."),
        option("--max-rank", type=click.IntRange(min=1), default=50, help="Length of the CMC curve."),
        option("--precision", type=click.Choice(PRECISIONS), default="float32",
               help="Precision of the distance GEMM (features are upcast per chunk)."),
        option("--no-gom", is_flag=True, default=False,
               help="Skip the GOM open-set metrics (closed-set metrics only, one pass)."),
        option("--gom-norm", default="minmax",
               help="GOM distance normalisation: minmax (global min/max, an extra pass), fixed:LO:HI "
                    "(e.g. fixed:0:2 for cosine, one pass) or none (distances already in [0, 1])."),
        option("--gom-bins", type=click.IntRange(min=1), default=100, help="Threshold grid size N: tau = 0, 1/N, ..., 1."),
        option("--gom-b", type=click.IntRange(min=1), default=3000,
               help="FR cap B: FR = min(returned, B) / B for open-set queries."),
        option("--gom-vp", type=click.Choice(["reference", "jaccard"]), default="reference",
               help="VP as the GOM reference code (returns capped at the last positive) or the paper's Jaccard index."),
        option("--std-ddof", type=click.Choice(["1", "0"]), default="1",
               help="Trials' std: 1 = sample standard deviation (MATLAB, R, pandas), 0 = numpy's default."),
    )


_execution_options = _options(
    click.option("--query-block", type=click.IntRange(min=1), default=None,
                 help="Queries per task. Default: all queries if the memory budget allows (gallery read once)."),
    click.option("--gallery-chunk", type=click.IntRange(min=1), default=None,
                 help="Gallery rows per task. Default: from --memory-budget, aligned to store chunks."),
    click.option("--memory-budget", default="1GiB", show_default=True, callback=_bytes,
                 help="Working memory the chunk sizes are planned for."),
    click.option("--workers", type=click.IntRange(min=1), default=None,
                 help="Tasks run at once (threads of the default scheduler). Default: all cores / all cluster threads."),
    click.option("--scheduler", default=None, metavar="ADDRESS",
                 help="Run on an existing Dask cluster: its scheduler address, e.g. tcp://10.0.0.5:8786."),
    click.option("--scheduler-file", type=click.Path(), default=None,
                 help="Run on the Dask cluster whose scheduler wrote this file (dask scheduler --scheduler-file)."),
    click.option("--cluster", type=click.Choice(["local"]), default=None,
                 help="Start a LocalCluster of worker processes for this run."),
    click.option("--n-workers", type=click.IntRange(min=1), default=None, help="LocalCluster worker processes."),
    click.option("--threads-per-worker", type=click.IntRange(min=1), default=None,
                 help="LocalCluster threads per worker."),
    click.option("--memory-limit", default=None, help="LocalCluster memory limit per worker (e.g. 4GiB)."),
    click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=15.0, show_default=True,
                 help="Seconds to wait for a cluster's scheduler and first worker."),
    click.option("-S", "--storage-option", "storage_options", multiple=True, callback=_key_values,
                 metavar="KEY=VALUE",
                 help="fsspec storage option for a URL store (s3://...), repeatable, e.g. -S anon=true."),
)

_output_options = _options(
    click.option("--json", "json_path", type=click.Path(), default=None,
                 help="Write the full result as JSON to this file ('-' for stdout)."),
    click.option("--per-query", is_flag=True,
                 help="Include per-query AP, INP, first-hit rank, #positives in the JSON."),
    click.option("--quiet", "-q", is_flag=True, help="Print no progress and no summary table."),
)


def _finish(result, label, json_path, per_query, quiet) -> None:
    """Write the JSON (timed as its own phase), then print the summary.  If the JSON cannot be
    written, the summary is still printed and the error names the fallback file that holds it."""
    from . import report

    failure = None
    if json_path:
        started = time.perf_counter()
        failure = _write_json(result.to_dict(per_query=per_query), json_path, "result")
        result.add_phase("writing JSON", time.perf_counter() - started)
    if not quiet:
        # with JSON on stdout, the table goes to stderr so the JSON stays parseable
        click.echo(report.summary(result, label), err=json_path == "-")
    if failure is not None:
        raise failure


def _write_json(data: dict, json_path: str, what: str):
    """``data`` as JSON to ``json_path`` ('-': standard output).  Returns the OutputError naming the
    fallback file when it could not be written there (the caller still prints its summary first)."""
    text = json.dumps(data, indent=2) + "\n"
    if json_path == "-":
        click.echo(text, nl=False)
        return None
    try:
        outputs.write_text(json_path, text, what)
    except outputs.OutputError as exc:
        return exc
    return None


@main.command("eval")
@click.argument("store", type=click.Path())
@_result_options(defaults=True)
@_execution_options
@_output_options
@click.option("--state", type=click.Path(file_okay=False), default=None,
              help="Also save the per-query state to this directory, for 'streameval update' after appends.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file or --state.")
def eval_cmd(store, json_path, per_query, quiet, state, overwrite, **options):
    """Evaluate STORE's queries against its gallery, streaming the gallery in chunks."""
    outputs.check_file(json_path, overwrite, "--json file")
    from .evaluate import evaluate  # checks --state before any work

    options["std_ddof"] = int(options["std_ddof"])
    result = evaluate(store, progress=not quiet, state=state, overwrite_state=overwrite, **options)
    _finish(result, store, json_path, per_query, quiet)


@main.command()
@click.argument("store", type=click.Path())
@click.option("--state", type=click.Path(file_okay=False), required=True,
              help="The state saved by 'streameval eval --state' (or a previous update); updated in place, atomically.")
@_result_options(defaults=False)
@_execution_options
@_output_options
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file.")
def update(store, state, json_path, per_query, quiet, overwrite, **options):
    """Score only the gallery rows appended to STORE since --state was saved, and report.

    The result equals a full 'streameval eval'.  Queries that got new positives are re-scored over
    the old rows too; with minmax GOM normalisation, a new global minimum or maximum distance moves
    every threshold, so then every query is (the summary says so).  Options that change the counts
    must match the state's; --max-rank, --gom-b and --gom-vp may differ.
    """
    outputs.check_file(json_path, overwrite, "--json file")
    options["no_gom"] = options["no_gom"] or None  # an absent flag means "as in the state"
    options["std_ddof"] = None if options["std_ddof"] is None else int(options["std_ddof"])
    from .incremental import update as update_state

    result = update_state(store, state, progress=not quiet, **options)
    _finish(result, store, json_path, per_query, quiet)


@main.command()
@click.argument("store", type=click.Path())
@click.argument("input_npz", type=click.Path(exists=True, dir_okay=False))
def append(store, input_npz):
    """Append the gallery rows of INPUT_NPZ to STORE.

    \b
    Expected arrays (long or short names):
      gallery_features | gf    gallery_pids | g_pids    gallery_camids | g_camids

    Rows are checked before the store is touched and become visible only once all are written: an
    interrupted append leaves the store as it was.  Then 'streameval update STORE --state STATE'
    scores just the new rows.
    """
    from .convert import append_npz
    from .report import store_summary
    from .store import open_store

    before = len(open_store(store).gallery)
    opened = append_npz(input_npz, store)
    click.echo(f"appended {len(opened.gallery) - before:,} rows: " + store_summary(opened))


@main.command()
@click.argument("out", type=click.Path())
@click.option("--queries", type=click.IntRange(min=1), default=3368, show_default=True, help="Number of queries.")
@click.option("--gallery", type=click.IntRange(min=1), default=19732, show_default=True, help="Gallery rows.")
@click.option("--dim", type=click.IntRange(min=1), default=2048, show_default=True, help="Feature dimension.")
@click.option("--ids", type=click.IntRange(min=1), default=750, show_default=True, help="Identities shared by query and gallery.")
@click.option("--cams", type=click.IntRange(min=1), default=6, show_default=True, help="Cameras.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--junk", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of gallery rows that are junk (pid -1).")
@click.option("--distractors", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of gallery rows that are distractors (pid 0, no identity).")
@click.option("--open-queries", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of queries whose identity has no gallery image.")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per zarr chunk. Default: about 8 MiB of features per chunk.")
@click.option("--metric", type=click.Choice(METRICS), default="euclidean", show_default=True,
              help="Default distance recorded in the store.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def synth(out, queries, gallery, dim, ids, cams, seed, junk, distractors, open_queries, dtype, chunk_rows,
          metric, overwrite, quiet):
    """Write a synthetic ReID-like store (clustered identities, camera shifts), chunk by chunk.

    Memory stays bounded by one chunk, so galleries of millions of rows can be generated.
    """
    outputs.check_directory(out, overwrite, "store")
    from .report import store_summary
    from .store import open_store
    from .synth import synthesize

    synthesize(
        out, n_query=queries, n_gallery=gallery, dim=dim, n_ids=ids, n_cams=cams, seed=seed,
        junk_frac=junk, distractor_frac=distractors, open_query_frac=open_queries, dtype=dtype,
        chunk_rows=chunk_rows, default_metric=metric, overwrite=overwrite, progress=not quiet,
    )
    if not quiet:
        click.echo(store_summary(open_store(out)))


@main.command()
@click.argument("input_npz", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path())
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default=None,
              help="Stored feature dtype. Default: float16 if the input is float16, else float32.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per zarr chunk. Default: about 8 MiB of features per chunk.")
@click.option("--metric", type=click.Choice(METRICS), default="euclidean", show_default=True,
              help="Default distance recorded in the store.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def convert(input_npz, out, dtype, chunk_rows, metric, overwrite):
    """Convert an .npz of query/gallery features and ids into a store.

    \b
    Expected arrays (long or short names):
      query_features   | qf          gallery_features | gf
      query_pids       | q_pids      gallery_pids     | g_pids
      query_camids     | q_camids    gallery_camids   | g_camids
    """
    outputs.check_directory(out, overwrite, "store")
    from .convert import convert_npz
    from .report import store_summary

    store = convert_npz(input_npz, out, dtype=dtype, chunk_rows=chunk_rows, default_metric=metric, overwrite=overwrite)
    click.echo(store_summary(store))


@main.command()
@click.argument("result_json", type=click.Path(exists=True, dir_okay=False))
@click.argument("out_png", type=click.Path())
@click.option("--overwrite", is_flag=True, help="Replace OUT_PNG if it exists.")
def plot(result_json, out_png, overwrite):
    """Draw the CMC curve and the GOM mReP / mFR curves (tau_max marked) of an eval --json result.

    Needs matplotlib: in the streameval clone, .venv/bin/pip install -e '.[plot]' (scripts/demo does).
    """
    outputs.check_file(out_png, overwrite, "plot file")
    from . import plot as plot_mod

    plot_mod.plot_result(result_json, out_png)
    click.echo(f"wrote {out_png}")


@main.command()
@click.argument("store", type=click.Path())
def validate(store):
    """Check STORE's structure and read every chunk: missing chunk files, checksum mismatches
    (damaged files), NaN or inf features and reserved ids are reported."""
    from .report import store_summary
    from .store import open_store, validate_values

    opened = open_store(store)
    validate_values(opened)
    click.echo(store_summary(opened))
    click.echo("ok: structure and values are valid")


@main.command("aggregate")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--label", "labels", multiple=True,
              help="Name of a run in the table and the JSON, once per RUN, in order. Default: the file names without .json.")
@click.option("--json", "json_path", type=click.Path(), required=True,
              help="Write the aggregate (the result JSON schema plus 'aggregate') to this file ('-' for stdout).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file.")
def aggregate_cmd(runs, labels, json_path, overwrite):
    """Combine the results of separate evaluations (one per split, e.g. RegDB's 10) into the mean,
    std (ddof 1), sem, min, max and count of every metric and curve point, each run counting once.

    Every option that decides the numbers (metric, protocol, max rank, junk pids, precision, GOM
    settings, ...) must match; the stores, their sizes and the execution may differ.
    """
    outputs.check_file(json_path, overwrite, "--json file")
    from .aggregate import aggregate, check_compatible, load_runs, summary

    loaded = load_runs(runs, labels)
    for warning in check_compatible(loaded):
        click.echo(f"warning: {warning}", err=True)
    out = aggregate(loaded)
    failure = _write_json(out, json_path, "aggregate")
    click.echo(summary(out), err=json_path == "-")
    if failure is not None:
        raise failure


@main.command("protocols")
@click.option("--show", metavar="NAME|FILE", default=None,
              help="Print the record a preset name, alias or protocol file (.toml / .json) resolves to, as JSON.")
def protocols_cmd(show):
    """List the protocol presets: what published numbers each reproduces, and the code it follows.

    A preset name, an alias or a protocol file goes to --protocol.  Fields, presets, trials and
    protocol files are explained in docs/protocols.md in the repository.
    """
    from . import protocols  # light: no numpy, so the listing is instant

    if show is not None:
        click.echo(json.dumps(protocols.resolve(show).to_record(), indent=2))
        return
    blocks = []
    for name, aliases, reproduces, reference in protocols.presets_table():
        also = f" (aliases: {', '.join(aliases)})" if aliases else ""
        blocks.append(f"{name}{also}\n  reproduces: {reproduces}\n  reference:  {reference}")
    click.echo("\n\n".join(blocks))
    click.echo("\nYour own protocol: a .toml or .json file (docs/protocols.md); "
               "'streameval protocols --show NAME' prints a preset's record, a starting point for one.")


if __name__ == "__main__":
    main()
