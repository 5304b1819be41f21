#!/usr/bin/env bash
# Set up lcab in ./.venv: the CPU torch wheel first (a plain `torch` requirement would pull
# several GB of CUDA wheels), then lcab with its dev extras. Idempotent and fast when nothing
# changed. On a GPU machine, install the torch build you want into .venv first (or set
# LCAB_TORCH="torch==X.Y.Z" / LCAB_TORCH=skip); an importable torch is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)

stamp=.venv/.lcab-setup-stamp
want=$(cat pyproject.toml launchers/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ] || [ ! -d .venv/lcab-upstream ]; then
  torch_spec=${LCAB_TORCH:-torch==2.13.0}
  if [ "$torch_spec" != skip ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
    "${pip[@]}" "$torch_spec"
  fi
  "${pip[@]}" -e ".[dev]"
  # The GPU libraries' Python sources for tests/unit/test_upstream_packages.py: the pins of the
  # `upstream` extra, without their CUDA dependencies, in a folder lcab never imports from.
  upstream=.venv/lcab-upstream
  mapfile -t pins < <(.venv/bin/python - <<'PINS'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["upstream"]))
PINS
  )
  rm -rf "$upstream"
  "${pip[@]}" --no-deps --target "$upstream" "${pins[@]}"
  echo "$want" > "$stamp"
fi

# flash-attn 2.8.3.post2's sdist (its Python, imported by the tests over an emulated CUDA
# extension: tests/helpers/emulated_flash_attn.py), fetched once into ~/.cache/lcab/upstream
# (LCAB_UPSTREAM_CACHE) so a test run needs no index. A CI run without it fails loudly.
if ! PYTHONPATH=. .venv/bin/python - <<'SDIST'
from tests.helpers.emulated_flash_attn import source_tree
raise SystemExit(source_tree() is None)
SDIST
then
  echo "setup.sh: could not fetch the flash-attn 2.8.3.post2 sdist (pip download)" >&2
  if [ -n "${CI:-}" ]; then exit 1; fi
fi
