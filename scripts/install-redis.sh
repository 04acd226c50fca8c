#!/usr/bin/env bash
# Installs what the shared limits' e2e test (edge/tests/e2e/cluster_limits.rs)
# starts: Debian's `redis-server` (a Redis-protocol engine for `[cluster]`).
# Does nothing when it is on PATH. The test starts its own server on a
# socket in its scratch directory; the package's service is not used.
set -euo pipefail
exec bash "$(dirname "$0")/apt-install.sh" install-redis redis-server -- redis-server
