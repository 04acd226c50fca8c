//! `POST /mock/health`: what the model lists (`GET /v1/models`,
//! `GET /api/tags`) answer, so tests can make the provider look unhealthy
//! or still loading and then recover, without restarting it.

use std::cell::Cell;

use serde::Deserialize;

use super::errors;

/// What the model lists answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListHealth {
    /// The list, 200.
    #[default]
    Ok,
    /// 503 with an OpenAI-shaped error.
    Down,
    /// 503 "Loading model", as llama.cpp's server answers while it loads.
    Loading,
}

impl ListHealth {
    fn name(self) -> &'static str {
        match self {
            ListHealth::Ok => "ok",
            ListHealth::Down => "down",
            ListHealth::Loading => "loading",
        }
    }

    /// The 503 body a list answers with, unless `Ok`.
    pub fn error_body(self) -> Option<String> {
        match self {
            ListHealth::Ok => None,
            ListHealth::Down => Some(errors::error_body("service unavailable", "server_error", "null")),
            // llama.cpp's shape while the model loads.
            ListHealth::Loading => {
                Some(r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#.to_owned())
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetHealth {
    state: String,
}

/// Applies a `POST /mock/health` body; the answer's status and body.
pub fn set(cell: &Cell<ListHealth>, body: &[u8]) -> (u16, String) {
    let parsed: Result<SetHealth, _> = serde_json::from_slice(body);
    let state = match parsed.as_ref().map(|s| s.state.as_str()) {
        Ok("ok") => ListHealth::Ok,
        Ok("down") => ListHealth::Down,
        Ok("loading") => ListHealth::Loading,
        _ => {
            let msg = r#"expected {"state": "ok" | "down" | "loading"}"#;
            return (400, errors::error_body(msg, "invalid_request_error", "null"));
        }
    };
    cell.set(state);
    (200, format!("{{\"state\":\"{}\"}}", state.name()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn states_are_set_and_bad_bodies_refused() {
        let cell = Cell::new(ListHealth::Ok);
        assert_eq!(set(&cell, br#"{"state":"loading"}"#).0, 200);
        assert_eq!(cell.get(), ListHealth::Loading);
        assert!(cell.get().error_body().unwrap().contains("Loading model"));
        assert_eq!(set(&cell, br#"{"state":"ok"}"#), (200, r#"{"state":"ok"}"#.to_owned()));
        assert_eq!(cell.get().error_body(), None);
        assert_eq!(set(&cell, br#"{"state":"sideways"}"#).0, 400);
        assert_eq!(set(&cell, b"nope").0, 400);
        assert_eq!(cell.get(), ListHealth::Ok);
    }
}
