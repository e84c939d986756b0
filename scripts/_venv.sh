# Sourced by scripts/demo and scripts/test: create (once) the project's virtual environment, install
# streameval into it (editable) when something changed, then put it first on PATH.
# Usage: ensure_venv EXTRAS   (e.g. "plot,distributed" or "test,plot,distributed")
#
# pip runs only when the stamp file $venv/.streameval-install (a hash of pyproject.toml and the extras
# installed with it) does not cover this request, or when the venv does not import streameval from
# this clone.  pip runs with -qq: its warnings (among them setuptools' notice about editable
# installs) are not shown, its errors are, and a failed install leaves no stamp, so the next run
# tries again.
ensure_venv() {
    local root venv python stamp wanted
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
    venv="${STREAMEVAL_VENV:-$root/.venv}"
    python="${PYTHON:-$(command -v python3 || command -v python)}"
    stamp="$venv/.streameval-install"
    if [ ! -x "$venv/bin/python" ]; then
        echo "setting up $venv ..." >&2
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -qq --upgrade pip
    fi
    if ! wanted="$(_install_wanted "$venv/bin/python" "$root" "$stamp" "$1")"; then
        echo "installing streameval[${wanted#* }] into $venv ..." >&2
        rm -f "$stamp"
        "$venv/bin/python" -m pip install -qq -e "$root[${wanted#* }]"
        echo "$wanted" >"$stamp"
    fi
    export PATH="$venv/bin:$PATH"
    cd "$root"
}

# Install torch's CPU build into VENV (for the tests of .pt files) when it has no torch yet and pip's
# find-links folders (pip config, PIP_FIND_LINKS) hold a CPU wheel for its Python.  torch is not in the
# test extra: pip's index would resolve it to the CUDA build, gigabytes; without a CPU wheel the .pt
# tests are skipped, saying why, and `pip install -e '.[torch]'` adds whichever torch one wants.
ensure_cpu_torch() {  # VENV
    local version
    "$1/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' && return 0
    version="$(_cpu_torch_version "$1/bin/python")"
    [ -n "$version" ] || return 0
    echo "installing torch $version (CPU build) into $1 for the .pt reader tests ..." >&2
    "$1/bin/python" -m pip install -qq "torch==$version" ||
        echo "warning: torch $version did not install; the .pt reader tests will be skipped" >&2
}

# Print the newest version of a torch CPU wheel (torch-VERSION+cpu-cpXY-cpXY-*.whl) for PYTHON in pip's
# find-links folders, or nothing.
_cpu_torch_version() {  # PYTHON
    "$1" -I - <<'PY'
import glob, os, re, subprocess, sys

config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
folders = os.environ.get("PIP_FIND_LINKS", "").split()
for line in config.splitlines():
    key, _, value = line.partition("=")
    if key.endswith("find-links"):
        folders += value.strip("'\"").split()
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
versions = [os.path.basename(path).split("-")[1] for folder in folders
            for path in glob.glob(os.path.join(folder.removeprefix("file://"), f"torch-*+cpu-{tag}-{tag}-*.whl"))]
if versions:
    print(max(versions, key=lambda v: [int(n) for n in re.findall(r"[0-9]+", v.split("+")[0])]))
PY
}

# Print "PYPROJECT_SHA256 EXTRAS" as the stamp should read after an install: the requested extras
# joined with those already installed from the same pyproject.toml (so alternating demo and test
# runs do not re-install).  Exit 0 if that is installed already and streameval imports from ROOT.
_install_wanted() {  # VENV_PYTHON ROOT STAMP EXTRAS
    "$1" -I - "$2" "$3" "$4" <<'PY'
import hashlib, importlib.util, os, sys

root, stamp, requested = sys.argv[1:]
with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
    digest = hashlib.sha256(fh.read()).hexdigest()
try:
    with open(stamp) as fh:
        old_digest, _, old_extras = fh.read().strip().partition(" ")
except OSError:
    old_digest, old_extras = None, ""
installed = set(old_extras.split(",")) - {""} if old_digest == digest else set()
wanted = installed | (set(requested.split(",")) - {""})
print(digest, ",".join(sorted(wanted)))
spec = importlib.util.find_spec("streameval")
here = spec is not None and os.path.realpath(spec.origin) == os.path.join(root, "streameval", "__init__.py")
sys.exit(0 if here and old_digest == digest and wanted == installed else 1)
PY
}
