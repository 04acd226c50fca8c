//! The edge's translation of an OpenAI Responses request into an OpenAI
//! chat-completions body, over arbitrary bytes.
//!
//! Input: the whole input is the client's body.
//! Invariants: never panics; a refusal is a 400 or a 413 whose message
//! starts with its param; the places of the edge's first read
//! (`Top::parse_keeping`), when it reads the body, translate it the same;
//! a translation is a JSON object with `model` = the
//! target, a non-empty `messages` array whose tool messages each answer a
//! call of an assistant message before them (once), `stream` as reported,
//! `dropped` sorted without repeats, every flat name of `namespaced` a
//! distinct function name of at most 64 bytes, and `history_of` = the
//! messages from `input_from` on.
#![no_main]

use std::collections::HashSet;

use iop_core::{
    request::Top,
    responses::{history_of, to_chat, to_chat_at},
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
    assert!(t.input_from <= messages.len());
    assert_eq!(history_of(&t)[..], messages[t.input_from..]);
    let mut calls = HashSet::new();
    let mut answered = HashSet::new();
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let id = c.get("id").and_then(Value::as_str).expect("a call's id");
                    assert!(calls.insert(id), "call {id} made twice");
                }
            }
            Some("tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).expect("tool_call_id");
                assert!(calls.contains(id), "tool message {id} answers no call before it");
                assert!(answered.insert(id), "call {id} answered twice");
            }
            Some("user" | "system") => {}
            other => panic!("role {other:?}"),
        }
    }
    let mut flat = HashSet::new();
    for (name, _, _) in &t.namespaced {
        assert!(name.len() <= 64, "flat name over 64 bytes: {name}");
        assert!(flat.insert(name), "flat name given twice: {name}");
    }
    let functions: Vec<&str> = body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.pointer("/function/name").and_then(Value::as_str))
        .collect();
    let distinct: HashSet<&&str> = functions.iter().collect();
    assert_eq!(distinct.len(), functions.len(), "a function name sent twice: {functions:?}");
});
