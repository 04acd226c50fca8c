//! Content parts of a message item (`input_text`, `output_text`,
//! `refusal`, `input_image`, `input_file`) and of a function call's output,
//! onto chat content.

use serde_json::{json, Map, Value};

use crate::translate::{
    image,
    read::{invalid, object, required, shown, string, take, Dropped, Path},
    Invalid,
};

/// Text parts of one message become one string joined with this, as the
/// node joins text parts for Ollama: the model reads the same text
/// whichever shape arrived.
pub(super) const TEXT_JOIN: &str = "\n";

/// Keys of an `output_text` part that describe an earlier answer
/// (citations, token log-probabilities) rather than what the model reads:
/// not forwarded, and nothing is lost by that.
const OUTPUT_ONLY: &[&str] = &["annotations", "logprobs"];

/// One piece of a message's content, in order.
pub(super) enum Part {
    Text(String),
    Image(Value),
}

/// `content` of a message item (a string or parts); `images` says whether
/// the role may carry images (user messages only).
pub(super) fn content(
    v: Value,
    at: Path<'_>,
    images: bool,
    max_image_bytes: usize,
    dropped: &mut Dropped,
) -> Result<Vec<Part>, Invalid> {
    let list = match v {
        Value::String(s) => return Ok(vec![Part::Text(s)]),
        Value::Array(list) => list,
        _ => return Err(invalid(at, "must be a string or an array of content parts")),
    };
    let mut parts = Vec::with_capacity(list.len());
    for (j, p) in list.into_iter().enumerate() {
        let pat = at.index(j);
        let mut p = object(p, pat)?;
        let kind = string(required(&mut p, "type", pat)?, pat.key("type"))?;
        match kind.as_str() {
            "input_text" | "output_text" => {
                parts.push(Part::Text(string(required(&mut p, "text", pat)?, pat.key("text"))?));
                for key in OUTPUT_ONLY {
                    p.remove(*key);
                }
            }
            "refusal" => parts.push(Part::Text(string(required(&mut p, "refusal", pat)?, pat.key("refusal"))?)),
            "input_image" if !images => {
                return Err(invalid(pat.key("type"), "input_image parts are only allowed in user messages"))
            }
            "input_image" => {
                if let Some(image) = input_image(&mut p, pat, max_image_bytes, dropped)? {
                    parts.push(Part::Image(image));
                }
            }
            // A file's text would need the Files API or a PDF reader.
            "input_file" => {
                dropped.add("input_file");
                continue;
            }
            other => {
                return Err(invalid(pat.key("type"), format_args!("unknown content part type \"{}\"", shown(other))))
            }
        }
        dropped.rest(p, &kind);
    }
    Ok(parts)
}

/// Text only: one string.
pub(super) fn text(parts: Vec<Part>) -> String {
    let texts: Vec<String> =
        parts.into_iter().filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None }).collect();
    texts.join(TEXT_JOIN)
}

/// A user message's content: a string when the parts are all text, else
/// chat content parts in order.
pub(super) fn user(parts: Vec<Part>) -> Value {
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        return Value::String(text(parts));
    }
    Value::Array(
        parts
            .into_iter()
            .map(|p| match p {
                Part::Text(t) => json!({"type": "text", "text": t}),
                Part::Image(image_url) => json!({"type": "image_url", "image_url": image_url}),
            })
            .collect(),
    )
}

/// An `input_image` part as a chat `image_url` object; `None` for a Files
/// API reference (`file_id`), which only OpenAI can resolve.
fn input_image(
    p: &mut Map<String, Value>,
    at: Path<'_>,
    max_image_bytes: usize,
    dropped: &mut Dropped,
) -> Result<Option<Value>, Invalid> {
    let file = take(p, "file_id").map(|f| string(f, at.key("file_id"))).transpose()?;
    let detail = take(p, "detail").map(|d| string(d, at.key("detail"))).transpose()?;
    let Some(url) = take(p, "image_url") else {
        if file.is_none() {
            return Err(invalid(at.key("image_url"), "field required (or `file_id`)"));
        }
        dropped.add("input_image.file_id");
        return Ok(None);
    };
    let uat = at.key("image_url");
    let url = string(url, uat)?;
    image_url(&url, uat, max_image_bytes)?;
    let mut out = Map::new();
    out.insert("url".into(), url.into());
    if let Some(detail) = detail {
        out.insert("detail".into(), detail.into());
    }
    Ok(Some(Value::Object(out)))
}

/// An image URL a chat server can take: http(s), or a base64 data URL
/// within the size limit (413 over it).
fn image_url(url: &str, at: Path<'_>, max_image_bytes: usize) -> Result<(), Invalid> {
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("http" | "https") => Ok(()),
        Some("data") => {
            let Some((head, data)) = url.split_once(',') else {
                return Err(invalid(at, "a data URL needs a `,` before its data"));
            };
            if !head.to_ascii_lowercase().ends_with(";base64") {
                return Err(invalid(at, "a data URL must be base64 (`data:<type>;base64,<data>`)"));
            }
            image::within(image::decoded_len(data), max_image_bytes, at)
        }
        _ => Err(invalid(at, "must be an http(s) URL or a base64 data URL")),
    }
}

/// A `function_call_output`'s `output`: a string, or parts whose text is
/// joined; images and files cannot ride in a chat tool message.
pub(super) fn output(v: Value, at: Path<'_>, dropped: &mut Dropped) -> Result<String, Invalid> {
    let list = match v {
        Value::String(s) => return Ok(s),
        Value::Array(list) => list,
        _ => return Err(invalid(at, "must be a string or an array of content parts")),
    };
    let mut texts = Vec::with_capacity(list.len());
    for (j, p) in list.into_iter().enumerate() {
        let pat = at.index(j);
        let mut p = object(p, pat)?;
        let kind = string(required(&mut p, "type", pat)?, pat.key("type"))?;
        match kind.as_str() {
            "input_text" | "output_text" => {
                texts.push(string(required(&mut p, "text", pat)?, pat.key("text"))?);
                for key in OUTPUT_ONLY {
                    p.remove(*key);
                }
                dropped.rest(p, &kind);
            }
            "input_image" | "input_file" => dropped.add(&format!("function_call_output.{kind}")),
            other => {
                return Err(invalid(pat.key("type"), format_args!("unknown content part type \"{}\"", shown(other))))
            }
        }
    }
    Ok(texts.join(TEXT_JOIN))
}
