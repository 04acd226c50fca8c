//! The shared readers ([`crate::translate::read`]) and what only
//! Anthropic's blocks carry: `cache_control` and a block's `type`.

use serde_json::{Map, Value};

pub(super) use crate::translate::read::{
    array, boolean, count, invalid, number, object, required, shown, string, take, Dropped, Path,
};
use crate::translate::Invalid;

/// `cache_control` taken out of `m`; only caching is lost with it.
pub(super) fn cache_control(dropped: &mut Dropped, m: &mut Map<String, Value>) {
    if take(m, "cache_control").is_some() {
        dropped.add("cache_control");
    }
}

/// A content block: the object, its `type` and `cache_control` taken out.
pub(super) fn block(v: Value, at: Path<'_>, dropped: &mut Dropped) -> Result<(String, Map<String, Value>), Invalid> {
    let mut m = object(v, at)?;
    let kind = string(required(&mut m, "type", at)?, at.key("type"))?;
    cache_control(dropped, &mut m);
    Ok((kind, m))
}
