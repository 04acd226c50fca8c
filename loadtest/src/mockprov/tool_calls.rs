//! Tool calls as the mock makes them: call `i` asks for the weather in Paris
//! with `"n": i`, so every call of an answer has distinct, valid JSON
//! arguments. Streams split the arguments into the small, token-sized
//! fragments OpenAI sends (`{"`, `city`, `":"`, ...), as do Anthropic's
//! `input_json_delta`s; the Ollama shape and Anthropic's `tool_use` block
//! carry the arguments as one object.

use super::json::json_str;

/// Argument fragments per call.
pub const FRAGMENTS: u64 = 9;

/// The arguments of call `i`, as the JSON text OpenAI carries in `arguments`.
pub fn arguments(i: u64) -> String {
    format!("{{\"city\":\"Paris\",\"n\":{i}}}")
}

/// Fragment `j` (`0..FRAGMENTS`) of the arguments of call `i`; concatenated
/// in order they give [`arguments`]`(i)`.
pub fn fragment(i: u64, j: u64) -> String {
    match j {
        0 => "{\"".to_owned(),
        1 => "city".to_owned(),
        2 => "\":\"".to_owned(),
        3 => "Paris".to_owned(),
        4 => "\",\"".to_owned(),
        5 => "n".to_owned(),
        6 => "\":".to_owned(),
        7 => i.to_string(),
        _ => "}".to_owned(),
    }
}

/// Id of call `i` of choice `choice` in request `seq`: `call_<seq>_<i>`, and
/// `call_<seq>_c<choice>_<i>` for the further choices of an `n` > 1 answer.
pub fn call_id(seq: u64, choice: u64, i: u64) -> String {
    if choice == 0 {
        format!("call_{seq}_{i}")
    } else {
        format!("call_{seq}_c{choice}_{i}")
    }
}

/// The answer to a tool result: `tool said: <content>`.
pub fn echo(tool_content: &str) -> String {
    format!("tool said: {tool_content}")
}

/// One whole OpenAI tool call (`message.tool_calls[i]` of a non-streamed answer).
pub fn openai_call(id: &str, name: &str, i: u64) -> String {
    openai_call_with(id, name, &arguments(i))
}

/// One whole OpenAI tool call with `arguments` as given (the JSON text, or
/// any text a scripted answer sends).
pub fn openai_call_with(id: &str, name: &str, arguments: &str) -> String {
    format!(
        "{{\"id\":{},\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":{}}}}}",
        json_str(id),
        json_str(name),
        json_str(arguments)
    )
}

/// The stream delta that opens call `i`: id, type, name and empty arguments.
pub fn openai_head_delta(id: &str, name: &str, i: u64) -> String {
    format!(
        "{{\"tool_calls\":[{{\"index\":{i},\"id\":{},\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":\"\"}}}}]}}",
        json_str(id),
        json_str(name)
    )
}

/// The stream delta carrying one argument fragment of call `i`.
pub fn openai_fragment_delta(i: u64, fragment: &str) -> String {
    format!("{{\"tool_calls\":[{{\"index\":{i},\"function\":{{\"arguments\":{}}}}}]}}", json_str(fragment))
}

/// Id of Anthropic `tool_use` block `i` in request `seq`: `toolu_mock_<seq>_<i>`.
pub fn tool_use_id(seq: u64, i: u64) -> String {
    format!("toolu_mock_{seq}_{i}")
}

/// An Anthropic `tool_use` content block with `input` (the whole arguments
/// of call `i`, or `{}` as a stream's `content_block_start` has it).
pub fn anthropic_tool_use(id: &str, name: &str, input: &str) -> String {
    format!("{{\"type\":\"tool_use\",\"id\":{},\"name\":{},\"input\":{input}}}", json_str(id), json_str(name))
}

/// One Ollama tool call: `{"id","function":{"index","name","arguments":{..}}}`.
pub fn ollama_call(id: &str, name: &str, i: u64) -> String {
    ollama_call_with(id, name, i, &arguments(i))
}

/// One Ollama tool call with `arguments` as given: a JSON value's text (an
/// object, as Ollama sends; anything else only from a scripted answer).
pub fn ollama_call_with(id: &str, name: &str, i: u64, arguments: &str) -> String {
    format!(
        "{{\"id\":{},\"function\":{{\"index\":{i},\"name\":{},\"arguments\":{arguments}}}}}",
        json_str(id),
        json_str(name)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn fragments_reassemble_to_the_arguments() {
        for i in [0, 7, 12, 1234] {
            let joined: String = (0..FRAGMENTS).map(|j| fragment(i, j)).collect();
            assert_eq!(joined, arguments(i));
            let v: Value = serde_json::from_str(&joined).unwrap();
            assert_eq!(v, json!({"city": "Paris", "n": i}));
        }
    }

    #[test]
    fn deltas_and_calls_are_openai_and_ollama_shaped() {
        let head: Value = serde_json::from_str(&openai_head_delta(&call_id(5, 0, 1), "get_weather", 1)).unwrap();
        assert_eq!(
            head,
            json!({"tool_calls":[{"index":1,"id":"call_5_1","type":"function","function":{"name":"get_weather","arguments":""}}]})
        );
        let frag: Value = serde_json::from_str(&openai_fragment_delta(1, "\":\"")).unwrap();
        assert_eq!(frag, json!({"tool_calls":[{"index":1,"function":{"arguments":"\":\""}}]}));
        let call: Value = serde_json::from_str(&openai_call("call_5_0", "f", 0)).unwrap();
        assert_eq!(call["function"]["arguments"], r#"{"city":"Paris","n":0}"#);
        let call: Value = serde_json::from_str(&ollama_call("call_5_2", "f", 2)).unwrap();
        assert_eq!(call, json!({"id":"call_5_2","function":{"index":2,"name":"f","arguments":{"city":"Paris","n":2}}}));
        assert_eq!(call_id(5, 2, 1), "call_5_c2_1");
        assert_eq!(echo("11 C"), "tool said: 11 C");
        let block: Value = serde_json::from_str(&anthropic_tool_use(&tool_use_id(5, 1), "f", &arguments(1))).unwrap();
        assert_eq!(block, json!({"type":"tool_use","id":"toolu_mock_5_1","name":"f","input":{"city":"Paris","n":1}}));
    }
}
