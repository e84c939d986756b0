"""Command line: ``streameval eval | update | append | synth | convert | validate | plot | show | aggregate |
compare | protocols | warmup``.

Errors in the input end as one line on stderr and a non-zero exit code (2: bad option,
3: bad store or data, 4: cluster), never as a traceback.  Every output path is checked before any
work starts (``outputs``).  The engine (numpy, numba, zarr, dask) is imported inside the commands,
so ``--help`` answers at once.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import warnings

import click

from .core import outputs
from .core.choices import MAX_RANK_LIMIT, METRICS, PAIRED_TESTS, PASTE_FORMATS, PRECISIONS, RANGES, SUMMARY_FORMATS
from .core.errors import StoreWarning, StreamevalError
from .features import REGISTRY
from .engine.plan import SIZE_UNITS, parse_bytes
from .core.signals import raise_if_stopped, stopped
from .suite.plan import PRESETS as SUITE_PRESETS


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
            what, code = stopped(KeyboardInterrupt())
            click.echo(f"error: {what}", err=True)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", StoreWarning)  # once per store: store.layout.warn_once
                warnings.showwarning = _show_warning
                result = super().invoke(ctx)
            raise_if_stopped()  # a Ctrl-C a finaliser swallowed (``signals``) still stops the command
            return result
        except StreamevalError as exc:
            _fail(ctx, str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM under the console script (``signals``)
            what, code = stopped(exc)
            _fail(ctx, f"{what}; outputs already written are complete, nothing was half-written", code)
        except MemoryError:
            _fail(ctx, "out of memory; lower --memory-budget (or --query-block / --gallery-chunk)", 3)
        except OSError as exc:  # the file system refused (full disk, permissions) outside a checked write
            where = f" '{exc.filename}'" if exc.filename else ""
            _fail(ctx, f"{exc.strerror or exc}{where}", 3)


_PYTHON_SHOWWARNING = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """StoreWarning as one ``warning:`` line; other warnings as Python prints them."""
    if issubclass(category, StoreWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


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
      streameval warmup                 (once after installing: compiles the kernels)
      streameval synth demo.zarr --queries 3368 --gallery 19732 --dim 2048
      streameval eval demo.zarr --json result.json
      streameval plot result.json result.png

    Metric definitions and options explained: docs/metrics.md and docs/options.md in the repository.
    """


class Bounded(click.ParamType):
    """A numeric option read whole (any number of digits; nan and inf for floats) and refused
    outside its declared range (``choices.RANGES[key]``) before the command runs."""

    def __init__(self, key: str):
        self.bounds = RANGES[key]
        self.name = "integer" if self.bounds.integer else "float"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default
            return value
        try:
            number = int(value) if self.bounds.integer else float(value)
        except ValueError:
            self.fail(f"{value!r} is not {'an integer' if self.bounds.integer else 'a number'}", param, ctx)
        refusal = self.bounds.refusal(number)
        if refusal:
            self.fail(refusal, param, ctx)
        return number


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _rank_list(ctx, param, value):
    ranks = _int_list(ctx, param, value)
    if ranks is not None and not (ranks and not any(map(RANGES["max_rank"].refusal, ranks))):
        raise click.BadParameter(f"expected ranks from 1 to {MAX_RANK_LIMIT:,}, comma-separated, got {value!r}")
    return ranks


def _bytes(ctx, param, value):
    """A SIZE option in bytes, in its declared range (``choices.RANGES``)."""
    if value is None:  # an option left out
        return None
    try:
        size = parse_bytes(value)
    except StreamevalError as exc:
        raise click.BadParameter(str(exc)) from None
    refusal = RANGES[param.name].refusal(size)
    if refusal:
        raise click.BadParameter(refusal)
    return size


def _key_values(ctx, param, values):
    """KEY=VALUE pairs to a dict; true/false/numbers become Python values (fsspec expects them typed)."""
    options = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        options[key] = {"true": True, "false": False}.get(raw.lower(), _number_or_text(raw))
    return options


def _variant_options(ctx, param, values):
    """NAME=FILE items to {name: file} (each name once); names are checked where they are stored."""
    files = {}
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=FILE, got {item!r}")
        if name in files:
            raise click.BadParameter(f"the variant {name!r} is given twice")
        files[name] = path
    return files


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


SECTIONS = ("Metrics", "Protocol", "Open-set & verification", "Ranked lists", "Re-ranking", "Execution", "Output", "Reading")
OTHER_SECTION = "Options"  # the command's own options (no section), --help among them


def _section(title: str, *decorators):
    """``_options`` whose options ``--help`` lists under the heading ``title`` (a command of class
    ``_Sectioned``); an option already given a section by an inner group keeps it."""
    def apply(f):
        before = len(getattr(f, "__click_params__", ()))
        f = _options(*decorators)(f)
        for param in f.__click_params__[before:]:
            if not hasattr(param, "help_section"):
                param.help_section = title
        return f
    return apply


class _Sectioned(click.Command):
    """--help lists the options by section (``_section``; click has no option groups of its own):
    first the command's own options under "Options", then SECTIONS in that order, then the others
    as they come."""

    def format_options(self, ctx, formatter):
        sections: dict = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):  # arguments are in the usage line
                sections.setdefault(getattr(param, "help_section", OTHER_SECTION), []).append(record)
        order = [OTHER_SECTION, *SECTIONS] + [t for t in sections if t not in SECTIONS + (OTHER_SECTION,)]
        for title in filter(sections.__contains__, order):
            with formatter.section(title):
                formatter.write_dl(sections[title])


def _result_options(defaults: bool, features=REGISTRY):
    """The options that decide the numbers (docs/options.md), the ``features``' included.
    ``defaults``: eval's defaults; otherwise None, meaning "as recorded in the state" (update)."""
    def option(*names, default=None, help, **kwargs):
        if not defaults:
            default, help = None, help + " Default: as in the state."
        return click.option(*names, default=default, show_default=defaults and default is not None, help=help,
                            **kwargs)

    metrics = _section(
        "Metrics",
        option("--metric", type=click.Choice(METRICS),
               help="Distance." + (" Default: the store's default_metric attribute (euclidean if unset)." if defaults
                                   else "")),
        option("--max-rank", type=Bounded("max_rank"), default=50, help="Length of the CMC curve."),
        option("--precision", type=click.Choice(PRECISIONS), default="float32",
               help="Precision of the distance GEMM (features are upcast per chunk)."),
        *(_flag(flag, defaults) for feature in features if feature.help_section == "Metrics" for flag in feature.flags),
        option("--std-ddof", type=click.Choice(["1", "0"]), default="1",
               help="Trials' std: 1 = sample standard deviation (MATLAB, R, pandas), 0 = numpy's default."),
    )
    protocol = _section(
        "Protocol",
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
        option("--trials", type=Bounded("trials"),
               help="Number of gallery trials (masks over one pass; 0: none). Default: the protocol's (10 for SYSU, VehicleID)."),
        option("--trial-source", metavar="draw|official:PATH|mangye16-random",
               help="Where trial galleries come from: seeded draws, an official permutation table, or mangye16's random."),
        option("--shots", type=Bounded("shots"), help="Gallery rows per group in each trial (SYSU multi-shot: 10)."),
        option("--seed", type=Bounded("seed"), help="Seed of the trial and sgs draws (hash-based: the same for any chunking)."),
        option("--sgs-mode", type=click.Choice(["sampled", "expected", "both"]),
               help="cuhk03-sgs: sampled repeats, the exact expectation over all draws, or both."),
        option("--sgs-repeats", type=Bounded("sgs_repeats"), help="cuhk03-sgs: sampled repeats (default 10)."),
        option("--camera-rule", type=click.Choice(["same-id-same-cam", "separate-cameras"]),
               help="cuhk03-sgs: torchreid's rule (default) or open-reid's separate camera sets."),
        option("--direction", type=click.Choice(["both", "v2t", "t2v"]), help="regdb: which directions to run (default both)."),
    )
    groups = [_section(feature.help_section, *(_flag(flag, defaults) for flag in feature.flags))
              for feature in features if feature.help_section != "Metrics"]
    return _options(metrics, protocol, *groups)


def _flag(flag, defaults: bool):
    """A feature's Flag as a click option; ``defaults`` as ``_result_options``'."""
    default, help = flag.default, flag.help
    if not defaults and default is not None:
        default, help = None, help + " Default: as in the state."
    kind = flag.kind
    made = ({"is_flag": True} if kind == "flag" else {"type": Bounded(flag.name[2:].replace("-", "_"))}
            if kind == "count" else {"callback": _bytes} if kind == "size" else {"type": click.Path()}
            if kind == "path" else {"type": click.Choice(kind)} if isinstance(kind, tuple) else {})
    return click.option(flag.name, default=default, show_default=defaults and default is not None, help=help,
                        metavar=flag.metavar, **made)


_execution_options = _section(
    "Execution",
    click.option("--query-block", type=Bounded("query_block"), default=None,
                 help="Queries per task. Default: all queries if the memory budget allows (gallery read once)."),
    click.option("--gallery-chunk", type=Bounded("gallery_chunk"), default=None,
                 help="Gallery rows per task. Default: from --memory-budget, aligned to store chunks."),
    click.option("--memory-budget", default=None, callback=_bytes, metavar="SIZE",
                 help=f"Working memory the chunk sizes are planned for. SIZE: {SIZE_UNITS}.  Default: 512MiB a "
                      "worker, at least 1GiB and at most a quarter of this machine's memory."),
    click.option("--workers", type=Bounded("workers"), default=None,
                 help="Tasks run at once (threads of the default scheduler). Default: all cores / all cluster threads."),
    click.option("--scheduler", default=None, metavar="ADDRESS",
                 help="Run on an existing Dask cluster: its scheduler address, e.g. tcp://10.0.0.5:8786."),
    click.option("--scheduler-file", type=click.Path(), default=None,
                 help="Run on the Dask cluster whose scheduler wrote this file (dask scheduler --scheduler-file)."),
    click.option("--cluster", type=click.Choice(["local"]), default=None,
                 help="Start a LocalCluster of worker processes for this run. This, --scheduler and --scheduler-file "
                      "need the distributed extra (pip install distributed; in the streameval clone: "
                      ".venv/bin/pip install -e '.[distributed]')."),
    click.option("--n-workers", type=Bounded("n_workers"), default=None, help="LocalCluster worker processes."),
    click.option("--threads-per-worker", type=Bounded("threads_per_worker"), default=None,
                 help="LocalCluster threads per worker."),
    click.option("--memory-limit", default=None, callback=_bytes, metavar="SIZE",
                 help="LocalCluster memory limit per worker, a SIZE as --memory-budget's (e.g. 4GiB, 4GB)."),
    click.option("--connect-timeout", type=Bounded("connect_timeout"), default=15.0, show_default=True,
                 help="Seconds to wait for a cluster's scheduler and first worker."),
    click.option("--device", default=None, metavar="DEVICE",
                 help="Where the GEMMs run: cpu (default), cuda or cuda:N (an NVIDIA GPU; needs the gpu extra: pip "
                      "install 'streameval[gpu]'), or torch:cpu (the GPU path's code on the CPU). The same numbers "
                      "on every device (docs/gpu.md). With --cluster local --n-workers <GPUs>, worker n takes GPU n."),
    click.option("-S", "--storage-option", "storage_options", multiple=True, callback=_key_values,
                 metavar="KEY=VALUE",
                 help="fsspec storage option for a URL store (s3://...), repeatable, e.g. -S anon=true."),
)

_summary_options = _section(
    "Output",
    click.option("--ranks", callback=_rank_list, metavar="K[,K...]",
                 help="CMC ranks printed in the summary, e.g. 1,5,10 (the JSON keeps the whole curve). Default: "
                      "1, 5, 10, 20 and the max rank, those up to it. eval without --max-rank evaluates the CMC as "
                      "far as the largest; otherwise a rank past the max rank is refused."),
    click.option("--format", "summary_format", type=click.Choice(SUMMARY_FORMATS), default="table", show_default=True,
                 help="Summary layout: the terminal table, or a table to paste (markdown, csv, latex): Rank-k, mAP, "
                      "mINP, mAP_trapezoid in percent with 2 decimals, GOM values; mean +- std over trials (+- the CI half width "
                      "with --ci)."),
)

_output_options = _section(
    "Output",
    click.option("--json", "json_path", type=click.Path(), default=None,
                 help="Write the full result as JSON to this file ('-' for stdout)."),
    click.option("--per-query", is_flag=True,
                 help="Include per-query AP, INP, first-hit rank, #positives in the JSON."),
    click.option("--per-query-out", type=click.Path(), default=None, metavar="FILE.csv|FILE.parquet",
                 help="Also write one row per query (per trial and query with trials): its index, pid, camera, image "
                      "path, AP, INP, first-hit rank, #positives. Parquet needs pandas and pyarrow."),
    click.option("--quiet", "-q", is_flag=True, help="Print no progress and no summary table."),
    _summary_options,
)


_ci_options = _section(
    "Output",
    click.option("--ci", type=Bounded("ci"), default=None, metavar="LEVEL",
                 help="Also each metric's confidence interval at this level, e.g. 0.95: a percentile bootstrap "
                      "over queries, or the t-interval over trials; in the JSON ('ci') and as value +- half width "
                      "in the summary (docs/significance.md)."),
    click.option("--ci-resamples", type=Bounded("ci_resamples"), default=10_000, show_default=True,
                 help="Bootstrap resamples of --ci."),
    click.option("--ci-seed", type=Bounded("ci_seed"), default=0, show_default=True,
                 help="Seed of --ci's bootstrap draws."),
)


def _max_rank_for(ranks, max_rank):
    """--ranks past --max-rank: a max rank left at eval's default is raised to cover them (the
    user asked for those points); one given on the command line is refused.  None (update: the
    state's) is checked against the result."""
    if not ranks or max_rank is None or max(ranks) <= max_rank:
        return max_rank
    if click.get_current_context().get_parameter_source("max_rank") == click.core.ParameterSource.DEFAULT:
        return max(ranks)
    raise click.UsageError(f"--ranks {max(ranks)} is past --max-rank {max_rank}; raise --max-rank to {max(ranks)} "
                           "or more")


def _finish(result, label, json_path, per_query, quiet, ranks, summary_format) -> None:
    """Write the JSON (timed as its own phase), then print the summary.  If the JSON cannot be
    written, the summary is still printed and the error names the fallback file that holds it."""
    from .present import report
    from .features.gom import clipping_warning

    failure = None
    if json_path:
        started = time.perf_counter()
        failure = _write_json(result.to_dict(per_query=per_query), json_path, "result")
        result.add_phase("writing JSON", time.perf_counter() - started)
    if not quiet:
        # with JSON on stdout, the table goes to stderr so the JSON stays parseable
        click.echo(report.formatted(result, label, ranks, summary_format), err=json_path == "-")
        warning = summary_format != "table" and clipping_warning(result.gom)  # the table holds it
        if warning:
            click.echo(f"warning: {warning}", err=True)
    for warning in result.warnings:  # on stderr too, even with -q: the numbers look normal
        click.echo(f"warning: {warning}", err=True)
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


_reading_options = _section(  # how convert (and eval, for an input that is not a store) reads a file
    "Reading",
    click.option("--key", "keys", multiple=True, metavar="KEY=NAME",
                 help="The input's array NAME is KEY (qf, gf, q_pids, g_pids, q_camids, g_camids; dist, q_dist for "
                      "a matrix), for names not among the known ones (docs/formats.md); repeatable."),
    click.option("--query-ids", type=click.Path(exists=True, dir_okay=False), default=None, metavar="CSV",
                 help="The queries' ids from this CSV file: a header line, then pid,camid[,path] per row."),
    click.option("--gallery-ids", type=click.Path(exists=True, dir_okay=False), default=None, metavar="CSV",
                 help="The gallery's ids from this CSV file, as --query-ids."),
    click.option("--ids-from", type=click.Path(), default=None, metavar="STORE",
                 help="Copy both sets' ids (and image paths) from this store, e.g. the features' store of a matrix."),
    click.option("--distances", is_flag=True, help="The input holds a query x gallery distance matrix, not features."),
    click.option("--similarity", is_flag=True,
                 help="The input holds a query x gallery similarity matrix (larger is closer), not features."),
)


def _reading(options: dict) -> dict:
    """The reading options, taken out of a command's keywords, as ``convert``'s keywords."""
    distances, similarity = options.pop("distances"), options.pop("similarity")
    return {"keys": options.pop("keys"), "query_ids": options.pop("query_ids"),
            "gallery_ids": options.pop("gallery_ids"), "ids_from": options.pop("ids_from"),
            "matrix": "similarity" if similarity else "distance" if distances else None}


def _finish_with_lists(result, ranked_out, label, json_path, per_query, quiet, ranks, summary_format,
                       table_out=None) -> None:
    """Write the ranked lists to ``ranked_out`` and the per-query table to ``table_out`` (if
    asked), then ``_finish``; outputs that could not be written are reported after the result JSON
    and the summary."""
    from .features.ranked.finalise import write_output
    from .run import per_query as per_query_table

    failures = [write_output(result, ranked_out, json_path), per_query_table.write(result, table_out)]
    _finish(result, label, json_path, per_query, quiet, ranks, summary_format)
    for failure in failures:
        if failure is not None:
            raise failure
    if ranked_out is not None and not quiet:
        click.echo(f"ranked lists of {len(result.ranked_lists):,} queries written to {ranked_out}",
                   err=json_path == "-")


def _per_query_out(options: dict, overwrite: bool) -> str | None:
    """--per-query-out, taken out of the command's keywords and checked before any work."""
    from .run import per_query as per_query_table

    return per_query_table.check_output(options.pop("per_query_out"), overwrite)


@main.command("eval", cls=_Sectioned)
@click.argument("store", type=click.Path())
@_result_options(defaults=True)
@_execution_options
@_output_options
@_ci_options
@click.option("--state", type=click.Path(file_okay=False), default=None,
              help="Also save the per-query state to this directory, for 'streameval update' after appends.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file, --state, ranked-lists output or --per-query-out file.")
@_reading_options
@_section("Reading", click.option(
    "--convert-to", type=click.Path(), default=None, metavar="PATH",
    help="When STORE is a file to convert: write its store here and keep it (--overwrite replaces one). "
         "Default: a temporary store, removed after the evaluation."))
@click.option("--query-variant", default=None, metavar="NAME",
              help="Evaluate this feature variant of the queries (e.g. corrupt-t0; docs/variants.md). Default: clean.")
@click.option("--gallery-variant", default=None, metavar="NAME",
              help="Evaluate this feature variant of the gallery. Default: clean.")
def eval_cmd(store, json_path, per_query, quiet, state, overwrite, ranks, summary_format, convert_to, **options):
    """Evaluate STORE's queries against its gallery, streaming the gallery in chunks.

    STORE may also be a file 'streameval convert' reads (.npz, .npy or a folder of them, .mat, .h5,
    .pt; docs/formats.md): it is converted to a store first, and a line on stderr says so (not with -q).
    """
    outputs.check_file(json_path, overwrite, "--json file")
    table_out = _per_query_out(options, overwrite)
    outputs.check_directory(convert_to, overwrite, "--convert-to store")
    reading = _reading(options)
    options["max_rank"] = _max_rank_for(ranks, options["max_rank"])
    from .run.evaluation import evaluate  # checks --state before any work
    from .features.ranked.finalise import output_path

    ranked_out = output_path(options["ranked_list"], options.pop("ranked_out"), json_path, overwrite)
    options["std_ddof"] = int(options["std_ddof"])
    from .tools.convert import evaluation_store

    say = None if quiet else functools.partial(click.echo, err=True)  # -q: no info line, errors and warnings only
    with evaluation_store(store, convert_to=convert_to, overwrite=overwrite, state=state, say=say, **reading) as target:
        result = evaluate(target, progress=not quiet, state=state, overwrite_state=overwrite, **options)
        _finish_with_lists(result, ranked_out, store, json_path, per_query, quiet, ranks, summary_format, table_out)


@main.command(cls=_Sectioned)
@click.argument("store", type=click.Path())
@click.option("--state", type=click.Path(file_okay=False), required=True,
              help="The state saved by 'streameval eval --state' (or a previous update); updated in place, atomically.")
@_result_options(defaults=False, features=[feature for feature in REGISTRY if feature.name != "rerank"])
@_execution_options
@_output_options
@_ci_options
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file, ranked-lists output or --per-query-out file.")
def update(store, state, json_path, per_query, quiet, overwrite, ranks, summary_format, **options):
    """Score only the gallery rows appended to STORE since --state was saved, and report.

    The result equals a full 'streameval eval'.  Queries that got new positives are re-scored over
    the old rows too; with minmax GOM normalisation, a new global minimum or maximum distance moves
    every threshold, so then every query is (the summary says so).  Options that change the counts
    must match the state's; --max-rank, --gom-b and --gom-vp may differ.
    """
    outputs.check_file(json_path, overwrite, "--json file")
    table_out = _per_query_out(options, overwrite)
    options["max_rank"] = _max_rank_for(ranks, options["max_rank"])
    options["no_gom"] = options["no_gom"] or None  # an absent flag means "as in the state"
    options["std_ddof"] = None if options["std_ddof"] is None else int(options["std_ddof"])
    from .run.incremental import update as update_state
    from .features.ranked.finalise import output_path

    ranked_out = output_path(options["ranked_list"], options.pop("ranked_out"), json_path, overwrite)
    result = update_state(store, state, progress=not quiet, **options)
    _finish_with_lists(result, ranked_out, store, json_path, per_query, quiet, ranks, summary_format, table_out)


@main.command()
@click.argument("store", type=click.Path())
@click.argument("input_npz", type=click.Path(exists=True, dir_okay=False))
@click.option("--paths", "paths_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The new rows' image paths, one per line: needed (and only accepted) when STORE holds gallery paths.")
def append(store, input_npz, paths_file):
    """Append the gallery rows of INPUT_NPZ to STORE.

    \b
    Expected arrays (long or short names):
      gallery_features | gf    gallery_pids | g_pids    gallery_camids | g_camids
    and for each gallery variant of STORE (docs/variants.md) its new rows:
      variant.NAME    variant.NAME.corruption_type    variant.NAME.severity (if it has them)

    Rows are checked before the store is touched and become visible only once all are written: an
    interrupted append leaves the store as it was.  Then 'streameval update STORE --state STATE'
    scores just the new rows.
    """
    from .tools.convert import append_npz
    from .core.locking import writing
    from .present.report import store_summary
    from .store import open_store
    from .store.paths import read_paths_file

    with writing(store):  # the append's own lock, taken early: 'before' is the count the rows go after
        before = len(open_store(store).gallery)
        opened = append_npz(input_npz, store, None if paths_file is None else read_paths_file(paths_file))
    click.echo(f"appended {len(opened.gallery) - before:,} rows: " + store_summary(opened))


@main.command()
@click.argument("out", type=click.Path())
@click.option("--queries", type=Bounded("n_query"), default=3368, show_default=True, help="Number of queries.")
@click.option("--gallery", type=Bounded("n_gallery"), default=19732, show_default=True, help="Gallery rows.")
@click.option("--dim", type=Bounded("dim"), default=2048, show_default=True, help="Feature dimension.")
@click.option("--ids", type=Bounded("n_ids"), default=750, show_default=True, help="Identities shared by query and gallery.")
@click.option("--cams", type=Bounded("n_cams"), default=6, show_default=True, help="Cameras.")
@click.option("--seed", type=Bounded("seed"), default=0, show_default=True)
@click.option("--junk", type=Bounded("junk_frac"), default=0.0, show_default=True,
              help="Fraction of gallery rows that are junk (pid -1).")
@click.option("--distractors", type=Bounded("distractor_frac"), default=0.0, show_default=True,
              help="Fraction of gallery rows that are distractors (pid 0, no identity).")
@click.option("--open-queries", type=Bounded("open_query_frac"), default=0.0, show_default=True,
              help="Fraction of queries whose identity has no gallery image.")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)
@click.option("--chunk-rows", type=Bounded("chunk_rows"), default=None,
              help="Rows per zarr chunk. Default: about 8 MiB of features per chunk.")
@click.option("--metric", type=click.Choice(METRICS), default="euclidean", show_default=True,
              help="Default distance recorded in the store.")
@click.option("--images", type=click.Path(file_okay=False), default=None,
              help="Also write a small PNG per row into this new folder (a figure coloured by its pid, on its camera's "
                   "background) and the paths into the store, for 'streameval show'.")
@click.option("--variants", type=click.Choice(SUITE_PRESETS), default=None,
              help="Also write corruption-like feature variants of the queries and the gallery, named as the suite "
                   "preset of that name reads them (docs/variants.md): a random corruption type and severity per row.")
@click.option("--variant-trials", type=Bounded("variant_trials"), default=10, show_default=True,
              help="--variants: trials, each with its own corrupted draws.")
@click.option("--noise", type=Bounded("noise"), default=1.0, show_default=True,
              help="Scale of the per-image noise against the identity signal: 1 is a strong model (Market size: "
                   "mAP ~83%), larger a weaker one whose positives rank deeper (1.4: mAP ~53%).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (and write into an existing --images folder).")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def synth(out, queries, gallery, dim, ids, cams, seed, junk, distractors, open_queries, dtype, chunk_rows,
          metric, images, variants, variant_trials, noise, overwrite, quiet):
    """Write a synthetic ReID-like store (clustered identities, camera shifts), chunk by chunk.

    Memory stays bounded by one chunk, so galleries of millions of rows can be generated.
    """
    outputs.check_directory(out, overwrite, "store")
    outputs.check_directory(images, overwrite, "image folder")
    from .present.report import store_summary
    from .store import open_store
    from .tools.synth import synthesize

    synthesize(
        out, n_query=queries, n_gallery=gallery, dim=dim, n_ids=ids, n_cams=cams, seed=seed,
        junk_frac=junk, distractor_frac=distractors, open_query_frac=open_queries, dtype=dtype,
        chunk_rows=chunk_rows, default_metric=metric, overwrite=overwrite, progress=not quiet, images=images,
        variants=variants, variant_trials=variant_trials, noise=noise,
    )
    if not quiet:
        click.echo(store_summary(open_store(out)))


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True), metavar="INPUT...")
@click.argument("out", type=click.Path())
@_reading_options
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default=None,
              help="Stored feature dtype. Default: float16 if the input is float16, else float32.")
@click.option("--chunk-rows", type=Bounded("chunk_rows"), default=None,
              help="Rows per zarr chunk. Default: about 8 MiB of features per chunk.")
@click.option("--metric", type=click.Choice(METRICS), default=None,
              help="Default distance recorded in a feature store. Default: euclidean.")
@click.option("--query-variant", "query_variants", multiple=True, callback=_variant_options, metavar="NAME=FILE",
              help="Also store a feature variant of the queries (e.g. corrupted images' features), repeatable: FILE a "
                   ".npy of features or a .npz of features and optionally corruption_type, severity, pids, camids "
                   "(docs/variants.md).")
@click.option("--gallery-variant", "gallery_variants", multiple=True, callback=_variant_options, metavar="NAME=FILE",
              help="Also store a feature variant of the gallery, as --query-variant.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def convert(inputs, out, dtype, chunk_rows, metric, query_variants, gallery_variants, overwrite, **reading):
    """Convert query/gallery features and ids (or a distance matrix) into a store at OUT.

    \b
    INPUT: .npz, .npy files (one array each, named by the file) or a folder of them, .mat (MATLAB
    v5 or v7.3, e.g. layumi's pytorch_result.mat), .h5/.hdf5, .pt/.pth (needs torch).
    Arrays are found by their usual names (docs/formats.md lists them), e.g.
      query features   query_features, qf, query_f      gallery: gallery_features, gf, gallery_f
      query pids       query_pids, q_pids, query_label  gallery: gallery_pids, g_pids, gallery_label
      query cameras    query_camids, q_camids, query_cam  gallery: gallery_camids, g_camids, gallery_cam
    or named with --key qf=NAME.  Names other than streameval's own are reported on stderr.

    \b
    A distance matrix (re-ranking output):
      streameval convert dist.npy dist.zarr --distances --ids-from feats.zarr
    """
    outputs.check_directory(out, overwrite, "store")
    from .tools.convert import convert as convert_input
    from .present.report import store_summary

    def report(matching):
        if matching.notable:
            click.echo(str(matching), err=True)

    store = convert_input(list(inputs), out, dtype=dtype, chunk_rows=chunk_rows, default_metric=metric,
                          overwrite=overwrite, report=report, query_variants=query_variants,
                          gallery_variants=gallery_variants, **_reading(reading))
    click.echo(store_summary(store))


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", "-o", type=click.Path(), default=None,
              help="The image to write (.png, .pdf, .svg, .jpg, .eps, .tif). Without it, the last FILE is the image.")
@click.option("--labels", default=None, metavar="A,B,...",
              help="Legend labels, one per result, comma-separated, in order. Default: the file names without .json.")
@click.option("--overwrite", is_flag=True, help="Replace the image if it exists.")
def plot(files, out, labels, overwrite):
    """Draw the curves of eval --json results, one line per result on each panel: CMC (with a
    +- std band over trials), DIR vs FPIR per rank (--open-set), ROC and DET (--verification, log
    FAR axis, requested FARs marked), GOM mReP (tau_max marked) and mFR; per-trial rank-1 and mAP.

    \b
      streameval plot RESULT.json OUT.png
      streameval plot A.json B.json --labels a,b --out cmp.png

    A panel with no data in any result (GOM skipped, no open-set query, no trials) is left out.
    Suite results (streameval suite --json) are drawn together, as one figure of mAP, mINP and R1
    per setting: the mean with +- 1 std error bars, each trial a dot (docs/suites.md).
    Needs matplotlib, the plot extra: pip install matplotlib (in the streameval clone,
    .venv/bin/pip install -e '.[plot]'; scripts/demo does).
    """
    from .present import plot as plot_mod  # light: matplotlib is imported when drawing

    results, out, labels = plot_mod.arguments(files, out, labels)
    outputs.check_file(out, overwrite, "plot file")
    plot_mod.require_matplotlib("streameval plot")
    plot_mod.plot_results(results, out, labels)
    click.echo(f"wrote {out}")


@main.command("show")
@click.argument("result", type=click.Path(exists=True))
@click.option("--store", type=click.Path(), default=None,
              help="The evaluated store: image paths are read from it for records that lack them.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="The HTML page to write. Default: RESULT with the suffix .html.")
@click.option("--png", type=click.Path(file_okay=False), default=None,
              help="Also draw one PNG grid per query into this new folder (needs matplotlib).")
@click.option("--queries", default=None, metavar="worst:N|best:N|ids:LIST|all",
              help="Which queries, in which order: lowest / highest AP first, the listed query rows, or all "
                   "ranked lists in the file's order (the default).")
@click.option("--image-root", type=click.Path(exists=True, file_okay=False), default=None,
              help="The folder relative image paths start from. Default: the folder holding --store, "
                   "else the current folder.")
@click.option("--overwrite", is_flag=True, help="Replace an existing page (and PNGs of the same names in --png).")
def show_cmd(result, store, out, png, queries, image_root, overwrite):
    """Draw the ranked lists of RESULT (an 'eval --ranked-list K --json' result, or the lists
    themselves: .jsonl or .zarr) as a static HTML page: per query its image, pid, camera, AP and
    first-hit rank, then the top-k with green / red / grey borders for positive / negative / junk.
    Without image paths, a table of ids and distances per query.  docs/show.md in the repository
    explains the page.
    """
    from .present import show

    show.parse_queries(queries)
    outputs.check_file(out or show.default_page(result), overwrite, "page")
    outputs.check_directory(png, overwrite, "PNG folder")
    facts = show.show(result, store=store, out=out, png=png, queries=queries, image_root=image_root)
    if facts["missing"]:
        click.echo(f"warning: {len(facts['missing'])} of {facts['files']} image files do not exist (first: "
                   f"{facts['missing'][0]}); is --image-root right?", err=True)
    drawn = f"{facts['files']} images" if facts["files"] else "tables of ids and distances (no image paths)"
    click.echo(f"wrote {facts['page']}: {show.plural(facts['queries'], 'query', 'queries')}, {drawn}")
    if png is not None:
        click.echo(f"wrote {show.plural(facts['queries'], 'PNG grid', 'PNG grids')} to {png}")


@main.command()
@_result_options(defaults=True, features=[feature for feature in REGISTRY if feature.name != "ranked"])
def warmup(**options):
    """Compile the evaluation kernels into numba's cache, once after installing streameval, so that
    even the first evaluation starts at once (numba compiles each kernel the first time a run calls
    it: ~10-40 s).

    Without options: the common runs (the default evaluation, --no-gom, --open-set --verification
    with and without --auc).
    With eval's options: the kernels of an evaluation with those options.  Which metric and which
    stored dtype do not matter.
    """
    from .run.warmup import COMMON_RUNS, cache_folder, warm_up

    ctx = click.get_current_context()
    given = {param.name: (param.opts[0], options[param.name]) for param in ctx.command.params
             if ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT}
    label = " ".join(flag if value is True else f"{flag} {value}" for flag, value in given.values())
    given = {name: int(value) if name == "std_ddof" else value for name, (_, value) in given.items()}
    runs = [(label, given)] if given else COMMON_RUNS
    click.echo(f"numba cache: {cache_folder()}")
    total = 0.0
    for done in warm_up(runs):
        total += done.seconds
        kernels = f": {', '.join(done.kernels)}" if done.kernels else ""
        click.echo(f"  {done.label}: compiled {done.compiled}, loaded {done.loaded} from the cache, in "
                   f"{done.seconds:.2f} s{kernels}")
    click.echo(f"warmed up in {total:.2f} s: evaluations with these options load their kernels from the cache")


@main.command()
@click.argument("store", type=click.Path())
@click.option("--upgrade", is_flag=True,
              help="First bind the chunks of a store of schema 2 to their place (chunk identity), in place; "
                   "a store of schema 3 is left as it is.")
def validate(store, upgrade):
    """Check STORE's structure and read every chunk: missing chunk files, checksum mismatches
    (damaged files, chunk files moved, swapped or copied from another store), NaN or inf features
    and reserved ids are reported, feature variants included."""
    from .present.report import store_summary
    from .store import open_store, upgrade_store, validate_values
    from .store.variants import validate_variants

    opened = upgrade_store(store, say=functools.partial(click.echo, err=True)) if upgrade else open_store(store)
    validate_values(opened)
    validate_variants(opened)
    click.echo(store_summary(opened))
    click.echo("ok: structure and values are valid")


@main.command("variants")
@click.argument("store", type=click.Path())
@click.option("--add", "added", multiple=True, metavar="SET:NAME=FILE",
              help="Store a feature variant of the queries (query:NAME=FILE) or the gallery (gallery:NAME=FILE), "
                   "repeatable: FILE a .npy of features or a .npz of features and optionally corruption_type, "
                   "severity, pids, camids.")
@click.option("--overwrite", is_flag=True, help="--add: replace a variant of the same name.")
def variants_cmd(store, added, overwrite):
    """List STORE's feature variants per set (name, rows, corruption types and severities,
    attributes), after storing those given with --add.  docs/variants.md in the repository explains
    them; 'streameval synth --variants' writes corruption-like ones.
    """
    from .store import open_store
    from .store.variants import add_variant_files, describe_variants, parse_spec

    specs = [parse_spec(item) for item in added]
    opened = add_variant_files(store, specs, overwrite=overwrite) if specs else open_store(store)
    click.echo(describe_variants(opened))


@main.command("aggregate")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--label", "labels", multiple=True,
              help="Name of a run in the table and the JSON, once per RUN, in order. Default: the file names without .json.")
@click.option("--json", "json_path", type=click.Path(), default=None,
              help="Also write the aggregate (the result JSON schema plus 'aggregate') to this file ('-' for stdout). "
                   "Default: only print the table.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file.")
@_summary_options
def aggregate_cmd(runs, labels, json_path, overwrite, ranks, summary_format):
    """Combine the results of separate evaluations (one per split, e.g. RegDB's 10) into the mean,
    std (ddof 1), sem, min, max and count of every metric and curve point, each run counting once.

    Every option that decides the numbers (metric, protocol, max rank, junk pids, precision, GOM
    settings, ...) must match; the stores, their sizes and the execution may differ.
    """
    outputs.check_file(json_path, overwrite, "--json file")
    from .present.aggregate import aggregate, check_compatible, load_runs
    from .present.report import aggregate_text

    loaded = load_runs(runs, labels)
    for warning in check_compatible(loaded):
        click.echo(f"warning: {warning}", err=True)
    out = aggregate(loaded)
    text = aggregate_text(out, loaded, ranks, summary_format)  # refuses --ranks past the max rank before writing
    failure = None if json_path is None else _write_json(out, json_path, "aggregate")
    click.echo(text, err=json_path == "-")
    if failure is not None:
        raise failure


@main.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--metrics", default=None, metavar="NAME[,NAME...]",
              help="The metrics compared, e.g. mAP,rank1 (of mAP, mAP_trapezoid, mINP, rank1, rank5, rank10, MREP, "
                   "MFR). Default: every metric the first run has.")
@click.option("--label", "labels", multiple=True,
              help="Name of a run in the table and the JSON, once per RUN, in order. Default: the file names without .json.")
@click.option("--seed", type=Bounded("ci_seed"), default=0, show_default=True,
              help="Seed of the bootstrap and randomization draws.")
@click.option("--level", type=Bounded("level"), default=0.95, show_default=True,
              help="Confidence level of each delta's bootstrap interval.")
@click.option("--resamples", type=Bounded("ci_resamples"), default=10_000, show_default=True,
              help="Resamples of the bootstrap and of the randomization test.")
@click.option("--correction", type=click.Choice(["holm", "none"]), default="holm", show_default=True,
              help="Multiple-comparison correction over the compared runs, per metric and test.")
@click.option("--test", type=click.Choice(PAIRED_TESTS), default="randomization", show_default=True,
              help="The test whose (corrected) p-value marks a value in the table (randomization: exact at any "
                   "number of queries, Rank-k's 0/1 values included).")
@click.option("--alpha", type=Bounded("alpha"), default=0.05, show_default=True,
              help="A value is marked (*) where that p-value is below this.")
@click.option("--format", "table_format", type=click.Choice(PASTE_FORMATS), default="markdown", show_default=True,
              help="Table layout: markdown, csv (each metric's p-value in a column of its own) or latex.")
@click.option("--json", "json_path", type=click.Path(), default=None,
              help="Also write every delta, interval and p-value as JSON to this file ('-' for stdout).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file.")
def compare_cmd(runs, metrics, labels, seed, level, resamples, correction, test, alpha, table_format, json_path,
                overwrite):
    """Compare runs with the first, metric by metric, on paired per-query values (per-trial values
    with trials): delta, its bootstrap interval, and the p-values of the paired t-test, the Wilcoxon
    signed-rank test and a seeded paired randomization test, Holm-corrected over the runs
    (docs/significance.md).

    Each RUN is a result JSON written by 'streameval eval --per-query --json'; the runs must score
    the same queries against the same gallery with the same settings (metric, protocol, options).
    """
    outputs.check_file(json_path, overwrite, "--json file")
    from .present.compare import compare

    found = compare(runs, metrics, seed, level, resamples, correction, labels)
    for warning in found.warnings:
        click.echo(f"warning: {warning}", err=True)
    failure = None if json_path is None else _write_json(found.to_dict(), json_path, "comparison")
    click.echo(found.table(table_format, test, alpha), err=json_path == "-")
    if failure is not None:
        raise failure


_suite_output_options = _section(
    "Output",
    click.option("--json", "json_path", type=click.Path(), default=None,
                 help="Write the suite's result as JSON to this file ('-' for stdout): every evaluation's full "
                      "result, per setting the per-trial values, mean, std, sem, min, max."),
    click.option("--per-query", is_flag=True, help="Include each evaluation's per-query values in the JSON."),
    click.option("--quiet", "-q", is_flag=True, help="Print no progress and no table."),
    click.option("--format", "summary_format", type=click.Choice(SUMMARY_FORMATS), default="table", show_default=True,
                 help="Table layout: the terminal table, or a table to paste (markdown, csv, latex); mINP, mAP, "
                      "R1, R5, R10 in percent as mean (std) per setting, as the CIL-ReID paper prints them."),
    click.option("--per-evaluation", is_flag=True,
                 help="Also print one row per evaluation (setting, trial, variants), upstream's column order."),
    click.option("--by-severity", is_flag=True,
                 help="Print the query-side breakdown per (corruption type, severity) too, not only per type "
                      "(the JSON holds both)."),
    click.option("--plot", "plot_path", type=click.Path(), default=None, metavar="PNG",
                 help="Also draw each metric per setting with error bars (std) to this image."),
    click.option("--overwrite", is_flag=True, help="Replace an existing --json, --plot or --state output."),
)


def _check_suite_outputs(json_path, plot_path, overwrite) -> None:
    """Before the suite runs: its outputs can be written, and a --plot drawn (matplotlib is installed)."""
    for path, what in ((json_path, "--json file"), (plot_path, "--plot image")):
        outputs.check_file(path, overwrite, what)
    if plot_path:
        from .present.plot import require_matplotlib

        require_matplotlib("--plot")


def _finish_suite(result, json_path, per_query, quiet, summary_format, per_evaluation, by_severity, plot_path) -> None:
    """Write the suite's JSON and plot, then print its table (to stderr when the JSON goes to stdout)."""
    from .present.suite_report import breakdown_table, per_evaluation_table, suite_table, summary_lines

    section = result.to_dict(per_query=per_query)
    failure = _write_json(section, json_path, "suite result") if json_path else None
    if plot_path:
        from .present.plot import plot_suite

        plot_suite(section, plot_path)
    if not quiet:
        suite = section["suite"]
        err = json_path == "-"
        for line in summary_lines(suite):
            click.echo(line, err=True)
        tables = [suite_table(suite, summary_format)]
        if suite["breakdown"] is not None:
            shown = suite if by_severity else {**suite, "breakdown": {side: {key: value for key, value in found.items()
                                                                          if key != "by_type_severity"}
                                                                    for side, found in suite["breakdown"].items()}}
            tables.append(breakdown_table(shown, summary_format))
        if per_evaluation:
            tables.append(per_evaluation_table(suite, summary_format))
        click.echo("\n\n".join(tables), err=err)  # a blank line between tables, csv ones included
    if failure is not None:
        raise failure


@main.command("suite", cls=_Sectioned)
@click.argument("store", type=click.Path())
@click.argument("suite")
@click.option("--trials", type=Bounded("variant_trials"), default=None,
              help="Corruption trials T of a preset plan (default 10, or the suite file's).")
@click.option("--headline-setting", default=None,
              help="The setting reported as the headline 'corrupted' figure (default both).")
@click.option("--std-ddof", type=click.Choice(["1", "0"]), default=None,
              help="Std over trials: 1 = sample standard deviation (default), 0 = numpy's default.")
@click.option("--protocol", default=None, metavar="NAME|FILE", help="The protocol of every evaluation (default market).")
@click.option("--metric", type=click.Choice(METRICS), default=None, help="Distance (default: the store's).")
@click.option("--max-rank", type=Bounded("max_rank"), default=None, help="Length of the CMC curve (default 50).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None, help="Precision of the GEMM (default float32).")
@click.option("--denominator", type=click.Choice(["skip", "zero"]), default=None,
              help="Queries without a positive: skipped (default) or counted as 0.")
@click.option("--direction", type=click.Choice(["v2t", "t2v"]), default=None,
              help="regdb: the direction evaluated (a suite runs one).")
@click.option("--gom-norm", default=None, metavar="fixed:LO:HI|none",
              help="Also the GOM metrics, with this normalisation (minmax spans each evaluation's pairs: not offered).")
@click.option("--gom-bins", type=Bounded("gom_bins"), default=None, help="GOM threshold grid size (default 100).")
@click.option("--open-set", is_flag=True, default=None, help="Also DIR@FPIR per evaluation (docs/open-set.md).")
@click.option("--state", type=click.Path(file_okay=False), default=None,
              help="Also save the suite's per-query states here, for 'streameval suite-update' after appends.")
@_execution_options
@_suite_output_options
def suite_cmd(store, suite, json_path, per_query, quiet, summary_format, per_evaluation, by_severity, plot_path,
              overwrite, state, trials, headline_setting, std_ddof, **options):
    """Evaluate a feature-variant suite: clean, corrupted query, corrupted gallery and both, over
    trials (CIL-ReID, docs/suites.md), in one pass per gallery variant.

    SUITE is a preset, cil-upstream (clean once; per trial independent query, gallery and both
    draws) or cil-factorial (one corrupted draw per side per trial: not upstream-equivalent), or a
    .toml / .json suite file naming (query variant, gallery variant) evaluations (docs/suites.md).
    STORE holds the variants (docs/variants.md; 'streameval synth --variants' makes a demo).  Each
    evaluation's numbers equal a separate 'streameval eval' of its pair.
    """
    _check_suite_outputs(json_path, plot_path, overwrite)
    from .suite.plan import load_suite
    from .suite.run import run_suite

    if options["gom_norm"] is not None:
        options["no_gom"] = False
    plan = load_suite(suite, trials, headline_setting, None if std_ddof is None else int(std_ddof),
                      **{key: options.pop(key) for key in ("protocol", "metric", "max_rank", "precision", "denominator",
                                                           "direction", "gom_norm", "gom_bins", "open_set", "no_gom")
                         if key in options})
    result = run_suite(store, plan, progress=not quiet, state=state, overwrite_state=overwrite, **options)
    _finish_suite(result, json_path, per_query, quiet, summary_format, per_evaluation, by_severity, plot_path)


@main.command("suite-update", cls=_Sectioned)
@click.argument("store", type=click.Path())
@click.option("--state", type=click.Path(file_okay=False), required=True,
              help="The suite state saved by 'streameval suite --state' (or a previous suite-update).")
@_execution_options
@_suite_output_options
def suite_update_cmd(store, state, json_path, per_query, quiet, summary_format, per_evaluation, by_severity, plot_path,
                     overwrite, **options):
    """Score only the gallery rows appended to every gallery variant of STORE since the suite's
    --state was saved, and report the suite (equal to a full 'streameval suite')."""
    _check_suite_outputs(json_path, plot_path, overwrite)
    from .suite.run import update_suite

    result = update_suite(store, state, progress=not quiet, **options)
    _finish_suite(result, json_path, per_query, quiet, summary_format, per_evaluation, by_severity, plot_path)


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
