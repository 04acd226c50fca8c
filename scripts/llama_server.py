#!/usr/bin/env python3
"""Serves a GGUF model with llama.cpp's OpenAI-compatible server (PyPI xllamacpp).

Used by the real-upstream end-to-end test. Usage: llama_server.py MODEL.gguf PORT ALIAS
Prints "llama-server ready on 127.0.0.1:PORT" once the model is loaded and the
port is listening, then serves until killed.
"""
import socket
import sys
import time

import xllamacpp as xc

model, port, alias = sys.argv[1], int(sys.argv[2]), sys.argv[3]
params = xc.CommonParams()
params.model.path = model
params.port = port
params.hostnames = ["127.0.0.1"]
params.model_alias = alias
params.n_ctx = 2048
params.cpuparams.n_threads = 2
server = xc.Server(params)

# The constructor returns once the model is loaded; wait for the socket too.
deadline = time.time() + 60
while time.time() < deadline:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
print(f"llama-server ready on 127.0.0.1:{port}", flush=True)
while True:
    time.sleep(3600)
