#!/usr/bin/env python3
"""The Responses API's WebSocket mode with the official `openai` SDK
(`client.responses.connect()`, over the `websockets` package): three
`response.create` on one socket (the second continuing the first by its
`previous_response_id`, the third naming an unknown one), each event
validated against the SDK's published server-event types. Prints what it
saw as one JSON object.

usage: responses_ws.py BASE_URL MODEL
"""
import json
import sys

from openai import OpenAI
from pydantic import TypeAdapter
from openai.types.responses import ResponseStreamEvent

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
events = TypeAdapter(ResponseStreamEvent)


def one(conn, **create):
    """Sends one response.create; returns its event types, text and final event."""
    conn.send({"type": "response.create", "model": model, **create})
    types, text = [], []
    for event in conn:
        d = event.model_dump(mode="json", by_alias=True, exclude_unset=True)
        types.append(d["type"])
        if d["type"] == "error":
            return {"types": types, "error": d}
        events.validate_python(d)
        if d["type"] == "response.output_text.delta":
            text.append(d["delta"])
        if d["type"] in ("response.completed", "response.incomplete", "response.failed"):
            return {"types": types, "text": "".join(text), "status": d["response"]["status"],
                    "id": d["response"]["id"], "output": d["response"]["output"]}
    return {"types": types, "closed": True}


out = {}
try:
    with client.responses.connect() as conn:
        first = one(conn, input="hello", instructions="be brief")
        second = one(conn, input="again", previous_response_id=first.get("id"))
        unknown = one(conn, input="x", previous_response_id="resp_unknown")
        third = one(conn, input=[{"role": "user", "content": "still there?"}])
        out = {"first": first, "second": second, "unknown": unknown, "third": third}
except Exception as e:  # reported, the test names it
    out["exception"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out, sort_keys=True))
