//! A model of a server's prompt-prefix cache (vLLM's automatic prefix
//! caching, llama.cpp's slot reuse): with `--prefix-cache-ttft-ms` or
//! `--prefix-miss-ttft-ms`, a model request's first token waits the miss
//! delay unless this mock instance saw the same prompt prefix before (one
//! of its last `--prefix-cache-entries` prefixes), then the hit delay,
//! added to the first-token delay it has anyway. One mock per target in a
//! benchmark then rewards sending a conversation back where it ran.
//!
//! The prefix is what every turn of a conversation resends first: the
//! system prompt (`system`, `instructions`), the leading system and
//! developer messages and the first other message (`messages`, `input`,
//! `prompt`), as JSON text.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use serde_json::Value;

/// The flags' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixDelays {
    /// Added to the first-token delay on a prefix seen before.
    pub hit: Duration,
    /// Added on a prefix not seen (or evicted since).
    pub miss: Duration,
}

/// The last `capacity` prefixes seen, least recently used evicted first.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    /// Prefix hash → when it was last used.
    used: HashMap<u64, u64>,
    /// When → prefix hash (oldest first).
    by_age: BTreeMap<u64, u64>,
    tick: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity` prefixes (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), used: HashMap::new(), by_age: BTreeMap::new(), tick: 0 }
    }

    /// Whether `prefix` was cached; it is (again) the most recent after.
    pub fn touch(&mut self, prefix: u64) -> bool {
        self.tick += 1;
        let hit = match self.used.insert(prefix, self.tick) {
            Some(before) => {
                self.by_age.remove(&before);
                true
            }
            None => false,
        };
        self.by_age.insert(self.tick, prefix);
        while self.used.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            self.used.remove(&oldest);
        }
        hit
    }
}

/// The prompt prefix of a model request body (None: not JSON, or no prompt).
pub fn prefix_of(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let system = v.get("system").or_else(|| v.get("instructions")).filter(|s| !s.is_null());
    let conversation = ["messages", "input", "prompt"].iter().find_map(|k| v.get(*k)).filter(|c| !c.is_null());
    if system.is_none() && conversation.is_none() {
        return None;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    system.map(Value::to_string).hash(&mut h);
    match conversation {
        Some(Value::Array(items)) => {
            let is_system = |m: &Value| matches!(m.get("role").and_then(Value::as_str), Some("system" | "developer"));
            let lead = items.iter().take_while(|m| is_system(m)).count();
            for m in items.iter().take(lead + 1) {
                m.to_string().hash(&mut h);
            }
        }
        other => other.map(Value::to_string).hash(&mut h),
    }
    Some(h.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn least_recently_used_prefixes_are_evicted() {
        let mut c = PrefixCache::new(2);
        assert!(!c.touch(1));
        assert!(!c.touch(2));
        assert!(c.touch(1), "1 is now the most recent");
        assert!(!c.touch(3), "evicts 2");
        assert!(c.touch(1));
        assert!(!c.touch(2));
        assert_eq!(c.used.len(), 2);
        assert_eq!(c.by_age.len(), 2);
    }

    #[test]
    fn every_turn_of_a_conversation_has_its_first_turns_prefix() {
        let of = |v: Value| prefix_of(v.to_string().as_bytes());
        let t1 = of(json!({"model": "m", "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "q"}]}));
        let t2 = of(json!({"model": "x", "stream": true, "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "r"}]}));
        let other = of(json!({"model": "m", "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "q2"}]}));
        assert!(t1.is_some());
        assert_eq!(t1, t2);
        assert_ne!(t1, other);
        assert_ne!(of(json!({"system": "a", "messages": []})), of(json!({"system": "b", "messages": []})));
        assert!(of(json!({"input": "text"})).is_some());
        assert_eq!(of(json!({"model": "m"})), None);
        assert_eq!(prefix_of(b"not json"), None);
    }
}
