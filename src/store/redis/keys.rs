//! Redis key names: `<prefix>:{<key>}:<rule>:<algorithm tag>:v2`.
//!
//! The hash tag is the escaped client key alone, so every rule of one key lives in one
//! cluster slot. Key and rule are escaped (`%` → `%25`, `{` → `%7B`, `}` → `%7D`,
//! `:` → `%3A`), which makes the name injective in (rule, key) and keeps user bytes from
//! moving the hash tag. A hashed [`Key`] is written as `%H` and the lowercase hex of its
//! digest, the empty key as `%E`; neither can come out of escaping.

use crate::key::Key;
use crate::Algorithm;

/// The schema version at the end of every name: a new state layout gets a new name, never
/// a `WRONGTYPE`. One bump per release, shared by every change of that release: `v2`
/// holds the sliding log's run-length encoded members and running total.
const VERSION: &[u8] = b"v2";

/// Number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'{' => out.extend_from_slice(b"%7B"),
            b'}' => out.extend_from_slice(b"%7D"),
            b':' => out.extend_from_slice(b"%3A"),
            _ => out.push(b),
        }
    }
}

/// The hash tag of `key`: what sits between the braces, and all that decides the slot.
pub(crate) fn tag_into(out: &mut Vec<u8>, key: &Key) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = key.as_bytes();
    if key.is_hashed() {
        out.extend_from_slice(b"%H");
        for &b in bytes {
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 15)]);
        }
    } else if bytes.is_empty() {
        // `{}` would not be a hash tag: Redis would hash the whole name.
        out.extend_from_slice(b"%E");
    } else {
        escape_into(out, bytes);
    }
}

/// The Redis key holding the state of (`rule`, `key`) under `algorithm`.
pub(crate) fn name(prefix: &str, rule: &str, key: &Key, algorithm: Algorithm) -> Vec<u8> {
    let tag = algorithm.tag().as_bytes();
    let mut out = Vec::with_capacity(prefix.len() + key.as_bytes().len() * 2 + rule.len() + tag.len() + 12);
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(b":{");
    tag_into(&mut out, key);
    out.extend_from_slice(b"}:");
    escape_into(&mut out, rule.as_bytes());
    out.push(b':');
    out.extend_from_slice(tag);
    out.push(b':');
    out.extend_from_slice(VERSION);
    out
}

/// The cluster slot of `key`'s names (the slot of its hash tag).
pub(crate) fn key_slot(key: &Key) -> u16 {
    let mut tag = Vec::with_capacity(key.as_bytes().len() + 8);
    tag_into(&mut tag, key);
    crc16(&tag) % SLOTS
}

/// The cluster slot of any key name, by Redis's rule: the CRC16 of the hash tag (the
/// bytes between the first `{` and the first `}` after it, if not empty), else of the
/// whole name.
#[cfg_attr(not(test), allow(dead_code))]
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

/// CRC16-CCITT (XMODEM), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

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
        assert_eq!(got, b"tollgate:{1.2.3.4}:per-minute:swc:v2");
        let got = name("p", "a:b", &Key::from("x{y}:%"), Algorithm::FixedWindow);
        assert_eq!(got, b"p:{x%7By%7D%3A%25}:a%3Ab:fw:v2");
        assert_eq!(name("p", "r", &Key::from(""), Algorithm::Gcra), b"p:{%E}:r:gcra:v2");
        let long = Key::new(&[b'z'; 200]);
        let got = n("r", &long);
        assert!(got.starts_with(b"tollgate:{%H"), "{}", String::from_utf8_lossy(&got));
        assert_eq!(got.len(), "tollgate:{%H".len() + 64 + "}:r:gcra:v2".len());
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
        keys.push(Key::new(keys[24].as_bytes()));
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
                assert_eq!(slot(&name), key_slot(key));
                // And the same for every rule of this key.
                assert_eq!(slot(&name), slot(&n("other", key)));
            }
        }
        assert_eq!(seen.len(), rules.len() * keys.len());
    }
}
