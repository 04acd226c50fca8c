//! The edge's translation of an Anthropic Messages request into an OpenAI
//! chat-completions body, over arbitrary bytes.
//!
//! Input: the whole input is the client's body.
//! Invariants: never panics; a refusal is a 400 or a 413 whose message
//! starts with its param; the places of the edge's first read
//! (`Top::parse_keeping`), when it reads the body, translate it the same;
//! a translation is a JSON object with `model` = the
//! target, a non-empty `messages` array whose tool messages each answer a
//! call of the assistant message before them, `stream` as reported, and
//! `dropped` sorted without repeats.
#![no_main]

use iop_core::{
    messages::{to_chat, to_chat_at},
    request::Top,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|input: &[u8]| {
    let whole = to_chat(input, "m", &Default::default());
    if let Ok(top) = Top::parse_keeping(input) {
        assert_eq!(
            to_chat_at(input, top.fields.as_ref(), "m", &Default::default()),
            whole,
            "read at the first read's places"
        );
    }
    let t = match whole {
        Ok(t) => t,
        Err(e) => {
            assert!(e.status == 400 || e.status == 413, "status {}", e.status);
            assert!(e.message.starts_with(&e.param), "message does not name {}: {}", e.param, e.message);
            return;
        }
    };
    let body: Value = serde_json::from_slice(&t.body).expect("the body is JSON");
    let body = body.as_object().expect("the body is an object");
    assert_eq!(body.get("model").and_then(Value::as_str), Some("m"));
    assert_eq!(body.get("stream").and_then(Value::as_bool).unwrap_or(false), t.stream);
    assert!(t.dropped.windows(2).all(|w| w[0] < w[1]), "dropped not sorted or repeated: {:?}", t.dropped);
    let messages = body.get("messages").and_then(Value::as_array).expect("messages");
    assert!(!messages.is_empty());
    // The calls the latest assistant message made, answered by the tool
    // messages right after it.
    let mut calls: Vec<&str> = Vec::new();
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                calls = m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().filter_map(|c| c.get("id").and_then(Value::as_str)).collect())
                    .unwrap_or_default();
            }
            Some("tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).expect("tool_call_id");
                assert!(calls.contains(&id), "tool message {id} answers no call before it");
            }
            Some("user") => calls.clear(),
            Some("system") => {}
            other => panic!("role {other:?}"),
        }
    }
});
