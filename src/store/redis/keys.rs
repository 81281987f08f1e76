//! Redis key names: `<prefix>:{<key>}:<rule>:<algorithm tag>:v6`.
//!
//! The hash tag is the escaped client key alone, so every rule of one key lives in one
//! cluster slot. Key and rule are escaped (`%` → `%25`, `{` → `%7B`, `}` → `%7D`,
//! `:` → `%3A`), which makes the name injective in (rule, key) and keeps user bytes from
//! moving the hash tag. A hashed [`Key`] is written as `%H` and the lowercase hex of its
//! digest, the empty key as `%E`; neither can come out of escaping. With
//! `RedisStore::hash_keys`, the tag is `%K` and a keyed hash of the key instead.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::algorithm::Algorithm;
use crate::key::Key;

/// The schema version at the end of every name: a new state layout gets a new name, never
/// a `WRONGTYPE`. `v2`: the sliding log's run-length encoded members and running total;
/// `v4`: the window algorithms' states say when they were first written (a refund of a
/// commit from before a reset gives nothing back); `v3`: GCRA's latest commit, blocks
/// (`Rule::block_for`), hashed names; `v5`: GCRA's state is its TAT alone (a refund is all
/// or nothing) and the token bucket's is its GCRA twin's, a TAT (issue 40); `v6`: GCRA's
/// and the token bucket's states are packed doubles, not decimal text (issue 41).
const VERSION: &[u8] = b"v6";

pub(crate) const SLOTS: u16 = 16384;

/// Where the bytes of a name go: the name being built, or the CRC16 of a slot being
/// computed (no name, no allocation).
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// CRC16-CCITT (XMODEM), as Redis Cluster uses, over the bytes put.
struct Crc16(u16);

impl Sink for Crc16 {
    fn put(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u16::from(b) << 8;
            for _ in 0..8 {
                self.0 = if self.0 & 0x8000 != 0 { (self.0 << 1) ^ 0x1021 } else { self.0 << 1 };
            }
        }
    }
}

fn escape_into(out: &mut impl Sink, bytes: &[u8]) {
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'%' => b"%25",
            b'{' => b"%7B",
            b'}' => b"%7D",
            b':' => b"%3A",
            _ => continue,
        };
        out.put(&bytes[plain..i]);
        out.put(escaped);
        plain = i + 1;
    }
    out.put(&bytes[plain..]);
}

fn hex_into(out: &mut impl Sink, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.put(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
}

/// The hash tag of `key`: what sits between the braces, and all that decides the slot.
fn tag_into(out: &mut impl Sink, key: &Key) {
    let bytes = key.as_bytes();
    if key.is_hashed() {
        out.put(b"%H");
        hex_into(out, &bytes);
    } else if bytes.is_empty() {
        // `{}` would not be a hash tag: Redis would hash the whole name.
        out.put(b"%E");
    } else {
        escape_into(out, &bytes);
    }
}

/// How a store names its keys: the prefix, and whether client keys appear escaped or as a
/// keyed hash (`RedisStore::hash_keys`).
#[derive(Clone)]
pub(crate) struct Names {
    pub(crate) prefix: Arc<str>,
    secret: Option<Arc<Hmac<Sha256>>>,
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Names").field("prefix", &self.prefix).field("hashed_keys", &self.secret.is_some()).finish()
    }
}

impl Names {
    pub(crate) fn new(prefix: Arc<str>) -> Self {
        Self { prefix, secret: None }
    }

    pub(crate) fn hashed(self, secret: &[u8]) -> Self {
        let mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
        Self { secret: Some(Arc::new(mac)), ..self }
    }

    pub(crate) fn hashes_keys(&self) -> bool {
        self.secret.is_some()
    }

    /// The hash tag of `key`: escaped, or `%K` and the keyed hash's first 16 bytes in hex
    /// (`%` cannot come out of escaping, so the two never meet).
    fn tag_into(&self, out: &mut impl Sink, key: &Key) {
        let Some(mac) = &self.secret else { return tag_into(out, key) };
        // A domain byte: a digest (a long key, hashed) never hashes like a clear key with
        // the same bytes.
        let digest =
            (**mac).clone().chain_update([u8::from(key.is_hashed())]).chain_update(&*key.as_bytes()).finalize();
        out.put(b"%K");
        hex_into(out, &digest.into_bytes()[..16]);
    }

    /// The Redis key holding the state of (`rule`, `key`) under `algorithm`.
    pub(crate) fn name(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Vec<u8> {
        self.name_of(rule, key, algorithm.tag().as_bytes())
    }

    /// The Redis key holding the block of (`rule`, `key`) (`Rule::block_for`): beside
    /// the rule's state, in the same slot, under the tag `block` (no algorithm's tag).
    pub(crate) fn block_name(&self, rule: &str, key: &Key) -> Vec<u8> {
        self.name_of(rule, key, b"block")
    }

    fn name_of(&self, rule: &str, key: &Key, kind: &[u8]) -> Vec<u8> {
        let prefix = self.prefix.as_bytes();
        let mut out = Vec::with_capacity(prefix.len() + key.as_bytes().len() * 2 + rule.len() + kind.len() + 40);
        out.put(prefix);
        out.put(b":{");
        self.tag_into(&mut out, key);
        out.put(b"}:");
        escape_into(&mut out, rule.as_bytes());
        out.put(b":");
        out.put(kind);
        out.put(b":");
        out.put(VERSION);
        out
    }

    /// The cluster slot of `key`'s names (the slot of its hash tag), computed as the tag's
    /// bytes come, without building it.
    pub(crate) fn slot(&self, key: &Key) -> u16 {
        let mut crc = Crc16(0);
        self.tag_into(&mut crc, key);
        crc.0 % SLOTS
    }
}

/// The cluster slot of any key name, by Redis's rule: the CRC16 of the hash tag (the
/// bytes between the first `{` and the first `}` after it, if not empty), else of the
/// whole name.
pub(crate) fn slot(name: &[u8]) -> u16 {
    let hashed = name
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(name);
    crc16(hashed) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = Crc16(0);
    crc.put(bytes);
    crc.0
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn name(prefix: &str, rule: &str, key: &Key, algorithm: Algorithm) -> Vec<u8> {
        Names::new(prefix.into()).name(rule, key, algorithm)
    }

    fn n(rule: &str, key: &Key) -> Vec<u8> {
        name("tollgate", rule, key, Algorithm::Gcra)
    }

    #[test]
    fn crc16_matches_redis() {
        // The reference value of the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // Slots as `CLUSTER KEYSLOT` reports them.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), crc16(b"{bar") % SLOTS);
    }

    #[test]
    fn layout() {
        let got = name("tollgate", "per-minute", &Key::from("1.2.3.4"), Algorithm::SlidingWindowCounter);
        assert_eq!(got, b"tollgate:{1.2.3.4}:per-minute:swc:v6");
        let got = name("p", "a:b", &Key::from("x{y}:%"), Algorithm::FixedWindow);
        assert_eq!(got, b"p:{x%7By%7D%3A%25}:a%3Ab:fw:v6");
        assert_eq!(name("p", "r", &Key::from(""), Algorithm::Gcra), b"p:{%E}:r:gcra:v6");
        let long = Key::new(&[b'z'; 200]);
        let got = n("r", &long);
        assert!(got.starts_with(b"tollgate:{%H"), "{}", String::from_utf8_lossy(&got));
        assert_eq!(got.len(), "tollgate:{%H".len() + 64 + "}:r:gcra:v6".len());
    }

    /// A key held as a number is named by its digits, as when it was held as text.
    #[test]
    fn a_number_is_named_by_its_digits() {
        for (number, text) in [(0, "0"), (42, "42"), (u64::MAX, "18446744073709551615")] {
            let want = format!("tollgate:{{{text}}}:r:gcra:v6").into_bytes();
            assert_eq!(n("r", &Key::from(number)), want);
            assert_eq!(n("r", &Key::from(text)), want);
            assert_eq!(Names::new("tollgate".into()).slot(&Key::from(number)), slot(&want));
            // Hashed names: the keyed hash of the digits.
            let names = Names::new("tollgate".into()).hashed(b"s");
            let mac = Hmac::<Sha256>::new_from_slice(b"s").unwrap().chain_update([0]).chain_update(text).finalize();
            let mut want = b"tollgate:{%K".to_vec();
            hex_into(&mut want, &mac.into_bytes()[..16]);
            want.extend_from_slice(b"}:r:gcra:v6");
            assert_eq!(names.name("r", &Key::from(number), Algorithm::Gcra), want);
            assert_eq!(names.slot(&Key::from(number)), slot(&want));
        }
        // Not a number: text, named as before.
        assert_eq!(n("r", &Key::from("042")), b"tollgate:{042}:r:gcra:v6");
        assert_ne!(n("r", &Key::from("042")), n("r", &Key::from(42u64)));
    }

    #[test]
    fn names_are_injective_and_slots_follow_the_key_alone() {
        let weird: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"a".to_vec(),
            b"a{b}c".to_vec(),
            b"a%7Bb%7Dc".to_vec(),
            b"a%257Bb".to_vec(),
            b"{".to_vec(),
            b"}".to_vec(),
            b"{}".to_vec(),
            b"}{".to_vec(),
            b":".to_vec(),
            b"a:b".to_vec(),
            b"a%3Ab".to_vec(),
            b"%".to_vec(),
            b"%25".to_vec(),
            b"%E".to_vec(),
            b"%H".to_vec(),
            b"\0".to_vec(),
            b"a\0b".to_vec(),
            vec![0xff, 0xfe, b'{', 0x80],
            b"}:r:gcra:v1".to_vec(),
            b"x}:y".to_vec(),
            [b'%'; 46].to_vec(),
            [b'{'; 128].to_vec(),
            [b'{'; 129].to_vec(),
            vec![7u8; 10 * 1024],
            vec![8u8; 10 * 1024],
        ];
        let mut keys: Vec<Key> = weird.iter().map(|b| Key::new(b)).collect();
        // A short key holding exactly the bytes of a long key's digest stays distinct.
        keys.push(Key::new(&keys[24].as_bytes()));
        let rules = ["r", "a:b", "a%3Ab", "{", "}", "%", "", "x}:{y", "r:gcra"];
        let mut seen: HashMap<Vec<u8>, (String, Key)> = HashMap::new();
        for rule in rules {
            for key in &keys {
                let name = n(rule, key);
                if let Some(other) = seen.insert(name.clone(), (rule.to_owned(), key.clone())) {
                    panic!("{rule:?}/{key:?} and {other:?} both map to {:?}", String::from_utf8_lossy(&name));
                }
                // The slot is the slot of the escaped key alone, whatever the rule.
                let mut tag = Vec::new();
                tag_into(&mut tag, key);
                assert!(!tag.is_empty() && !tag.contains(&b'{') && !tag.contains(&b'}'));
                assert_eq!(slot(&name), crc16(&tag) % SLOTS, "{rule:?}/{key:?}");
                assert_eq!(slot(&name), Names::new("tollgate".into()).slot(key));
                // And the same for every rule of this key.
                assert_eq!(slot(&name), slot(&n("other", key)));
            }
        }
        assert_eq!(seen.len(), rules.len() * keys.len());
    }

    #[test]
    fn hashed_keys_hide_the_key_keep_the_slot_rule_and_stay_injective() {
        let names = Names::new("tollgate".into()).hashed(b"a secret of the application");
        let key = Key::from("sk_live_4f8a");
        let got = names.name("api", &key, Algorithm::Gcra);
        let shown = String::from_utf8(got.clone()).unwrap();
        assert!(!shown.contains("sk_live"), "{shown}");
        assert!(shown.starts_with("tollgate:{%K") && shown.ends_with("}:api:gcra:v6"), "{shown}");
        assert_eq!(shown.len(), "tollgate:{%K".len() + 32 + "}:api:gcra:v6".len());
        // One key's rules share a slot, which is that of its hashed tag.
        assert_eq!(slot(&got), slot(&names.name("per-day", &key, Algorithm::FixedWindow)));
        assert_eq!(slot(&got), names.slot(&key));
        // Deterministic for one secret; another secret, other names; never the clear name.
        assert_eq!(
            got,
            Names::new("tollgate".into()).hashed(b"a secret of the application").name("api", &key, Algorithm::Gcra)
        );
        assert_ne!(got, Names::new("tollgate".into()).hashed(b"another secret").name("api", &key, Algorithm::Gcra));
        assert_ne!(got, name("tollgate", "api", &key, Algorithm::Gcra));
        // A long key (stored as its digest) and a short key with the digest's bytes differ.
        let long = Key::new(&[b'z'; 200]);
        let imitation = Key::new(&long.as_bytes());
        assert_ne!(names.name("r", &long, Algorithm::Gcra), names.name("r", &imitation, Algorithm::Gcra));
        // The secret never shows.
        assert!(!format!("{names:?}").contains("secret"), "{names:?}");
    }
}
