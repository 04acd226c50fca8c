//! The top-level object of a request body, its fields kept as the JSON
//! text they were sent as (read only when a translation asks for them,
//! a key given twice refused), and the translated body written straight
//! into bytes.
//!
//! Why raw: a field the translation carries unchanged (a message's text, a
//! tool's schema, the fields a response echoes) is copied once, as written,
//! instead of being unescaped into a tree and escaped back out of it.

use std::{borrow::Cow, collections::BTreeMap, fmt, ops::Range};

use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{value::RawValue, Map, Value};

use super::{read::shown, Invalid};
use crate::request::{FieldKey, TopFields};

/// The refusal of the body as a whole.
pub(crate) fn bad_body(what: impl fmt::Display) -> Invalid {
    Invalid { status: 400, param: String::new(), message: format!("invalid request body: {what}") }
}

/// An object's fields in the order sent, values unread.
pub(crate) struct Fields<'a>(Vec<(Cow<'a, str>, &'a str)>);

impl<'a> Fields<'a> {
    /// The request's top-level object; a key given twice is refused (which
    /// one would a reader honour?).
    pub(crate) fn top(body: &'a [u8]) -> Result<Self, Invalid> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(bad_body("empty; expected a JSON object"));
        }
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(bad_body("expected a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let (fields, twice) = de.deserialize_map(FieldsVisitor { refuse_twice: true }).map_err(bad_body)?;
        de.end().map_err(bad_body)?;
        match twice {
            None => Ok(Self(fields)),
            Some(key) => Err(given_twice(&key)),
        }
    }

    /// The top-level fields: at their `places` when a first read kept
    /// them, else read from `body`.
    pub(crate) fn of(body: &'a [u8], places: Option<&'a TopFields>) -> Result<Self, Invalid> {
        match places {
            Some(places) => Self::at(body, places),
            None => Self::top(body),
        }
    }

    /// The top-level fields at the places a first read of `body` found
    /// them ([`Top::parse_keeping`](crate::request::Top::parse_keeping)):
    /// the same as [`Fields::top`] without walking the body again.
    pub(crate) fn at(body: &'a [u8], places: &'a TopFields) -> Result<Self, Invalid> {
        // One check for the whole body (a first read that kept places read
        // it all as JSON, so it is UTF-8), not one per key and value.
        let body = std::str::from_utf8(body).map_err(bad_body)?;
        let text = |r: &Range<usize>| body.get(r.clone()).ok_or_else(|| bad_body("a field out of place"));
        let mut fields = Collect::default();
        for (key, value) in &places.0 {
            let key = match key {
                FieldKey::At(r) => Cow::Borrowed(text(r)?),
                FieldKey::Escaped(k) => Cow::Borrowed(&**k),
            };
            if let Some(key) = fields.add(key, text(value)?, true) {
                return Err(given_twice(&key));
            }
        }
        Ok(Self(fields.fields))
    }

    /// Takes `key` out, as written; `null` counts as absent.
    pub(crate) fn take_raw(&mut self, key: &str) -> Option<&'a str> {
        let at = self.0.iter().position(|(k, _)| k == key)?;
        let (_, v) = self.0.swap_remove(at);
        (v != "null").then_some(v)
    }

    /// Takes `key` out, read as a JSON tree; `null` counts as absent.
    pub(crate) fn take(&mut self, key: &str) -> Result<Option<Value>, Invalid> {
        self.take_raw(key).map(tree).transpose()
    }

    /// The keys left with a non-null value (the known ones were taken out).
    pub(crate) fn rest(self) -> impl Iterator<Item = Cow<'a, str>> {
        self.0.into_iter().filter(|(_, v)| *v != "null").map(|(k, _)| k)
    }
}

/// `raw` read as a JSON tree. It was read once already, so only what the
/// first read does not check (the nesting limit, a number too large for a
/// float) can refuse it.
pub(crate) fn tree(raw: &str) -> Result<Value, Invalid> {
    serde_json::from_str(raw).map_err(bad_part)
}

/// The refusal of a part of the body read again: serde's position would
/// count from the part's start, not the body's, so it is left out.
fn bad_part(e: serde_json::Error) -> Invalid {
    let text = e.to_string();
    bad_body(text.rsplit_once(" at line ").map_or(text.as_str(), |(what, _)| what))
}

/// Whether `raw` is a JSON string.
pub(crate) fn is_string(raw: &str) -> bool {
    raw.starts_with('"')
}

/// Whether `raw` is a JSON array.
pub(crate) fn is_array(raw: &str) -> bool {
    raw.starts_with('[')
}

/// The elements of `raw`, a JSON array, each read as an object's fields
/// in the same pass (`None`: an element that is not an object).
pub(crate) fn objects(raw: &str) -> Result<Vec<Option<Fields<'_>>>, Invalid> {
    let mut de = serde_json::Deserializer::from_str(raw);
    de.deserialize_seq(ObjectsVisitor).map_err(bad_part)
}

struct ObjectsVisitor;

impl<'de> Visitor<'de> for ObjectsVisitor {
    type Value = Vec<Option<Fields<'de>>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(access.size_hint().unwrap_or(4).min(64));
        while let Some(MaybeObject(fields)) = access.next_element()? {
            out.push(fields);
        }
        Ok(out)
    }
}

/// An element read as an object's fields, or skipped.
struct MaybeObject<'a>(Option<Fields<'a>>);

impl<'de> Deserialize<'de> for MaybeObject<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MaybeObjectVisitor)
    }
}

struct MaybeObjectVisitor;

impl<'de> Visitor<'de> for MaybeObjectVisitor {
    type Value = MaybeObject<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, access: A) -> Result<Self::Value, A::Error> {
        let (fields, _) = read_fields(access, false)?;
        Ok(MaybeObject(Some(Fields(fields))))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        while access.next_element::<IgnoredAny>()?.is_some() {}
        Ok(MaybeObject(None))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(MaybeObject(None))
    }
}

struct FieldsVisitor {
    refuse_twice: bool,
}

type Read<'a> = (Vec<(Cow<'a, str>, &'a str)>, Option<String>);

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Read<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, access: A) -> Result<Read<'de>, A::Error> {
        read_fields(access, self.refuse_twice)
    }
}

/// Objects with more keys than this find a key given twice through an
/// index, not by a scan (a body of many keys must not cost their square).
const SCANNED_KEYS: usize = 16;

/// An object's fields; with `refuse_twice`, the first key given twice.
fn read_fields<'de, A: MapAccess<'de>>(mut access: A, refuse_twice: bool) -> Result<Read<'de>, A::Error> {
    let mut fields = Collect::default();
    let mut twice = None;
    while let Some(Key(key)) = access.next_key_seed(KeySeed)? {
        // After a duplicate the rest is only checked for syntax, so a
        // later syntax error still reads as one.
        if twice.is_some() {
            access.next_value::<IgnoredAny>()?;
            continue;
        }
        let value = access.next_value::<&'de RawValue>()?.get();
        twice = fields.add(key, value, refuse_twice).map(Cow::into_owned);
    }
    Ok((fields.fields, twice))
}

/// Fields gathered in order, a key given twice found by a scan while they
/// are few and through an index past [`SCANNED_KEYS`].
#[derive(Default)]
struct Collect<'a> {
    fields: Vec<(Cow<'a, str>, &'a str)>,
    index: Option<BTreeMap<Cow<'a, str>, usize>>,
}

impl<'a> Collect<'a> {
    /// Adds a field. A key there already: with `refuse_twice`, returned
    /// (and not added); else its value is replaced (the last one counts,
    /// as in a JSON tree).
    fn add(&mut self, key: Cow<'a, str>, value: &'a str, refuse_twice: bool) -> Option<Cow<'a, str>> {
        let at = match &self.index {
            Some(index) => index.get(&key).copied(),
            None => self.fields.iter().position(|(k, _)| *k == key),
        };
        match at.and_then(|i| self.fields.get_mut(i)) {
            None => {
                if let Some(index) = &mut self.index {
                    index.insert(key.clone(), self.fields.len());
                }
                self.fields.push((key, value));
                if self.index.is_none() && self.fields.len() > SCANNED_KEYS {
                    self.index = Some(self.fields.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect());
                }
                None
            }
            Some(_) if refuse_twice => Some(key),
            Some(slot) => {
                slot.1 = value;
                None
            }
        }
    }
}

/// The refusal of a top-level key given twice.
fn given_twice(key: &str) -> Invalid {
    let param = shown(key).to_owned();
    Invalid { status: 400, message: format!("{param}: given twice"), param }
}

/// Every field of the object `d` holds, in order, a key given twice kept
/// twice ([`Top::parse_keeping`](crate::request::Top::parse_keeping)).
pub(crate) fn all_fields<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(Cow<'de, str>, &'de RawValue)>, D::Error> {
    struct All;
    impl<'de> Visitor<'de> for All {
        type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut fields = Vec::with_capacity(8);
            while let Some(Key(key)) = access.next_key_seed(KeySeed)? {
                fields.push((key, access.next_value::<&'de RawValue>()?));
            }
            Ok(fields)
        }
    }
    d.deserialize_map(All)
}

/// A key, borrowed from the body unless it holds an escape.
struct Key<'a>(Cow<'a, str>);

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<'de>, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(v.to_owned())))
    }
}

/// The translated body, a JSON object written key by key.
pub(crate) struct Body {
    buf: Vec<u8>,
    /// Whether the object (or array) open innermost has no member yet.
    first: bool,
}

impl Body {
    /// An open object with room for `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity);
        buf.push(b'{');
        Self { buf, first: true }
    }

    /// Starts the member `key` (a key of ours: no escaping needed).
    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        self.comma();
        self.buf.push(b'"');
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.extend_from_slice(b"\":");
        self
    }

    fn comma(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.buf.push(b',');
        }
    }

    /// A string value.
    pub(crate) fn str(&mut self, s: &str) {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.buf, s);
    }

    /// An unsigned integer value.
    pub(crate) fn u64(&mut self, n: u64) {
        let _ = serde_json::to_writer(&mut self.buf, &n);
    }

    /// JSON text of ours, as it is.
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// A value as JSON text.
    pub(crate) fn value(&mut self, v: &Value) {
        let _ = serde_json::to_writer(&mut self.buf, v);
    }

    /// A JSON string as it was sent. One with a `\u` escape is read first:
    /// a lone surrogate there would be refused by a JSON tree, and is here.
    pub(crate) fn raw_string(&mut self, raw: &str) -> Result<(), Invalid> {
        if raw.contains("\\u") {
            let s: String = serde_json::from_str(raw).map_err(bad_part)?;
            self.str(&s);
        } else {
            self.buf.extend_from_slice(raw.as_bytes());
        }
        Ok(())
    }

    /// Opens an array value.
    pub(crate) fn open_array(&mut self) {
        self.buf.push(b'[');
        self.first = true;
    }

    /// Starts the next element of the array open.
    pub(crate) fn element(&mut self) -> &mut Self {
        self.comma();
        self
    }

    /// Closes the array open (a member or element follows it: not first).
    pub(crate) fn close_array(&mut self) {
        self.buf.push(b']');
        self.first = false;
    }

    /// Each member of `m`, in its order.
    pub(crate) fn members(&mut self, m: &Map<String, Value>) {
        for (k, v) in m {
            self.comma();
            self.str(k);
            self.buf.push(b':');
            self.value(v);
        }
    }

    /// The object closed, as bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}
