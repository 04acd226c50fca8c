//! What each stage asks its model group, in the edge's own words and
//! schemas (nothing of a client's options can replace them), and the
//! strict reading of the Plan and Review results: exactly the schema's
//! fields, non-empty, bounded; anything else is malformed.

use serde::Deserialize;
use serde_json::{json, Value};

/// Longest plan, verification, findings or final text taken, in bytes.
pub const MAX_FIELD_BYTES: usize = 16 * 1024;

/// The Plan stage's instructions.
const PLAN_PROMPT: &str = "You plan a software task that another model will carry out in a workspace \
(a directory it can read, list, write and delete files in, and run named commands in). \
Answer only with the JSON object the response format asks for: `plan`, the steps in order, \
and `verification`, how to tell the task is done (e.g. which command must pass).";

/// The Work stage's instructions.
const WORK_PROMPT: &str = "You carry out a software task in a workspace with the workspace tools, one call at a time. \
Paths are relative to the workspace root. Follow the plan. When the task is done and verified, answer without \
calling a tool: say what you changed and the verification evidence (what you ran and what it showed).";

/// The Review stage's instructions.
const REVIEW_PROMPT: &str = "You review a software task carried out in a workspace. You get the task, its plan \
and the worker's report with its verification evidence. Answer only with the JSON object the response format \
asks for: `verdict` is `approve` when the task is done as planned and verified, else `repair`; `findings` says \
why, and for `repair` what must change.";

/// A strict plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The steps.
    pub plan: String,
    /// How to tell it is done.
    pub verification: String,
}

/// A review's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Done.
    Approve,
    /// Back to work.
    Repair,
}

/// A strict review.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Review {
    /// The verdict.
    pub verdict: Verdict,
    /// Why; what to repair.
    pub findings: String,
}

fn response_format(name: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "json_schema",
        "json_schema": {
            "name": name,
            "strict": true,
            "schema": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
        },
    })
}

/// The Plan stage's chat request (without `model`).
pub fn plan_request(task: &str, max_tokens: u32) -> Value {
    let properties = json!({"plan": {"type": "string"}, "verification": {"type": "string"}});
    json!({
        "messages": [
            {"role": "system", "content": PLAN_PROMPT},
            {"role": "user", "content": task},
        ],
        "response_format": response_format("iop_plan", properties, &["plan", "verification"]),
        "max_tokens": max_tokens,
        "stream": false,
    })
}

/// The Work stage's first messages: the task, the plan as read back from
/// its artifact, and a review's findings when it is a repair.
pub fn work_messages(task: &str, plan: &str, findings: Option<&str>) -> Vec<Value> {
    let mut user = format!("Task:\n{task}\n\n{plan}");
    if let Some(f) = findings {
        user.push_str("\n\nThe review sent the work back. Its findings:\n");
        user.push_str(f);
    }
    vec![json!({"role": "system", "content": WORK_PROMPT}), json!({"role": "user", "content": user})]
}

/// A Work stage's chat request over `messages` (no reasoning effort: the
/// work group runs as configured).
pub fn work_request(messages: &[Value], tools: &[Value], max_tokens: u32) -> Value {
    json!({
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "max_tokens": max_tokens,
        "stream": false,
    })
}

/// The Review stage's chat request.
pub fn review_request(task: &str, plan: &str, evidence: &str, max_tokens: u32) -> Value {
    let properties =
        json!({"verdict": {"type": "string", "enum": ["approve", "repair"]}, "findings": {"type": "string"}});
    json!({
        "messages": [
            {"role": "system", "content": REVIEW_PROMPT},
            {"role": "user", "content": format!("Task:\n{task}\n\n{plan}\n\nThe worker's report:\n{evidence}")},
        ],
        "response_format": response_format("iop_review", properties, &["verdict", "findings"]),
        "max_tokens": max_tokens,
        "stream": false,
    })
}

fn bounded(s: &str) -> bool {
    !s.trim().is_empty() && s.len() <= MAX_FIELD_BYTES
}

/// The plan in `text`, read strictly.
pub fn parse_plan(text: &str) -> Option<Plan> {
    let p: Plan = serde_json::from_str(text.trim()).ok()?;
    (bounded(&p.plan) && bounded(&p.verification)).then_some(p)
}

/// The review in `text`, read strictly.
pub fn parse_review(text: &str) -> Option<Review> {
    let r: Review = serde_json::from_str(text.trim()).ok()?;
    bounded(&r.findings).then_some(r)
}

/// The PLAN artifact: bounded Markdown, the same for the same plan.
pub fn plan_markdown(p: &Plan) -> String {
    format!("# Plan\n\n{}\n\n## Verification\n\n{}\n", p.plan.trim(), p.verification.trim())
}

/// The REVIEW artifact.
pub fn review_markdown(r: &Review) -> String {
    let verdict = match r.verdict {
        Verdict::Approve => "approve",
        Verdict::Repair => "repair",
    };
    format!("# Review\n\nVerdict: {verdict}\n\n{}\n", r.findings.trim())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_reviews_are_read_strictly() {
        let p = parse_plan(r#"{"plan":"1. write","verification":"cargo test"}"#).unwrap();
        assert_eq!(p.verification, "cargo test");
        assert!(plan_markdown(&p).starts_with("# Plan\n\n1. write"));
        assert!(parse_plan(r#"{"plan":"x"}"#).is_none());
        assert!(parse_plan(r#"{"plan":"x","verification":"y","extra":1}"#).is_none());
        assert!(parse_plan(r#"{"plan":" ","verification":"y"}"#).is_none());
        assert!(parse_plan("the plan is to").is_none());
        let long = "x".repeat(MAX_FIELD_BYTES + 1);
        assert!(parse_plan(&json!({"plan": long, "verification": "y"}).to_string()).is_none());
        let r = parse_review(r#"{"verdict":"repair","findings":"add a test"}"#).unwrap();
        assert_eq!(r.verdict, Verdict::Repair);
        assert!(review_markdown(&r).contains("Verdict: repair"));
        assert!(parse_review(r#"{"verdict":"maybe","findings":"x"}"#).is_none());
    }

    #[test]
    fn the_stage_schemas_are_the_edges() {
        let p = plan_request("t", 100);
        assert_eq!(p["response_format"]["json_schema"]["name"], "iop_plan");
        assert_eq!(p["response_format"]["json_schema"]["strict"], true);
        let w = work_request(&work_messages("t", "# Plan", Some("f")), &[], 100);
        assert!(w.get("reasoning_effort").is_none());
        assert!(w["messages"][1]["content"].as_str().unwrap().contains("findings:\nf"));
        let r = review_request("t", "p", "e", 100);
        assert_eq!(r["response_format"]["json_schema"]["name"], "iop_review");
    }
}
