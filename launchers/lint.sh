#!/usr/bin/env bash
# Static checks, run by .ci/run before the tests: formatting, lint, types, and the import-layers
# contract of pyproject.toml ([tool.importlinter]), so the package's layers cannot erode
# silently. Needs the dev tools of launchers/setup.sh (.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" format --check lcab tests launchers
"$bin/ruff" check lcab tests launchers
"$bin/mypy"
"$bin/lint-imports"
