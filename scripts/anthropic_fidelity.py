#!/usr/bin/env python3
"""Runs application-style flows with the official `anthropic` Python SDK
against BASE_URL (the server root: the SDK appends /v1/messages) asking for
MODEL, and prints what the SDK parsed, per flow, as one JSON object (ids
scrubbed, so runs can be compared). A flow that raises reports
{"exception": ...}; the error flows report the SDK's exception class,
status and error type.

usage: anthropic_fidelity.py BASE_URL MODEL FLOW[,FLOW...]
IOP_TOOL_CHOICE (default `any`): the tool_choice type of the tool loop
(`auto` for a provider that cannot be forced to call a tool, e.g. Ollama).
"""
import base64
import json
import os
import sys

import anthropic

PNG_1PX = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def scrub(message):
    """The parsed message as JSON, without its per-request id."""
    d = message.model_dump(mode="json", exclude_none=True)
    d.pop("id", None)
    for block in d.get("content", []):
        if block.get("type") == "tool_use":
            block["id"] = "<id>"
    return d


def user(text):
    return [{"role": "user", "content": text}]


def flow_text(c, model):
    return scrub(c.messages.create(model=model, max_tokens=64, messages=user("hello")))


def flow_text_stream(c, model):
    with c.messages.stream(model=model, max_tokens=64, messages=user("hello")) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    return {"text": text, "final": scrub(final)}


def flow_system(c, model):
    return scrub(
        c.messages.create(
            model=model,
            max_tokens=64,
            system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            messages=user("hello"),
        )
    )


def flow_stop_sequences(c, model):
    return scrub(c.messages.create(model=model, max_tokens=64, stop_sequences=["tok2"], messages=user("count")))


def flow_max_tokens(c, model):
    return scrub(c.messages.create(model=model, max_tokens=2, messages=user("hello")))


def flow_image(c, model):
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}},
        {"type": "text", "text": "what is this?"},
    ]
    return scrub(c.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": content}]))


def flow_thinking(c, model):
    with c.messages.stream(
        model=model, max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}, messages=user("think")
    ) as s:
        final = s.get_final_message()
    return {"blocks": [b.type for b in final.content], "final": scrub(final)}


def flow_tool_loop(c, model):
    """A two-turn agent loop, streamed: the SDK's helper reassembles the
    input_json_delta pieces into the tool_use block's input."""
    msgs = user("weather in Paris?")
    with c.messages.stream(
        model=model,
        max_tokens=256,
        tools=TOOLS,
        tool_choice={"type": os.environ.get("IOP_TOOL_CHOICE", "any")},
        messages=msgs,
    ) as s:
        first = s.get_final_message()
    calls = [b for b in first.content if b.type == "tool_use"]
    msgs = msgs + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "sunny"} for b in calls],
        },
    ]
    second = c.messages.create(model=model, max_tokens=256, tools=TOOLS, messages=msgs)
    return {
        "stop_reason": first.stop_reason,
        "inputs": [b.input for b in calls],
        "names": [b.name for b in calls],
        "answer": "".join(b.text for b in second.content if b.type == "text"),
        "second": scrub(second),
    }


def error_of(fn):
    try:
        fn()
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__, "status": e.status_code, "type": body.get("error", {}).get("type")}
    return {"exception": "no error raised"}


def flow_error_not_found(c, model):
    return error_of(lambda: c.messages.create(model="no-such-model", max_tokens=8, messages=user("x")))


def flow_error_invalid(c, model):
    return error_of(
        lambda: c.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [{"type": "hologram"}]}])
    )


def flow_count_tokens(c, model):
    r = c.messages.count_tokens(model=model, messages=user("how many tokens is this?"))
    return {"positive": r.input_tokens > 0}


def main():
    base, model, flows = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    client = anthropic.Anthropic(base_url=base, api_key="test-key", max_retries=0, timeout=30)
    out = {}
    for name in flows:
        try:
            out[name] = globals()[f"flow_{name}"](client, model)
        except Exception as e:  # reported, not raised: the test names the flow
            out[name] = {"exception": f"{type(e).__name__}: {e}"}
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
