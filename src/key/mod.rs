//! What is being limited: [`Key`], the [`KeyExtractor`] trait, and the built-in extractors
//! [`PeerIp`], [`TrustedProxyIp`], [`header`] and [`Global`]; [`KeyBytes`], a key's bytes.
//!
//! Any closure `Fn(&I) -> Option<K>` with `K: Into<Key>` is an extractor for inputs of
//! type `I`; for the HTTP layer `I` is [`RequestHead`](crate::RequestHead) (the request
//! without its body, whatever the stack). Annotate it, as Rust cannot infer it from the
//! layer: `|req: &tollgate::RequestHead| …`. A closure that returns
//! `None` says "do not limit this input by this rule". The built-in IP extractors never
//! return `None`: without connection info they warn once and limit under one shared
//! `"unknown"` key rather than silently stop limiting.

mod bytes;
mod peer;
mod proxy;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Request};
use sha2::{Digest, Sha256};

use self::bytes::canonical_u64;
pub use self::bytes::KeyBytes;
pub use self::peer::{PeerIp, PeerIpPrefix};
pub use self::proxy::{IpNet, ProxyHeader, TrustedProxyIp};

/// Keys longer than this many bytes are replaced by their SHA-256 digest.
pub const MAX_KEY_LEN: usize = 128;
const INLINE: usize = 46;
/// The longest key `MemoryStore`'s table holds inline.
pub(crate) const SHORT: usize = 22;

/// The identity a rule limits (an IP, an API key, an account id…): up to
/// [`MAX_KEY_LEN`] bytes; longer ones are replaced by their SHA-256 digest, so a client
/// cannot make the limiter store arbitrarily large keys, and a digest never equals a
/// short key.
///
/// A `u64` key is held as the number, and so is text that is its canonical decimal (`"0"`,
/// `"42"`, not `"042"`): `Key::from(42u64)` and `Key::from("42")` are one key, with the
/// same bytes, the same hash and the same name in every store.
#[derive(Clone)]
pub struct Key(Repr);

/// `Int` holds every key whose bytes are the canonical decimal of a `u64`, and no other
/// variant ever holds such bytes: equality and hashing rely on it.
#[derive(Clone)]
enum Repr {
    Inline(u8, [u8; INLINE]),
    Int(u64),
    Heap(Arc<[u8]>),
    Digest([u8; 32]),
}

impl Key {
    /// A key from bytes (hashed when longer than [`MAX_KEY_LEN`]).
    #[must_use]
    pub fn new(bytes: &[u8]) -> Self {
        if let Some(n) = canonical_u64(bytes) {
            Self(Repr::Int(n))
        } else if bytes.len() <= INLINE {
            Self::inline(bytes)
        } else if bytes.len() <= MAX_KEY_LEN {
            Self(Repr::Heap(Arc::from(bytes)))
        } else {
            Self(Repr::Digest(Sha256::digest(bytes).into()))
        }
    }

    /// A key from at most `INLINE` bytes that are not a number's canonical decimal.
    fn inline(bytes: &[u8]) -> Self {
        let mut buf = [0; INLINE];
        buf[..bytes.len()].copy_from_slice(bytes);
        #[allow(clippy::cast_possible_truncation)]
        Self(Repr::Inline(bytes.len() as u8, buf))
    }

    /// A key from anything `Display`, formatted without a heap allocation when it fits
    /// the inline buffer (IP addresses always do).
    #[must_use]
    pub fn display(value: impl fmt::Display) -> Self {
        struct Inline {
            buf: [u8; INLINE],
            len: usize,
            spill: Option<String>,
        }
        impl fmt::Write for Inline {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                if let Some(spill) = &mut self.spill {
                    spill.push_str(s);
                } else if self.len + s.len() <= INLINE {
                    self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
                    self.len += s.len();
                } else {
                    let mut spill = String::from_utf8_lossy(&self.buf[..self.len]).into_owned();
                    spill.push_str(s);
                    self.spill = Some(spill);
                }
                Ok(())
            }
        }
        let mut w = Inline { buf: [0; INLINE], len: 0, spill: None };
        let _ = fmt::write(&mut w, format_args!("{value}"));
        match w.spill {
            Some(s) => Self::new(s.as_bytes()),
            None => match canonical_u64(&w.buf[..w.len]) {
                Some(n) => Self(Repr::Int(n)),
                #[allow(clippy::cast_possible_truncation)]
                None => Self(Repr::Inline(w.len as u8, w.buf)),
            },
        }
    }

    /// The key's bytes (for a hashed key: the 32 bytes of its digest; for a number, its
    /// decimal digits, written on each call). `&*key.as_bytes()` is a `&[u8]`.
    #[must_use]
    pub fn as_bytes(&self) -> KeyBytes<'_> {
        match &self.0 {
            Repr::Inline(len, buf) => KeyBytes::held(&buf[..usize::from(*len)]),
            Repr::Int(n) => KeyBytes::digits(*n),
            Repr::Heap(b) => KeyBytes::held(b),
            Repr::Digest(d) => KeyBytes::held(d),
        }
    }

    /// The bytes the key holds, or `None` for a number (which [`Key::short`] always
    /// gives).
    pub(crate) fn held_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Inline(len, buf) => Some(&buf[..usize::from(*len)]),
            Repr::Int(_) => None,
            Repr::Heap(b) => Some(b),
            Repr::Digest(d) => Some(d),
        }
    }

    /// The number a key made from a `u64` (or from its canonical decimal) holds.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self.0 {
            Repr::Int(n) => Some(n),
            _ => None,
        }
    }

    /// A plain key of at most [`SHORT`] bytes (a number: its decimal digits) as its length
    /// then its bytes, zero-padded: how `MemoryStore`'s table holds it inline, compared as
    /// one fixed-size array.
    pub(crate) fn short(&self) -> Option<[u8; SHORT + 1]> {
        let mut short = [0; SHORT + 1];
        match &self.0 {
            Repr::Inline(len, buf) if usize::from(*len) <= SHORT => {
                short[0] = *len;
                short[1..].copy_from_slice(&buf[..SHORT]);
            }
            Repr::Int(n) => {
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(*n).as_bytes();
                #[allow(clippy::cast_possible_truncation)]
                let len = digits.len() as u8;
                short[0] = len;
                short[1..=digits.len()].copy_from_slice(digits);
            }
            _ => return None,
        }
        Some(short)
    }

    /// Whether the key was longer than [`MAX_KEY_LEN`] and is stored as its digest.
    #[must_use]
    pub fn is_hashed(&self) -> bool {
        matches!(self.0, Repr::Digest(_))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            // Zeros past `len`: the whole buffers compare, with no call to `memcmp`.
            (Repr::Inline(a, x), Repr::Inline(b, y)) => a == b && x == y,
            (Repr::Int(a), Repr::Int(b)) => a == b,
            // No other variant holds a number's canonical decimal.
            (Repr::Int(_), _) | (_, Repr::Int(_)) => false,
            _ => self.is_hashed() == other.is_hashed() && self.as_bytes() == other.as_bytes(),
        }
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if let Repr::Int(n) = self.0 {
            // As a number: no key of another variant equals it, and the blocked-key
            // cache's lookups write no digits.
            n.hash(state);
        } else {
            self.is_hashed().hash(state);
            self.as_bytes().hash(state);
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_hashed() {
            f.write_str("Key(sha256:")?;
            for b in &*self.as_bytes() {
                write!(f, "{b:02x}")?;
            }
            f.write_str(")")
        } else {
            write!(f, "Key({:?})", String::from_utf8_lossy(&self.as_bytes()))
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<String> for Key {
    fn from(s: String) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<&String> for Key {
    fn from(s: &String) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Self::new(b)
    }
}
impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        Self::new(&b)
    }
}
impl From<u64> for Key {
    /// The number, held as is; its bytes are its decimal digits, as `Display` writes them.
    fn from(n: u64) -> Self {
        Self(Repr::Int(n))
    }
}
impl From<IpAddr> for Key {
    /// The address as `Display` writes it.
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => {
                // `Display` through `fmt::write` cost more than the rest of an in-process
                // decision (about 285 instructions against 30).
                let mut buf = [0; INLINE];
                let mut len = 0;
                let mut digits = itoa::Buffer::new();
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        buf[len] = b'.';
                        len += 1;
                    }
                    let octet = digits.format(octet).as_bytes();
                    buf[len..len + octet.len()].copy_from_slice(octet);
                    len += octet.len();
                }
                Self::inline(&buf[..len])
            }
            IpAddr::V6(_) => Self::display(ip),
        }
    }
}

/// Turns an input (for the HTTP layer, a [`RequestHead`](crate::RequestHead)) into the [`Key`] a
/// rule limits, or `None` to skip the rule.
///
/// Implemented for closures `Fn(&I) -> Option<K>` where `K: Into<Key>`.
pub trait KeyExtractor<I: ?Sized>: Send + Sync + 'static {
    /// The key, or `None` when this rule does not apply to the input.
    fn extract(&self, input: &I) -> Option<Key>;
}

impl<F, I, K> KeyExtractor<I> for F
where
    I: ?Sized,
    F: Fn(&I) -> Option<K> + Send + Sync + 'static,
    K: Into<Key>,
{
    fn extract(&self, input: &I) -> Option<Key> {
        self(input).map(Into::into)
    }
}

/// One key for every input: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl<I: ?Sized> KeyExtractor<I> for Global {
    fn extract(&self, _input: &I) -> Option<Key> {
        Some(Key::from("global"))
    }
}

/// The value of a request header, e.g. `header("X-Api-Key")` (names are case-insensitive;
/// any `AsRef<str>`, so a name read from configuration works). A request without the
/// header (or with an empty value) is not limited by the rule. Any bytes are accepted;
/// long values are hashed.
///
/// # Panics
///
/// When `name` is not a valid header name (a space, a colon, non-ASCII…); use
/// [`try_header`] for names that come from configuration.
#[must_use]
pub fn header(name: impl AsRef<str>) -> Header {
    try_header(name).unwrap_or_else(|e| panic!("key::header: {e}"))
}

/// [`header`], with an error instead of a panic.
///
/// # Errors
///
/// [`BuildError::InvalidKey`](crate::error::BuildError::InvalidKey) when `name` is not a valid
/// header name.
pub fn try_header(name: impl AsRef<str>) -> Result<Header, crate::error::BuildError> {
    let name = name.as_ref();
    HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
        .map(Header)
        .map_err(|_| crate::error::BuildError::InvalidKey(format!("{name:?} is not a valid HTTP header name")))
}

/// See [`header`].
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl<B> KeyExtractor<Request<B>> for Header {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        header_key(req.headers(), &self.0)
    }
}

/// The key of header `name`: its bytes, or `None` when it is missing or empty.
pub(crate) fn header_key(headers: &HeaderMap, name: &HeaderName) -> Option<Key> {
    let v = headers.get(name)?.as_bytes();
    (!v.is_empty()).then(|| Key::new(v))
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::net::SocketAddr;

    use http::Request;

    use super::KeyExtractor;

    pub(crate) fn req_from(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    pub(crate) fn key_of<E: KeyExtractor<Request<()>>>(e: &E, req: &Request<()>) -> String {
        String::from_utf8(e.extract(req).unwrap().as_bytes().to_vec()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{key_of, req_from};
    use super::*;

    /// Numbers and IPv4 addresses are written as `Display` writes them, whatever the
    /// digits (the fast paths must not make another key of the same client).
    #[test]
    fn numbers_and_addresses_are_their_display() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut numbers = vec![0, 1, 9, 10, 99, 100, 255, u64::MAX, u64::MAX - 1, 10_u64.pow(19)];
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            numbers.push(x >> (x % 64));
        }
        for n in numbers {
            assert_eq!(Key::from(n), Key::display(n), "{n}");
            #[allow(clippy::cast_possible_truncation)]
            let ip = IpAddr::from((n as u32).to_be_bytes());
            assert_eq!(Key::from(ip), Key::display(ip), "{ip}");
        }
        for ip in ["0.0.0.0", "255.255.255.255", "10.0.0.1", "192.168.100.7", "::1", "2001:db8::ff00:42:8329"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(Key::from(ip).as_bytes(), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn long_keys_are_hashed_and_never_equal_short_ones() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let k = Key::from(long.as_str());
        assert!(k.is_hashed());
        assert_eq!(k.as_bytes().len(), 32);
        assert_eq!(k, Key::from(long.clone()));
        assert_ne!(k, Key::from("k".repeat(MAX_KEY_LEN + 2)));
        // A short key holding the digest's bytes is still a different key.
        assert_ne!(k, Key::new(&k.as_bytes()));
        let exact = Key::from("x".repeat(MAX_KEY_LEN));
        assert!(!exact.is_hashed());
        assert_eq!(exact.as_bytes().len(), MAX_KEY_LEN);
        assert_eq!(Key::from("abc").as_bytes(), b"abc");
        assert_eq!(Key::display(42u64), Key::from("42"));
        let long = "y".repeat(INLINE + 10);
        assert_eq!(Key::display(&long), Key::from(long.as_str()));
        assert_eq!(Key::display("z".repeat(MAX_KEY_LEN + 1)), Key::from("z".repeat(MAX_KEY_LEN + 1)));
    }

    fn hash_of(key: &Key) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    }

    /// The key of `text` as it was before numbers were held as numbers: its bytes inline.
    fn as_text(text: &str) -> Key {
        Key::inline(text.as_bytes())
    }

    #[test]
    fn a_number_and_its_canonical_decimal_are_one_key() {
        for n in [0, 1, 42, u64::MAX] {
            let text = n.to_string();
            let int = Key::from(n);
            assert_eq!(int.as_u64(), Some(n));
            let same = [
                Key::from(text.as_str()),
                Key::from(text.clone()),
                Key::from(&text),
                Key::from(text.as_bytes()),
                Key::from(text.as_bytes().to_vec()),
                Key::new(text.as_bytes()),
                Key::display(n),
                Key::display(&text),
            ];
            for key in same {
                assert_eq!(key.as_u64(), Some(n), "{text} is held as a number");
                assert_eq!(key, int, "{text}");
                assert_eq!(hash_of(&key), hash_of(&int), "{text}");
            }
            assert_eq!(format!("{int:?}"), format!("Key({text:?})"));
            assert_eq!(int.as_bytes(), text.as_bytes());
            assert_eq!(&*int.as_bytes(), text.as_bytes());
            assert!(!int.is_hashed());
            // MemoryStore's table sees the digits it saw when they were held as text.
            assert_eq!(int.short(), as_text(&text).short(), "{text}");
            assert!(int.short().is_some());
        }
    }

    #[test]
    fn other_text_of_digits_stays_text() {
        let numbers = [0, 1, 42, u64::MAX, 1_844_674_407_370_955_161].map(Key::from);
        for text in
            ["00", "042", "-1", "+1", " 1", "1 ", "18446744073709551616", "99999999999999999999", "1a", "4.2", ""]
        {
            let key = Key::from(text);
            assert_eq!(key.as_u64(), None, "{text:?}");
            assert_eq!(key.as_bytes(), text.as_bytes());
            assert_eq!(format!("{key:?}"), format!("Key({text:?})"));
            assert_eq!(key, as_text(text));
            assert_eq!(hash_of(&key), hash_of(&as_text(text)));
            assert_eq!(key, Key::display(text));
            for n in &numbers {
                assert_ne!(&key, n, "{text:?}");
            }
        }
    }

    #[test]
    fn a_key_is_no_larger_than_before_numbers() {
        // 46 bytes inline, their length and the variant's tag.
        assert_eq!(std::mem::size_of::<Key>(), 48);
    }

    proptest::proptest! {
        #[test]
        fn a_number_is_its_decimal(n: u64) {
            let digits = n.to_string();
            let (int, text) = (Key::from(n), Key::from(digits.as_str()));
            proptest::prop_assert_eq!(&int, &text);
            proptest::prop_assert_eq!(hash_of(&int), hash_of(&text));
            proptest::prop_assert_eq!(int.as_bytes(), digits.as_bytes());
            proptest::prop_assert_eq!(int.short(), as_text(&digits).short());
        }

        #[test]
        fn text_keeps_its_bytes(s in "[0-9]{0,21}|0[0-9]{0,3}|[+-]?[0-9]{1,5}|[ -~]{0,46}|\\PC{0,11}") {
            let key = Key::from(s.as_str());
            proptest::prop_assert_eq!(key.as_bytes(), s.as_bytes());
            // A number exactly when `s` is what the number displays as.
            let number = s.parse::<u64>().ok().filter(|n| n.to_string() == s);
            proptest::prop_assert_eq!(key.as_u64(), number);
            proptest::prop_assert_eq!(&key, &Key::display(&s));
        }

        #[test]
        fn bytes_keep_their_bytes(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=INLINE)) {
            let key = Key::new(&b);
            proptest::prop_assert_eq!(key.as_bytes(), &b[..]);
        }
    }

    #[test]
    fn header_names_are_case_insensitive_and_checked() {
        let err = try_header("x api key").unwrap_err();
        assert_eq!(err.to_string(), "invalid key: \"x api key\" is not a valid HTTP header name");
        assert!(std::panic::catch_unwind(|| header("bad:name")).is_err());
        let from_config = String::from("X-Api-Key");
        let e = header(&from_config);
        assert_eq!(key_of(&e, &req_from("1.1.1.1:1", &[("x-api-key", "abc")])), "abc");
        assert!(e.extract(&req_from("1.1.1.1:1", &[])).is_none());
        assert!(e.extract(&req_from("1.1.1.1:1", &[("x-api-key", "")])).is_none());
        let mut req = Request::new(());
        req.headers_mut().insert("x-api-key", http::HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(e.extract(&req).unwrap().as_bytes(), b"\xff\xfe");
    }
}
