//! No key twice in one JSON object. The grammar already keeps a listed
//! property from repeating (a permutation takes each member once) and keeps
//! other keys from being a listed name; what it cannot say is that two
//! *other* keys differ, since that depends on what was written. This
//! follows the value's bytes, keeps the keys of each open object (decoded,
//! so `"\u0061"` and `"a"` are one key), and takes out of a mask every
//! token that would close a key the object already has.
//!
//! Only tokens holding a `"` can close a key, so a mask costs one short
//! simulation per such token, and only while an open object has a key.
//! A key may also be begun that only a repeat could finish (keys by a
//! pattern with few texts, such as `^[a-z]$`): a token after which the key
//! written so far begins one of the object's keys is kept only if the
//! constraint lets the key go on to a new one ([`super::Matcher`] searches
//! along the object's keys, a byte at a time). Keys are compared as written
//! there; a key spelt with escapes is caught when it closes.

use super::vocab::Vocab;
use super::TokenMask;

/// Where the scanner is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Frame {
    /// An object: its keys so far (decoded, and as written between the
    /// quotes), and whether the next string is a key.
    Object { keys: Vec<(String, Vec<u8>)>, key_next: bool },
    /// An array.
    Array,
}

/// A string being read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Str {
    /// Its raw bytes with the opening quote, when it is a key.
    key: Option<Vec<u8>>,
    escaped: bool,
}

/// The structure of the JSON text fed so far (valid JSON by the grammar).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyScan {
    stack: Vec<Frame>,
    string: Option<Str>,
}

/// A key that its object already has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeated(pub String);

impl KeyScan {
    /// The scan of `text` from its start; `Err` at the first repeated key.
    pub fn of(text: &[u8]) -> Result<KeyScan, Repeated> {
        let mut s = KeyScan::default();
        s.feed(text)?;
        Ok(s)
    }

    /// Reads `bytes`; `Err` when they close a key the object already has.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), Repeated> {
        bytes.iter().try_for_each(|&b| self.step(b))
    }

    fn step(&mut self, b: u8) -> Result<(), Repeated> {
        if let Some(s) = &mut self.string {
            if let Some(raw) = &mut s.key {
                raw.push(b);
            }
            if s.escaped {
                s.escaped = false;
            } else if b == b'\\' {
                s.escaped = true;
            } else if b == b'"' {
                let s = self.string.take().expect("in a string");
                if let Some(raw) = s.key {
                    return self.close_key(&raw);
                }
            }
            return Ok(());
        }
        match b {
            b'{' => self.stack.push(Frame::Object { keys: Vec::new(), key_next: true }),
            b'[' => self.stack.push(Frame::Array),
            b'}' | b']' => {
                self.stack.pop();
            }
            b',' => {
                if let Some(Frame::Object { key_next, .. }) = self.stack.last_mut() {
                    *key_next = true;
                }
            }
            b'"' => {
                let key = matches!(self.stack.last(), Some(Frame::Object { key_next: true, .. }));
                self.string = Some(Str { key: key.then(|| vec![b'"']), escaped: false });
            }
            _ => {}
        }
        Ok(())
    }

    fn close_key(&mut self, raw: &[u8]) -> Result<(), Repeated> {
        // The grammar wrote a JSON string: decoding cannot fail, but a
        // key that does not decode is compared as written.
        let key = serde_json::from_slice::<String>(raw).unwrap_or_else(|_| String::from_utf8_lossy(raw).into_owned());
        let Some(Frame::Object { keys, key_next }) = self.stack.last_mut() else { return Ok(()) };
        *key_next = false;
        if keys.iter().any(|(k, _)| *k == key) {
            return Err(Repeated(key));
        }
        keys.push((key, raw[1..raw.len() - 1].to_vec()));
        Ok(())
    }

    /// While a key is being written: its bytes so far, and the keys of its
    /// object as written.
    pub fn key_in_progress(&self) -> Option<(&[u8], Vec<&[u8]>)> {
        let raw = self.string.as_ref()?.key.as_deref()?;
        let Some(Frame::Object { keys, .. }) = self.stack.last() else { return None };
        Some((&raw[1..], keys.iter().map(|(_, r)| r.as_slice()).collect()))
    }

    /// True when some open object has a key (only then can one repeat).
    pub fn has_keys(&self) -> bool {
        self.stack.iter().any(|f| matches!(f, Frame::Object { keys, .. } if !keys.is_empty()))
    }

    /// Sorts the allowed tokens of `mask` that could repeat a key: those
    /// that would close one are taken out; those after which the key being
    /// written begins one of its object's keys are returned with that
    /// prefix and those keys, for a search of the constraint.
    pub fn screen(&self, vocab: &Vocab, mask: &mut TokenMask) -> Vec<(u32, Vec<u8>, Vec<Vec<u8>>)> {
        let mut doubtful = Vec::new();
        if !self.has_keys() {
            return doubtful;
        }
        let begins_a_key = |prefix: &[u8], keys: &[&[u8]]| keys.iter().any(|k| k.starts_with(prefix));
        for &t in vocab.tokens_with_quote() {
            if !mask.get(t) {
                continue;
            }
            let mut after = self.clone();
            if after.feed(vocab.bytes(t)).is_err() {
                mask.unset(t);
            } else if let Some((prefix, keys)) = after.key_in_progress().filter(|(p, k)| begins_a_key(p, k)) {
                doubtful.push((t, prefix.to_vec(), keys.iter().map(|k| k.to_vec()).collect()));
            }
        }
        // Inside a key, a token with no quote only lengthens it.
        if let Some((prefix, keys)) = self.key_in_progress() {
            let begun: Vec<&[u8]> = keys.iter().filter(|k| k.starts_with(prefix)).map(|k| &k[prefix.len()..]).collect();
            for t in mask.ones().filter(|&t| (t as usize) < vocab.len()) {
                let b = vocab.bytes(t);
                if !b.contains(&b'"') && begun.iter().any(|rest| rest.starts_with(b)) {
                    doubtful.push((t, [prefix, b].concat(), keys.iter().map(|k| k.to_vec()).collect()));
                }
            }
        }
        doubtful
    }
}

#[cfg(test)]
mod tests {
    use super::{KeyScan, Repeated};

    #[test]
    fn keys_repeat_only_within_one_object() {
        assert!(KeyScan::of(br#"{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}"#).is_ok());
        assert_eq!(KeyScan::of(br#"{"a":1,"b":2,"a""#), Err(Repeated("a".into())));
        // Decoded: an escape spells the same key.
        assert_eq!(KeyScan::of(br#"{"ab":1,"a\u0062""#), Err(Repeated("ab".into())));
        // String values, escaped quotes and braces inside strings are not keys.
        assert!(KeyScan::of(br#"{"a":"a","b":"x\"}{\"a\":","c":["a","a"]}"#).is_ok());
        let open = KeyScan::of(br#"{"x":{"k":1},"y":{"#).unwrap();
        assert!(open.has_keys());
        let (prefix, keys) = KeyScan::of(br#"{"ab":1,"a"#).unwrap().key_in_progress().map(|(p, k)| (p.to_vec(), k.len())).unwrap();
        assert_eq!((prefix.as_slice(), keys), (&b"a"[..], 1));
        assert!(open.clone().feed(br#""k":1,"k""#).is_err());
        assert!(open.clone().feed(br#""j":1},"x""#).is_err(), "back in the outer object, x is taken");
    }
}
