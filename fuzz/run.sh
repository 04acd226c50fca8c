#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS each, default 60)
# from its seeds, one at a time (small machines). Needs cargo-fuzz
# (`cargo install cargo-fuzz --locked`); stable Rust is enough (`-s none`:
# no AddressSanitizer, which needs nightly). A crash fails the run and
# leaves its input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
cargo fuzz build -s none
for t in $targets; do
  echo "== fuzz $t for ${seconds}s"
  mkdir -p "corpus/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  cargo fuzz run -s none "$t" "corpus/$t" "${seeds[@]}" -- -max_total_time="$seconds" -rss_limit_mb=1024
done
