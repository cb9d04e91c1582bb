#!/usr/bin/env bash
# Runs pytest for CTest under one named Python environment and records the
# outcome for scripts/test.sh's summary (RESULTS_DIR/ENV_NAME.TEST_NAME.xml,
# JUnit XML), so CI's log says which Python tests ran under which environment.
#
# usage: run_pytest.sh ENV_NAME PYTHON RESULTS_DIR TEST_NAME [pytest args...]
set -euo pipefail
env_name=$1 py=$2 results=$3 name=$4
shift 4
if [[ ! -x $py ]]; then
  echo "run_pytest: no interpreter at $py for the '$env_name' environment." >&2
  echo "run_pytest: scripts/test.sh creates it (scripts/python-env.sh for the PyPI one)." >&2
  exit 1
fi
mkdir -p "$results"
echo "run_pytest: $name under $env_name ($("$py" --version 2>&1), $py)"
exec "$py" -m pytest -p no:cacheprovider -rs --junitxml="$results/$env_name.$name.xml" "$@"
