#!/usr/bin/env bash
# The whole test suite beside a CPU hog: every test must pass on a busy machine.
#
# A test that fails only when the machine is loaded is a flaky test: its bounds must come from the
# system's own evidence (a step count, a log line, a recovery record), not from wall-clock guesses.
# This script starts one busy loop per CPU (`yes > /dev/null`, at the lowest priority a hog gets
# on a shared machine: none, it runs at the tests' own priority), runs the suite with the arguments
# given (default: every test, as .ci/run does), and stops the hogs whatever happens.
#
#   bash tests/run_loaded.sh                    # every test, loaded
#   HOGS=1 bash tests/run_loaded.sh -m unit     # one hog, the unit tier
#
# It does not install anything: run tests/setup_machine.sh first (as .ci/run does).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hogs="${HOGS:-$(nproc)}"
case "$hogs" in
  ''|*[!0-9]*) echo "run_loaded.sh: HOGS=$hogs; rule: a whole number of busy loops" >&2; exit 2 ;;
esac
pids=()
stop_hogs() { for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null; done; wait 2> /dev/null; }
trap stop_hogs EXIT INT TERM
for _ in $(seq 1 "$hogs"); do
  yes > /dev/null &
  pids+=("$!")
done
echo "run_loaded.sh: $hogs busy loop(s) beside the tests (pids ${pids[*]})"
start=$(date +%s)
if [ "$#" -eq 0 ]; then set -- tests; fi
python -m pytest -q "$@"
status=$?
echo "run_loaded.sh: pytest exited $status after $(( $(date +%s) - start )) s with $hogs busy loop(s)"
exit "$status"
