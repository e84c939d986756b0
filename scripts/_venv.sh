# Sourced by scripts/demo and scripts/test: create (once) and update the project's virtual
# environment, then put it first on PATH.  Usage: ensure_venv EXTRAS   (e.g. "plot" or "test,plot")
ensure_venv() {
    local root venv python
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="${STREAMEVAL_VENV:-$root/.venv}"
    python="${PYTHON:-$(command -v python3 || command -v python)}"
    if [ ! -x "$venv/bin/python" ]; then
        echo "setting up $venv ..." >&2
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[$1]"
    export PATH="$venv/bin:$PATH"
    cd "$root"
}
