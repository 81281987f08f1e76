//! [`KeyBytes`], what [`Key::as_bytes`](super::Key::as_bytes) gives: the bytes a key holds,
//! or the decimal digits of one held as a number; and which text is such a number.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// The most digits a `u64` has (`u64::MAX` is 18446744073709551615).
const DIGITS: usize = 20;

/// The bytes of a [`Key`](super::Key), as [`Key::as_bytes`](super::Key::as_bytes) returns
/// them: derefs to `[u8]`.
///
/// A key made from a `u64` (or from its canonical decimal text) is held as the number, not
/// as text, so its digits are written here when asked for: `&*key.as_bytes()` borrows them
/// for as long as the `KeyBytes` lives, `key.as_bytes().to_vec()` keeps them.
#[derive(Clone)]
pub struct KeyBytes<'a>(Inner<'a>);

#[derive(Clone)]
enum Inner<'a> {
    Held(&'a [u8]),
    Digits(u8, [u8; DIGITS]),
}

impl<'a> KeyBytes<'a> {
    pub(super) fn held(bytes: &'a [u8]) -> Self {
        Self(Inner::Held(bytes))
    }

    pub(super) fn digits(n: u64) -> Self {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        let mut buf = [0; DIGITS];
        buf[..digits.len()].copy_from_slice(digits);
        #[allow(clippy::cast_possible_truncation)]
        Self(Inner::Digits(digits.len() as u8, buf))
    }
}

impl Deref for KeyBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Held(bytes) => bytes,
            Inner::Digits(len, buf) => &buf[..usize::from(*len)],
        }
    }
}

impl AsRef<[u8]> for KeyBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for KeyBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl Hash for KeyBytes<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl PartialEq for KeyBytes<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for KeyBytes<'_> {}

impl PartialEq<[u8]> for KeyBytes<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for KeyBytes<'_> {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for KeyBytes<'_> {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for KeyBytes<'_> {
    fn eq(&self, other: &&[u8; N]) -> bool {
        **self == other[..]
    }
}

/// The number `bytes` is the canonical decimal of: `0`, or 1 to 20 digits with no leading
/// zero, at most `u64::MAX`. Anything else (`00`, `042`, `+1`, `18446744073709551616`) is
/// text. A key that does not start with a digit is out at its first byte.
pub(super) fn canonical_u64(bytes: &[u8]) -> Option<u64> {
    let (&first, rest) = bytes.split_first()?;
    if !first.is_ascii_digit() || bytes.len() > DIGITS {
        return None;
    }
    if first == b'0' {
        return rest.is_empty().then_some(0);
    }
    let mut n = u64::from(first - b'0');
    for &b in rest {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}
