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
completions_stream, responses, responses_stream, responses_tools,
responses_tools_stream, responses_json_schema, responses_system, responses_multiturn,
responses_image. The Responses flows also validate every streamed event and
the final response against the SDK's published types (pydantic, strict
about required fields and their types), so a shape error fails the flow.
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


def checked(response):
    """The response, validated against the SDK's `Response` type."""
    from openai.types.responses import Response

    Response.model_validate(response.model_dump(mode="json", by_alias=True, exclude_unset=True))
    return response


def responses_create(**kw):
    return checked(client.responses.create(model=model, **kw))


def responses_streamed(**kw):
    """Streams one response, validating each event against the published
    event union; returns the event types, the text and the final response."""
    from pydantic import TypeAdapter
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    types, text, seqs = [], [], []
    with client.responses.stream(model=model, **kw) as s:
        for e in s:
            if not e.type.startswith("response."):
                continue  # the helper's own convenience events
            adapter.validate_python(e.model_dump(mode="json", by_alias=True, exclude_unset=True))
            types.append(e.type)
            seqs.append(e.sequence_number)
            if e.type == "response.output_text.delta":
                text.append(e.delta)
        final = checked(s.get_final_response())
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers: %s" % seqs
    return types, "".join(text), final


def responses():
    return {"response": dump(responses_create(input="hello"))}


def responses_stream():
    types, text, final = responses_streamed(input="hello")
    return {"types": types, "text": text, "final": dump(final)}


RESPONSES_TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}},
}]


def responses_tool_turns(first):
    """A function call, then its output sent back as an item."""
    calls = [o for o in first.output if o.type == "function_call"]
    items = [{"role": "user", "content": "What is the weather in Paris?"}]
    items += [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls]
    second = responses_create(input=items, tools=RESPONSES_TOOLS)
    return {
        "names": [c.name for c in calls],
        "arguments": [json.loads(c.arguments) for c in calls],
        "answer": second.output_text,
        "status": second.status,
    }


def responses_tools():
    first = responses_create(input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
                             tool_choice=os.environ.get("IOP_TOOL_CHOICE", "required"))
    return responses_tool_turns(first)


def responses_tools_stream():
    types, _, first = responses_streamed(input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
                                         tool_choice=os.environ.get("IOP_TOOL_CHOICE", "required"))
    out = responses_tool_turns(first)
    out["types"] = sorted(set(types))
    return out


def responses_json_schema():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    r = responses_create(input="A city?", text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                           "strict": True}})
    return {"status": r.status, "text": r.output_text != "", "format": r.text.format.type}


def responses_system():
    r = responses_create(instructions="Answer briefly.", input=[
        {"role": "developer", "content": "Be polite."},
        {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
    ])
    return {"status": r.status, "instructions": r.instructions, "text": r.output_text}


def responses_multiturn():
    r = responses_create(input=[
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"role": "user", "content": "again"},
    ], max_output_tokens=2)
    return {"status": r.status, "reason": r.incomplete_details and r.incomplete_details.reason,
            "output_tokens": r.usage.output_tokens}


def responses_image():
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    r = responses_create(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64," + png},
    ]}])
    return {"status": r.status, "text": r.output_text != ""}


out = {}
for flow in flows:
    try:
        out[flow] = globals()[flow]()
    except Exception as e:  # a flow that fails is a result too
        out[flow] = {"exception": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(out, sort_keys=True))
