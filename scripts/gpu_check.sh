#!/usr/bin/env bash
# The GPU check of issue 28, one command on a GPU machine (no internet needed): install streameval
# from the wheels brought along (scripts/gpu_wheels.sh made wheelhouse/ beforehand), then run
# scripts/gpu_startup.py and scripts/bench.py --device --breakdown on the problems, and write their tables:
#
#   market    3,368 x 19,732 x 2,048 (float32 store): the device path in-process and as a warm CLI
#             process, the CPU path, the GEMM and store-read floors, the numbers compared;
#   exact-2m  10,000 x 2,000,000 x 256 (float16): ranking alone (--no-gom: the device's screen of
#             each block) and every statistic (default options + open-set + verification: every dot
#             product copied back) on the device and on the CPU path, the numbers compared (SAME);
#   large-10m 10,000 x 10,000,000 x 256 (float16, CPU path skipped): the device path in-process
#             (closed-set; the store read is part of its time), and the floors (a CLI process's fixed
#             costs are market's);
#   large-10m-gom  the same store, the default options (GOM: every dot product copied back), in-process.
# By default first scripts/gpu_startup.py (startup.txt: what a process pays before its first block),
# then the problems in the order market, exact-2m, large-10m, large-10m-gom: the shorter first,
# the longest and least telling last, so that a run cut short by a lease's minutes keeps the rest
# (--problems picks others or another order).  On an H200, 2026-11-28, at --stop-after 570: the
# install 22 s, the start-up 86 s (numba's first compiles included), market 94 s, exact-2m 194 s (its
# store made in 16 s), and large-10m was stopped 175 s in, its store being made or its first
# method running.
#
# Usage: bash scripts/gpu_check.sh [--device DEV] [--tiny] [--stop-after S] [--problems LIST]
#   --device DEV    cuda (default), cuda:N, or torch:cpu (the device path's code on the CPU: to try
#                   this script on a machine without a GPU)
#   --problems LIST what to run, comma-separated, in that order (default
#                   startup,market,exact-2m,large-10m,large-10m-gom): a lease can begin with what is
#                   not measured yet
#   --tiny          the same steps on tiny problems (seconds; with --device torch:cpu, a dry run)
#   --stop-after S  end by S seconds after the start: a problem not begun by then is skipped, the one
#                   running then is stopped (both said in the log, and the exit status is 1), and the
#                   summary is still printed
# Environment: OUT (where the tables go; default ./gpu-out), PYTHON (default python3: the one that
#   holds torch), GPU_WHEELHOUSE (default wheelhouse/), GPU_CHECK_WORK (the venv, made afresh, and
#   the stores, reused by a rerun; default /tmp/streameval-gpu-check).
# Writes to $OUT: gpu-check.log (everything printed), startup.txt, and per problem NAME.txt (its
# table) and NAME.json (bench.py --json).  Exit status: 0, or 1 if a device and the CPU path gave different
# numbers or a step failed (the log says which).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
device=cuda
tiny=0
stop_after=0  # seconds; 0: no deadline
problems=startup,market,exact-2m,large-10m,large-10m-gom
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="${2:?--device needs a value}"; shift 2 ;;
        --tiny) tiny=1; shift ;;
        --stop-after) stop_after="${2:?--stop-after needs a number of seconds}"; shift 2 ;;
        --problems) problems="${2:?--problems needs a list}"; shift 2 ;;
        *) echo "usage: bash scripts/gpu_check.sh [--device DEV] [--tiny] [--stop-after S] [--problems LIST]" >&2; exit 2 ;;
    esac
done
for name in ${problems//,/ }; do
    case "$name" in
        startup|market|exact-2m|large-10m|large-10m-gom) ;;
        *) echo "gpu_check.sh: --problems: no '$name' (startup, market, exact-2m, large-10m, large-10m-gom)" >&2; exit 2 ;;
    esac
done
[[ "$stop_after" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --stop-after takes whole seconds, not '$stop_after'" >&2; exit 2; }
out="${OUT:-$PWD/gpu-out}"
python="${PYTHON:-python3}"
wheelhouse="${GPU_WHEELHOUSE:-$root/wheelhouse}"
work="${GPU_CHECK_WORK:-/tmp/streameval-gpu-check}"
mkdir -p "$out" "$work" || exit 1
export PYTHONUNBUFFERED=1
status=0

source "$root/scripts/_gpu_source.sh"
say() { printf '[gpu-check +%4ds] %s\n' "$SECONDS" "$*"; }
fail() { say "FAILED: $*"; status=1; }

if [ "$tiny" = 1 ]; then
    market=200x5000x64 exact=300x8000x32 large=300x20000x32
else
    market=3368x19732x2048 exact=10000x2000000x256 large=10000x10000000x256
fi

main() {
    say "streameval GPU check: device $device, running $problems (market $market, exact-2m $exact, large-10m $large); tables in $out"
    if [[ "$device" == cuda* ]]; then
        nvidia-smi -L || fail "nvidia-smi -L"
    fi

    if [ "$(cat "$wheelhouse/SOURCE" 2>/dev/null)" != "$(source_hash)" ]; then
        fail "$wheelhouse is missing or holds a streameval wheel built from other sources than this checkout's: run scripts/gpu_wheels.sh (--lean where this machine has numpy, scipy, numba) and bring wheelhouse/"
        return 1
    fi

    # 1. a venv that sees this python's packages (its torch, numpy, numba...), streameval and what is
    #    missing installed from the wheelhouse.  A venv made by a python that is itself a venv's sees only
    #    the base installation's packages, so the .pth file adds this python's own site folders.
    venv="$work/venv"
    say "creating $venv from $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])') ..."
    rm -rf "$venv"  # made afresh: a venv of an earlier run holds that run's streameval, of the same version
    if ! "$python" -m venv --system-site-packages "$venv"; then
        say "no ensurepip for this python (e.g. Debian's python3 without python3-venv): a venv without pip, filled by this python's pip"
        rm -rf "$venv"
        "$python" -m venv --system-site-packages --without-pip "$venv" || { fail "python -m venv"; return 1; }
    fi
    "$python" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
        > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu-check-parent.pth"
    pip=("$venv/bin/python" -m pip)
    "${pip[@]}" --version >/dev/null 2>&1 || pip=("$python" -m pip --python "$venv/bin/python")
    say "installing streameval from $wheelhouse (no index) ..."
    # --force-reinstall --no-deps: the wheelhouse's streameval even where this python has one (which
    # would otherwise satisfy the requirement), its dependencies as found
    "${pip[@]}" install -q --no-index --find-links "$wheelhouse" --disable-pip-version-check streameval \
        && "${pip[@]}" install -q --no-index --find-links "$wheelhouse" --disable-pip-version-check --force-reinstall \
            --no-deps streameval \
        || { fail "pip install from $wheelhouse: run scripts/gpu_wheels.sh (--lean where this machine has numpy, scipy, numba) and bring wheelhouse/"; return 1; }
    (cd "$work" && "$venv/bin/python" -c 'import streameval, torch, numba, numpy; print("streameval", streameval.__version__, "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| numba", numba.__version__, "| numpy", numpy.__version__, "|", streameval.__file__)') \
        || { fail "import streameval and torch in $venv"; return 1; }
    say "installed"

    # 2. the problems, each with its table and JSON; stores kept in $work/stores for a rerun
    deadline() {  # NAME: sets limit (the command prefix that ends it by --stop-after); false if too late
        limit=()
        [ "$stop_after" -gt 0 ] || return 0
        local left=$(( stop_after - SECONDS ))
        [ "$left" -ge 10 ] || { fail "$1: skipped, --stop-after $stop_after s reached"; return 1; }
        limit=(timeout "$left")  # signals the command's process group: its children too
    }
    stopped() {  # NAME STATUS: whether the deadline stopped NAME (said so)
        [ "$2" = 124 ] && [ "${#limit[@]}" -gt 0 ] && { fail "$1: stopped, --stop-after $stop_after s reached"; return 0; }
        return 1
    }
    bench() {  # NAME ARGS...: one bench.py run
        local name="$1"
        shift
        deadline "$name" || return
        say "$name: scripts/bench.py --device $device $* (store generated first if missing) ..."
        "${limit[@]}" "$venv/bin/python" "$root/scripts/bench.py" --device "$device" --breakdown \
            --workdir "$work/stores" --json "$out/$name.json" "$@" | tee "$out/$name.txt"
        local rc=${PIPESTATUS[0]}
        stopped "$name" $rc && return
        [ $rc = 0 ] || fail "$name: bench.py exited with $rc"
        ! grep -q "FAILED" "$out/$name.txt" || fail "$name: a method failed (its table says which, the log why)"
        say "$name done"
    }
    startup() {
        deadline startup || return
        say "startup: scripts/gpu_startup.py --device $device ..."
        "${limit[@]}" "$venv/bin/python" "$root/scripts/gpu_startup.py" --device "$device" | tee "$out/startup.txt"
        local rc=${PIPESTATUS[0]}
        stopped startup $rc && return
        [ $rc = 0 ] || fail "startup: gpu_startup.py exited with $rc"
    }
    # the large problems in the default budget, 512MiB a worker: with 16 workers tasks of whole
    # 16,384-row store chunks against the 10,000 queries
    local big=(--dtype float16) name limit=()
    for name in ${problems//,/ }; do
        case "$name" in
            startup) startup ;;
            market) bench market --size "$market" ;;
            exact-2m) bench exact-2m --size "$exact" "${big[@]}" --methods device-closed,cpu-closed,device-all,cpu-all ;;
            large-10m) bench large-10m --size "$large" "${big[@]}" --skip-cpu --methods device-closed,gemm-floor,read-floor ;;
            large-10m-gom) bench large-10m-gom --size "$large" "${big[@]}" --skip-cpu --methods device ;;
        esac
    done

    say "finished with status $status; tables: $(cd "$out" && ls *.txt | tr '\n' ' ')"
    for name in ${problems//,/ }; do
        grep -h "^=== \|^done\|^floor\|^goal\|^numbers\|FAILED\|!!!" "$out/$name.txt" 2>/dev/null
    done
    return $status
}

main 2>&1 | tee -a "$out/gpu-check.log"
exit "${PIPESTATUS[0]}"
