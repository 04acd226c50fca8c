#!/usr/bin/env bash
# Installs what the status page's e2e test (edge/tests/e2e/admin_page.rs)
# drives: Debian's headless-capable `chromium` and its WebDriver,
# `chromium-driver` (chromedriver). Does nothing when both are on PATH.
set -euo pipefail
if command -v chromium > /dev/null && command -v chromedriver > /dev/null; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo > /dev/null; then
  sudo=(sudo -n)
else
  echo "install-browser: not root and no sudo; install chromium and chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# An install from a stale or empty package index fails; refresh it then retry once.
if ! "${sudo[@]}" apt-get install -y -qq chromium chromium-driver > /dev/null; then
  "${sudo[@]}" apt-get update -qq > /dev/null
  "${sudo[@]}" apt-get install -y -qq chromium chromium-driver > /dev/null
fi
command -v chromium > /dev/null && command -v chromedriver > /dev/null
