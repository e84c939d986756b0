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
