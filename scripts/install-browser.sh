#!/usr/bin/env bash
# Installs what the status page's e2e test (edge/tests/e2e/admin_page.rs)
# drives: Debian's headless-capable `chromium` and its WebDriver,
# `chromium-driver` (chromedriver). Does nothing when both are on PATH.
set -euo pipefail
exec bash "$(dirname "$0")/apt-install.sh" install-browser chromium chromium-driver -- chromium chromedriver
