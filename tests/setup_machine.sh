#!/usr/bin/env bash
# What the tests need from the machine: Debian's ZooKeeper (the membership tests start their own
# server from its jar on a free port), Debian's Redis (started the same way) and kubectl (the deploy/ tests render the manifests with
# `kubectl kustomize`). Safe to rerun; run as root or with sudo.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
# iproute2: `ip netns` makes the hosts of the multi-host tests (tests/e2e/test_multi_host.py);
# redis-server: the broker of the message-queue contract tests (tests/integration/test_stream_queues.py).
$sudo apt-get install -y -qq zookeeper iproute2 redis-server > /dev/null
# kubectl: kept when one is installed (the deploy/ kustomizations need its kustomize >= 3.7).
if ! command -v kubectl > /dev/null; then $sudo apt-get install -y -qq kubernetes-client > /dev/null; fi
