#!/usr/bin/env bash
# Prepare wheelhouse/ for scripts/gpu_check.sh, on a machine with pip's index at hand: the streameval
# wheel built from this checkout and every wheel it needs, for CPython 3.11 and 3.12 on manylinux
# x86_64, so that a GPU machine without internet installs it with `pip install --no-index`.
#
# Usage: scripts/gpu_wheels.sh [--lean]
#   --lean  leave out numpy, scipy, numba and llvmlite (about 100 MB a Python version): the images
#           that ship torch for a GPU have them (gpu_check.sh's venv sees the machine's packages).
#           Use it where what travels to the GPU machine is capped (e.g. 64 MiB).
# Environment: GPU_WHEELHOUSE (default: wheelhouse/ in the checkout, which git ignores),
#              GPU_WHEEL_PYTHONS (default: "3.11 3.12"), PYTHON (the python whose pip runs; default python3).
# torch is not fetched: gpu_check.sh uses the machine's own (its CUDA build is gigabytes).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
wheelhouse="${GPU_WHEELHOUSE:-$root/wheelhouse}"
pythons="${GPU_WHEEL_PYTHONS:-3.11 3.12}"
python="${PYTHON:-python3}"
lean=0
case "${1:-}" in
    --lean) lean=1 ;;
    "") ;;
    *) echo "usage: scripts/gpu_wheels.sh [--lean]" >&2; exit 2 ;;
esac
LEAN_SKIP="numpy scipy numba llvmlite"  # what a torch GPU image already holds
PLATFORMS="manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
           manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64"

source "$root/scripts/_gpu_source.sh"
rm -rf "$wheelhouse"
mkdir -p "$wheelhouse"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "building the streameval wheel from $root ..." >&2
"$python" -m pip wheel -q --no-deps -w "$scratch/own" "$root"
own="$(ls "$scratch"/own/streameval-*.whl)"
cp "$own" "$wheelhouse/"
platform_args=()
for platform in $PLATFORMS; do platform_args+=(--platform "$platform"); done
for version in $pythons; do
    echo "fetching its dependencies for CPython $version (manylinux x86_64) ..." >&2
    "$python" -m pip download -q --only-binary=:all: --implementation cp --python-version "$version" \
        --abi "cp${version/./}" --abi abi3 --abi none "${platform_args[@]}" -d "$scratch/$version" "$own" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)  # this machine's pip config's notes
    for wheel in "$scratch/$version"/*.whl; do
        name="$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]' '[:lower:]')"
        if [ "$lean" = 1 ] && [[ " $LEAN_SKIP " == *" $name "* ]]; then continue; fi
        [ "$name" = streameval ] || cp -n "$wheel" "$wheelhouse/"
    done
done
source_hash > "$wheelhouse/SOURCE"  # gpu_check.sh refuses a wheel built from other sources than its checkout's
size_mb=$(( $(du -sk "$wheelhouse" | cut -f1) / 1024 ))
echo "wheelhouse: $wheelhouse, $(ls "$wheelhouse"/*.whl | wc -l) wheels, ${size_mb} MB$([ "$lean" = 1 ] && echo " (lean: without $LEAN_SKIP)")"
if [ "$lean" = 0 ] && [ "$size_mb" -gt 60 ]; then
    echo "note: where what travels to the GPU machine is capped (64 MiB), use --lean" >&2
fi
