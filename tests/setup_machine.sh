#!/usr/bin/env bash
# Everything the tests need, the two halves at once (they take turns on nothing: the Debian half
# waits on the network and dpkg, the Python half mostly compiles the ops):
# - from Debian: ZooKeeper (the membership tests start their own server from its jar on a free port),
#   Redis (started the same way: the broker of tests/integration/test_stream_queues.py), iproute2
#   (`ip netns` makes the hosts of tests/e2e/test_multi_host.py) and kubectl (the deploy/ tests render
#   the manifests with `kubectl kustomize`); run as root or with sudo;
# - from PyPI: requirements.txt, then this package, editable, with its op build.
# Safe to rerun; exits non-zero if either half failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

debian() {
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq zookeeper iproute2 redis-server > /dev/null
  # kubectl: kept when one is installed (the deploy/ kustomizations need its kustomize >= 3.7).
  if ! command -v kubectl > /dev/null; then $sudo apt-get install -y -qq kubernetes-client > /dev/null; fi
}

python_packages() {
  pip install -r requirements.txt
  pip install --no-build-isolation -e .
}

start=$(date +%s)
debian &
debian_pid=$!
python_status=0
python_packages || python_status=$?
debian_status=0
wait "$debian_pid" || debian_status=$?
echo "setup_machine.sh: $(( $(date +%s) - start )) s (Debian packages: exit $debian_status; pip and the op build: exit $python_status)"
if [ "$debian_status" -ne 0 ] || [ "$python_status" -ne 0 ]; then exit 1; fi
