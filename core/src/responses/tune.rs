//! Fields that tune the answer beyond sampling: `text` (the output format)
//! and `reasoning`.

use serde_json::{json, Map, Value};

use crate::translate::{
    read::{boolean, invalid, object, required, shown, string, take, Dropped, Path},
    Invalid,
};

/// `text`: `format` as `response_format`; returns `text` for the echo
/// (`format` defaulting to text).
pub(super) fn text_format(v: Value, dropped: &mut Dropped, out: &mut Map<String, Value>) -> Result<Value, Invalid> {
    let at = Path::top("text");
    let mut t = object(v, at)?;
    let mut echo = t.clone();
    if let Some(f) = take(&mut t, "format") {
        let fat = at.key("format");
        let mut f = object(f, fat)?;
        let kind = string(required(&mut f, "type", fat)?, fat.key("type"))?;
        match kind.as_str() {
            "text" => {}
            "json_object" => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            "json_schema" => {
                out.insert("response_format".into(), json_schema(&mut f, fat)?);
            }
            other => {
                return Err(invalid(
                    fat.key("type"),
                    format_args!("must be \"text\", \"json_object\" or \"json_schema\", not \"{}\"", shown(other)),
                ))
            }
        }
        dropped.rest(f, &format!("text.format.{kind}"));
    } else {
        echo.insert("format".into(), json!({"type": "text"}));
    }
    // Chat servers other than OpenAI's have no verbosity.
    dropped.rest(t, "text");
    Ok(Value::Object(echo))
}

/// A `json_schema` format (flat in Responses) as chat's nested one.
fn json_schema(f: &mut Map<String, Value>, at: Path<'_>) -> Result<Value, Invalid> {
    let name = string(required(f, "name", at)?, at.key("name"))?;
    let schema = required(f, "schema", at)?;
    if !schema.is_object() {
        return Err(invalid(at.key("schema"), "must be an object"));
    }
    let mut js = Map::new();
    js.insert("name".into(), name.into());
    if let Some(d) = take(f, "description") {
        js.insert("description".into(), string(d, at.key("description"))?.into());
    }
    js.insert("schema".into(), schema);
    if let Some(s) = take(f, "strict") {
        js.insert("strict".into(), boolean(s, at.key("strict"))?.into());
    }
    Ok(json!({"type": "json_schema", "json_schema": js}))
}

/// Reasoning efforts chat takes as `reasoning_effort` (the node maps them
/// for Ollama).
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// `reasoning.effort` as `reasoning_effort`; a summary cannot be asked of
/// a chat server. Returns the echo's `reasoning`.
pub(super) fn reasoning(
    v: Option<Value>,
    dropped: &mut Dropped,
    out: &mut Map<String, Value>,
) -> Result<Value, Invalid> {
    let at = Path::top("reasoning");
    let Some(v) = v else {
        // The echo's default, written by the edge.
        return Ok(Value::Null);
    };
    let mut r = object(v, at)?;
    let effort = take(&mut r, "effort").map(|e| string(e, at.key("effort"))).transpose()?;
    if let Some(effort) = &effort {
        if !EFFORTS.contains(&effort.as_str()) {
            return Err(invalid(
                at.key("effort"),
                format_args!("must be one of {}, not \"{}\"", EFFORTS.join(", "), shown(effort)),
            ));
        }
        out.insert("reasoning_effort".into(), effort.as_str().into());
    }
    let summary = take(&mut r, "summary").map(|s| string(s, at.key("summary"))).transpose()?;
    if summary.is_some() {
        dropped.add("reasoning.summary");
    }
    dropped.rest(r, "reasoning");
    Ok(json!({"effort": effort, "summary": summary}))
}
