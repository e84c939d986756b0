# Sourced by scripts/gpu_wheels.sh and scripts/gpu_check.sh: source_hash prints a hash of the sources
# the streameval wheel is built from (the package and pyproject.toml of the checkout at $root), so
# that gpu_check.sh installs no wheel of other sources than the checkout it runs.
source_hash() {
    (cd "$root" && find streameval pyproject.toml -name '*.py' -o -name '*.toml' -o -name '*.json' -o -name '*.md' \
        | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
}
