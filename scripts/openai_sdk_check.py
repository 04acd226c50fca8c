#!/usr/bin/env python3
"""Drives an iop edge with the official `openai` Python SDK (end-to-end test).

Usage: openai_sdk_check.py BASE_URL MODEL
Streams a completion (with usage), asks for a non-streamed one, lists the
models and provokes a 404; prints one JSON object with what it saw.
"""
import json
import sys

import openai
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
messages = [{"role": "user", "content": "hello"}]

parts, usage, finish = [], None, None
for chunk in client.chat.completions.create(
    model=model, messages=messages, stream=True, stream_options={"include_usage": True}, max_tokens=6
):
    if chunk.choices:
        if chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    if chunk.usage:
        usage = chunk.usage.model_dump()

full = client.chat.completions.create(model=model, messages=messages)
models = [m.id for m in client.models.list()]
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    not_found = None
except openai.NotFoundError as e:
    not_found = e.status_code

print(json.dumps({
    "stream_text": "".join(parts),
    "stream_finish": finish,
    "stream_usage": usage,
    "text": full.choices[0].message.content,
    "finish": full.choices[0].finish_reason,
    "usage": full.usage.model_dump() if full.usage else None,
    "models": models,
    "not_found_status": not_found,
}))
