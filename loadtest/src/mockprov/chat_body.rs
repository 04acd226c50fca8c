//! The non-streamed `chat.completion` body and the usage object both chat
//! shapes share.

use super::chat::{Answer, Plan};
use super::json::json_str;
use super::reply::{SERVICE_TIER, SYSTEM_FINGERPRINT};
use super::{logprobs, overrides, tool_calls};

/// `usage` of a chat answer: every choice counts.
pub fn usage_json(plan: &Plan) -> String {
    let completion = plan.completion_tokens();
    format!(
        "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{},\
         \"prompt_tokens_details\":{{\"cached_tokens\":0}},\
         \"completion_tokens_details\":{{\"reasoning_tokens\":{}}}}}",
        plan.prompt_tokens,
        completion,
        plan.prompt_tokens + completion,
        plan.reasoning.saturating_mul(plan.choices)
    )
}

/// The whole non-streamed `chat.completion` body.
pub fn completion_body(plan: &Plan) -> String {
    let choices: Vec<String> = (0..plan.choices).map(|c| choice(plan, c)).collect();
    format!(
        "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{}],\"usage\":{},\
         \"service_tier\":{},\"system_fingerprint\":{}}}",
        json_str(&plan.id),
        plan.created,
        json_str(&plan.model),
        choices.join(","),
        usage_json(plan),
        json_str(SERVICE_TIER),
        json_str(SYSTEM_FINGERPRINT)
    )
}

/// `choices[c]`: the message, its logprobs and the finish reason.
fn choice(plan: &Plan, c: u64) -> String {
    let pieces: Vec<String> = (0..plan.content).map(|i| plan.piece(c, i)).collect();
    let logprobs = |refusal: bool| match plan.logprobs {
        Some(top) => {
            let entries: Vec<String> = pieces.iter().zip(0..).map(|(t, i)| logprobs::token_entry(t, i, top)).collect();
            logprobs::choice_logprobs(&entries, refusal)
        }
        None => "null".to_owned(),
    };
    let (content, refusal, calls, logprobs) = match &plan.answer {
        Answer::Tokens | Answer::Text(_) => {
            (json_str(&pieces.concat()), "null".to_owned(), String::new(), logprobs(false))
        }
        Answer::Refusal(_) => ("null".to_owned(), json_str(&pieces.concat()), String::new(), logprobs(true)),
        Answer::ToolCalls { calls, name } => {
            let list: Vec<String> =
                (0..*calls).map(|i| tool_calls::openai_call(&tool_calls::call_id(plan.seq, c, i), name, i)).collect();
            ("null".to_owned(), "null".to_owned(), format!(",\"tool_calls\":[{}]", list.join(",")), "null".to_owned())
        }
    };
    let reasoning = if plan.reasoning > 0 {
        let text: String = (0..plan.reasoning).map(|i| overrides::reasoning_token(c, i)).collect();
        format!(",\"reasoning_content\":{}", json_str(&text))
    } else {
        String::new()
    };
    let stop = plan.stop_reason.as_deref().map_or_else(String::new, |s| format!(",\"stop_reason\":{}", json_str(s)));
    format!(
        "{{\"index\":{c},\"message\":{{\"role\":\"assistant\",\"content\":{content},\"refusal\":{refusal}{calls}\
         {reasoning},\"annotations\":[]}},\"logprobs\":{logprobs},\"finish_reason\":{}{stop}}}",
        json_str(plan.finish_reason)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::mockprov::chat::plan;
    use crate::mockprov::MockConfig;
    use serde_json::{json, Value};

    fn body(req: &str) -> Value {
        let p = plan(req.as_bytes(), &MockConfig::for_tests(), 4, 100).unwrap();
        serde_json::from_str(&completion_body(&p)).unwrap()
    }

    #[test]
    fn plain_completion_has_openai_metadata() {
        let v = body(r#"{"messages":[{"content":"x"}],"mock":{"tokens":2}}"#);
        assert_eq!((&v["system_fingerprint"], &v["service_tier"]), (&json!("fp_mock"), &json!("default")));
        let m = &v["choices"][0]["message"];
        assert_eq!(m, &json!({"role":"assistant","content":"tok0 tok1 ","refusal":null,"annotations":[]}));
        assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    }

    #[test]
    fn tool_calls_are_whole_objects_with_null_content() {
        let v = body(r#"{"messages":[{"content":"x"}],"mock":{"tool_calls":2}}"#);
        let c = &v["choices"][0];
        assert_eq!((&c["finish_reason"], &c["message"]["content"]), (&json!("tool_calls"), &Value::Null));
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call["id"], format!("call_4_{i}"));
            assert_eq!((&call["type"], &call["function"]["name"]), (&json!("function"), &json!("get_weather")));
            let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(args, json!({"city":"Paris","n":i}));
        }
        assert_eq!(v["usage"]["completion_tokens"], 18);
    }

    #[test]
    fn refusal_n_choices_and_logprobs() {
        let v = body(r#"{"messages":[{"content":"x"}],"mock":{"refusal":"No way."}}"#);
        let m = &v["choices"][0]["message"];
        assert_eq!((&m["content"], &m["refusal"]), (&Value::Null, &json!("No way.")));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");

        let v = body(
            r#"{"messages":[{"content":"x"}],"n":2,"logprobs":true,"top_logprobs":1,"mock":{"tokens":3,"reasoning":1}}"#,
        );
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        assert_eq!(choices[1]["index"], 1);
        assert_eq!(choices[1]["message"]["content"], "tok0-c1 tok1-c1 tok2-c1 ");
        assert_eq!(choices[1]["message"]["reasoning_content"], "think0-c1 ");
        let lp = choices[0]["logprobs"]["content"].as_array().unwrap();
        let tokens: Vec<&str> = lp.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(tokens, ["tok0 ", "tok1 ", "tok2 "]);
        assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 1);
        assert_eq!(
            (
                v["usage"]["completion_tokens"].as_u64(),
                v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64()
            ),
            (Some(8), Some(2))
        );
    }
}
