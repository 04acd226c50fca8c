#!/usr/bin/env python3
"""Sends one task to an agent (a `model` that names an `[[agents]]` entry of
the edge) with the official `anthropic` Python SDK, and prints what the SDK
made of the answer as one JSON object.

usage: agent_sdk.py BASE_URL MODEL MODE TASK

BASE_URL is the server root (the SDK appends /v1/messages). MODE:
  buffered       client.messages.create(..., stream=False)
  stream_events  client.messages.stream(...): iterates the events, then
                 get_final_message() and get_final_text()
  stream_text    client.messages.stream(...): joins text_stream, then
                 get_final_message()
  raw_stream     client.messages.create(..., stream=True): iterates the raw
                 events
IOP_WORKSPACE, when set, is sent as the `x-iop-workspace` header.

Output: {"text", "stop_reason", "model", "content_types", ...} per mode, or,
when the SDK raised, {"exception": CLASS, "bases": [...], "status", "body",
"message"} with the events seen before it ("events").
"""
import json
import os
import sys

import anthropic


def message_summary(m):
    return {
        "class": type(m).__name__,
        "type": m.type,
        "role": m.role,
        "model": m.model,
        "content_types": [b.type for b in m.content],
        "text": "".join(b.text for b in m.content if b.type == "text"),
        "stop_reason": m.stop_reason,
        "stop_sequence": m.stop_sequence,
    }


def event_record(event, classes):
    """The event's type; the Python class of each type is kept in `classes`
    (an unknown event type shows which class the SDK built for it)."""
    classes.setdefault(event.type, type(event).__name__)
    return event.type


def buffered(c, model, task, seen):
    m = c.messages.create(model=model, max_tokens=512, messages=[{"role": "user", "content": task}], stream=False)
    return message_summary(m)


def stream_events(c, model, task, seen):
    classes = {}
    text = []
    with c.messages.stream(model=model, max_tokens=512, messages=[{"role": "user", "content": task}]) as s:
        for event in s:
            seen.append(event_record(event, classes))
            if event.type == "text":
                text.append(event.text)
        final = s.get_final_message()
        final_text = s.get_final_text()
    out = message_summary(final)
    out.update({"events": seen, "event_classes": classes, "streamed_text": "".join(text), "final_text": final_text})
    return out


def stream_text(c, model, task, seen):
    with c.messages.stream(model=model, max_tokens=512, messages=[{"role": "user", "content": task}]) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    out = message_summary(final)
    out.update({"text_stream": "".join(pieces), "pieces": len(pieces)})
    return out


def raw_stream(c, model, task, seen):
    classes = {}
    text = []
    stop_reason = None
    stream = c.messages.create(
        model=model, max_tokens=512, messages=[{"role": "user", "content": task}], stream=True
    )
    with stream:
        for event in stream:
            seen.append(event_record(event, classes))
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text.append(event.delta.text)
            if event.type == "message_delta":
                stop_reason = event.delta.stop_reason
    return {"events": seen, "event_classes": classes, "text": "".join(text), "stop_reason": stop_reason}


MODES = {"buffered": buffered, "stream_events": stream_events, "stream_text": stream_text, "raw_stream": raw_stream}


def main():
    base, model, mode, task = sys.argv[1:5]
    headers = {}
    if os.environ.get("IOP_WORKSPACE"):
        headers["x-iop-workspace"] = os.environ["IOP_WORKSPACE"]
    c = anthropic.Anthropic(
        base_url=base, api_key="unused", max_retries=0, timeout=120.0, default_headers=headers
    )
    seen = []
    try:
        out = MODES[mode](c, model, task, seen)
    except anthropic.APIError as e:
        out = {
            "exception": type(e).__name__,
            "bases": [k.__name__ for k in type(e).__mro__ if k.__module__.startswith("anthropic")],
            "status": getattr(e, "status_code", None),
            "body": e.body,
            "message": str(e),
            "events": seen,
        }
    except Exception as e:  # anything else the SDK raised: reported, not hidden
        out = {"exception": type(e).__name__, "bases": [], "message": str(e), "events": seen, "unexpected": True}
    out["sdk_version"] = anthropic.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
