#!/usr/bin/env bash
# Installs what the shared limits' e2e test (edge/tests/e2e/cluster_limits.rs)
# starts: Debian's `redis-server` (a Redis-protocol engine for `[cluster]`).
# Does nothing when it is on PATH. The test starts its own server on a
# socket in its scratch directory; the package's service is not used.
set -euo pipefail
if command -v redis-server > /dev/null; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo > /dev/null; then
  sudo=(sudo -n)
else
  echo "install-redis: not root and no sudo; install redis-server" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# An install from a stale or empty package index fails; refresh it then retry once.
if ! "${sudo[@]}" apt-get install -y -qq redis-server > /dev/null; then
  "${sudo[@]}" apt-get update -qq > /dev/null
  "${sudo[@]}" apt-get install -y -qq redis-server > /dev/null
fi
command -v redis-server > /dev/null
