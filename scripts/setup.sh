#!/usr/bin/env bash
# Installs everything GIR and its test suite need on a fresh Debian machine (no GPU needed).
# Idempotent: a second run only checks. Pins live in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
