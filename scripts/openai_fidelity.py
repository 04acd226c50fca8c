#!/usr/bin/env python3
"""Runs application-style flows with the official `openai` Python SDK
against one base URL and prints what the SDK saw, as one JSON object, with
per-request values (ids, timestamps, request ids) replaced by placeholders,
so a run straight against an upstream and a run through iop can be diffed
field by field (edge/tests/e2e/sdk_fidelity.rs).

Usage: openai_fidelity.py BASE_URL MODEL FLOW[,FLOW...]

With IOP_TEST_CA set (a PEM file), an https BASE_URL is verified against
that CA only (the TLS end-to-end test's own CA).

Flows: tools_stream, tools, agent_loop, choices, choices_stream, refusal,
refusal_stream, error_429, embeddings, embeddings_base64, completions,
completions_stream, responses, responses_stream.
"""
import json
import os
import ssl
import sys

import openai
from openai import OpenAI

base_url, model, flows = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
ca = os.environ.get("IOP_TEST_CA")
http_client = None
if ca:
    # The SDK's own client class (with its defaults), whatever HTTP library it is built on.
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca))
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30, http_client=http_client)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}},
    },
}]
VOLATILE = {"id", "created", "created_at", "completed_at", "x_request_id", "_request_id", "item_id", "response_id"}


def scrub(v):
    """Placeholders for per-request values; everything else kept."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if k in VOLATILE and x is not None:
                out[k] = "<%s>" % k
            else:
                out[k] = scrub(x)
        return out
    if isinstance(v, list):
        return [scrub(x) for x in v]
    return v


def dump(obj):
    return scrub(obj.model_dump(mode="json"))


def stream_helper():
    # The SDK's stream accumulator (tool-call helpers): where agents meet it.
    chat = client.chat.completions
    return chat.stream if hasattr(chat, "stream") else client.beta.chat.completions.stream


def tools_stream():
    with stream_helper()(model=model, messages=USER, tools=TOOLS, extra_body={"mock": {"tool_calls": 2}}) as s:
        events = [e.type for e in s]
        final = s.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    return {
        "final": dump(final),
        "arguments": [json.loads(c.function.arguments) for c in calls],
        "event_types": sorted(set(events)),
    }


def tools():
    r = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, extra_body={"mock": {"tool_calls": 2}})
    calls = r.choices[0].message.tool_calls or []
    return {"response": dump(r), "arguments": [json.loads(c.function.arguments) for c in calls]}


def agent_loop():
    messages = list(USER)
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           extra_body={"mock": {"tool_calls": 2}})
    msg = first.choices[0].message
    messages.append(msg.model_dump(exclude_none=True))
    for i, call in enumerate(msg.tool_calls or []):
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny %d" % i})
    second = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                            extra_body={"mock": {"tool_calls": 2}})
    return {
        "first_finish": first.choices[0].finish_reason,
        "calls": len(msg.tool_calls or []),
        "second": dump(second),
        "answer": second.choices[0].message.content,
    }


def choices():
    r = client.chat.completions.create(model=model, messages=USER, n=2, logprobs=True, top_logprobs=2, max_tokens=3)
    return {"response": dump(r)}


def choices_stream():
    texts, finishes, logprobs = {}, {}, {}
    for chunk in client.chat.completions.create(model=model, messages=USER, n=2, logprobs=True, top_logprobs=2,
                                                max_tokens=3, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
            if c.logprobs and c.logprobs.content:
                logprobs.setdefault(c.index, []).extend(scrub(t.model_dump(mode="json")) for t in c.logprobs.content)
    return {"texts": texts, "finishes": finishes, "logprobs": logprobs}


def refusal():
    r = client.chat.completions.create(model=model, messages=USER, extra_body={"mock": {"refusal": "I can't help with that"}})
    return {"response": dump(r)}


def refusal_stream():
    parts = []
    for chunk in client.chat.completions.create(model=model, messages=USER, stream=True,
                                                extra_body={"mock": {"refusal": "I can't help with that"}}):
        for c in chunk.choices:
            if c.delta.refusal:
                parts.append(c.delta.refusal)
    return {"refusal": "".join(parts)}


def error_429():
    try:
        client.chat.completions.create(model=model, messages=USER, extra_body={"mock": {"error_status": 429}})
        return {"raised": None}
    except openai.RateLimitError as e:
        return {
            "raised": type(e).__name__,
            "status": e.status_code,
            "body": scrub(e.body),
            "retry_after": e.response.headers.get("retry-after"),
        }


def embeddings():
    return {"response": dump(client.embeddings.create(model=model, input=["a", "bb"]))}


def embeddings_base64():
    r = client.embeddings.create(model=model, input="c", encoding_format="base64")
    return {"response": dump(r)}


def completions():
    return {"response": dump(client.completions.create(model=model, prompt="once", max_tokens=4))}


def completions_stream():
    text = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt="once", max_tokens=4,
                                                                        stream=True) if c.choices)
    return {"text": text}


def responses():
    return {"response": dump(client.responses.create(model=model, input="hello"))}


def responses_stream():
    types, text = [], []
    with client.responses.stream(model=model, input="hello") as s:
        for e in s:
            types.append(e.type)
            if e.type == "response.output_text.delta":
                text.append(e.delta)
        final = s.get_final_response()
    return {"types": types, "text": "".join(text), "final": dump(final)}


out = {}
for flow in flows:
    try:
        out[flow] = globals()[flow]()
    except Exception as e:  # a flow that fails is a result too
        out[flow] = {"exception": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(out, sort_keys=True))
