//! The engine's Lua scripts (one atomic script per check) and the names of
//! its keys. Times are the engine's own clock (`TIME`, in µs): every edge
//! reads the same one. Keys are named by the API key's configured name,
//! never by the key: `{prefix}key:{len}:{name}:…`, the length keeping names
//! that contain `:` apart.

/// Checks a key's limits and takes one request when they allow it.
/// KEYS: requests tat, tokens tat, day counter, month counter. ARGV:
/// requests_per_minute, tokens_per_minute, tokens_per_day,
/// tokens_per_month (0: none). Returns `{code, wait_us}`: 0 allowed,
/// 1 requests, 2 tokens, 3 day, 4 month (the edge knows the period's end).
pub const CHECK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local minute = 60000000
local rpm, tpm, tpd, tpmo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if tpm > 0 then
  local interval = math.max(1, math.floor(minute / tpm))
  local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
  local ahead = tat - now
  if ahead > minute - interval then return {2, ahead - minute + interval} end
end
if tpd > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= tpd then return {3, 0} end
if tpmo > 0 and tonumber(redis.call('GET', KEYS[4]) or '0') >= tpmo then return {4, 0} end
if rpm > 0 then
  local interval = math.max(1, math.floor(minute / rpm))
  local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
  local ahead = tat + interval - now
  if ahead > minute then return {1, ahead - minute} end
  redis.call('SET', KEYS[1], string.format('%d', tat + interval), 'PX', math.floor(ahead / 1000) + 1000)
end
return {0, 0}
";

/// Charges tokens a finished request reported. KEYS: tokens tat, day
/// counter, month counter. ARGV: tokens, tokens_per_minute (0: none),
/// seconds left in the day (0: no day budget), in the month (0: none).
pub const CHARGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local units, tpm, day, month = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if tpm > 0 then
  local interval = math.max(1, math.floor(60000000 / tpm))
  local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now) + interval * units
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1000)
end
if day > 0 then
  redis.call('INCRBY', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], day + 3600)
end
if month > 0 then
  redis.call('INCRBY', KEYS[3], ARGV[1])
  redis.call('EXPIRE', KEYS[3], month + 3600)
end
return 0
";

/// Marks this edge present and counts the edges seen in the last
/// `ARGV[2]` ms. KEYS: the presence set. ARGV: this edge's id, window ms.
pub const PRESENCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], window * 2)
return redis.call('ZCARD', KEYS[1])
";

/// The engine's key names under one prefix.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self { prefix: prefix.to_owned() }
    }

    fn key(&self, name: &str, what: &str) -> String {
        format!("{}key:{}:{name}:{what}", self.prefix, name.len())
    }

    /// A key's requests tat.
    pub fn requests(&self, name: &str) -> String {
        self.key(name, "rpm")
    }

    /// A key's tokens tat.
    pub fn tokens(&self, name: &str) -> String {
        self.key(name, "tpm")
    }

    /// A key's tokens in UTC day `index`.
    pub fn day(&self, name: &str, index: u64) -> String {
        self.key(name, &format!("d{index}"))
    }

    /// A key's tokens in UTC month `index`.
    pub fn month(&self, name: &str, index: u64) -> String {
        self.key(name, &format!("m{index}"))
    }

    /// The limits the admin API set for a key (a hash).
    pub fn limits(&self, name: &str) -> String {
        self.key(name, "limits")
    }

    /// The names of the keys with limits set (a set).
    pub fn limit_names(&self) -> String {
        format!("{}limits", self.prefix)
    }

    /// Bumped at every change of the set limits.
    pub fn limits_version(&self) -> String {
        format!("{}limits:version", self.prefix)
    }

    /// The live edges (a sorted set by last presence).
    pub fn edges(&self) -> String {
        format!("{}edges", self.prefix)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_colons_apart_and_hold_no_secret() {
        let n = Names::new("iop:");
        assert_eq!(n.requests("alice"), "iop:key:5:alice:rpm");
        assert_ne!(n.day("a:d1", 1), n.day("a", 1));
        assert_ne!(n.requests("a:rpm"), n.key("a", "rpm:rpm"));
        assert_eq!(n.limits_version(), "iop:limits:version");
    }
}
