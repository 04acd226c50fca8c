//! The top-level object of a request body: read as a JSON tree with a key
//! given twice refused, and the translated body written back.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::{read::shown, Invalid};

/// The refusal of the body as a whole.
pub(crate) fn bad_body(what: impl fmt::Display) -> Invalid {
    Invalid { status: 400, param: String::new(), message: format!("invalid request body: {what}") }
}

/// The top-level object; a key given twice is refused (which one would a
/// reader honour?).
pub(crate) fn read_top(body: &[u8]) -> Result<Map<String, Value>, Invalid> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad_body("empty; expected a JSON object"));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(bad_body("expected a JSON object"));
    }
    let Top(top) = serde_json::from_slice(body).map_err(bad_body)?;
    top.map_err(|key| {
        let param = shown(&key).to_owned();
        Invalid { status: 400, message: format!("{param}: given twice"), param }
    })
}

/// The top-level object, or the first key given twice.
struct Top(Result<Map<String, Value>, String>);

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Top, A::Error> {
        let mut map = Map::new();
        let mut twice = None;
        while let Some(key) = access.next_key::<String>()? {
            // After a duplicate the rest is only checked for syntax, so a
            // later syntax error still reads as one.
            if twice.is_some() {
                access.next_value::<IgnoredAny>()?;
            } else if map.contains_key(&key) {
                access.next_value::<IgnoredAny>()?;
                twice = Some(key);
            } else {
                map.insert(key, access.next_value()?);
            }
        }
        Ok(Top(twice.map_or(Ok(map), Err)))
    }
}

/// The translated body as JSON bytes.
pub(crate) fn write(out: Map<String, Value>) -> Result<Vec<u8>, Invalid> {
    serde_json::to_vec(&Value::Object(out)).map_err(bad_body)
}
