//! [`RuleName`]: a rule's name, interned, so that a check carries it as one pointer.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// A rule's name, interned for the life of the process: a copy is one pointer (no
/// reference count to touch on each request), and two names are equal when they are the
/// same pointer, which interning makes the same as the same text.
///
/// Each distinct name is kept once, forever: a process that makes rules under an unbounded
/// number of names (a name per tenant, say) keeps all of them. Give such a process one
/// rule and a key per tenant instead.
///
/// Making one ([`RuleName::new`], or `.into()` from a string) takes a process-wide lock:
/// make a name once, as a `Rule` does, and copy it into each [`Check`](crate::store::Check),
/// rather than making it again for every check.
#[derive(Clone, Copy)]
pub struct RuleName(&'static Interned);

struct Interned {
    text: Box<str>,
    /// The names interned before this one: a small number per name, dense, so that a
    /// store can keep a name's tables in an array (`MemoryStore`'s lanes).
    index: usize,
}

/// Every name interned so far, by text.
fn names() -> std::sync::MutexGuard<'static, HashMap<&'static str, &'static Interned>> {
    static NAMES: OnceLock<Mutex<HashMap<&'static str, &'static Interned>>> = OnceLock::new();
    NAMES.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RuleName {
    /// The name `name`, interned (a name seen before is found, not kept twice).
    #[must_use]
    pub fn new(name: &str) -> Self {
        let mut names = names();
        if let Some(&found) = names.get(name) {
            return Self(found);
        }
        let leaked: &'static Interned = Box::leak(Box::new(Interned { text: name.into(), index: names.len() }));
        names.insert(&leaked.text, leaked);
        Self(leaked)
    }

    /// The name `name` if some rule or check of this process has used it: a store asked
    /// about a name never used has no state under it, and nothing is interned for asking.
    #[must_use]
    pub fn existing(name: &str) -> Option<Self> {
        names().get(name).map(|&found| Self(found))
    }

    /// The name's text.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        &self.0.text
    }

    /// This name's place among the names of this process, from 0, dense (see
    /// `Interned::index`).
    pub(crate) fn index(self) -> usize {
        self.0.index
    }

    /// A number that identifies the name within this process (its address).
    pub(crate) fn id(self) -> usize {
        std::ptr::from_ref(self.0) as usize
    }
}

impl PartialEq for RuleName {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for RuleName {}

impl std::hash::Hash for RuleName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.id());
    }
}

impl std::ops::Deref for RuleName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for RuleName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for RuleName {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for RuleName {
    fn from(name: String) -> Self {
        Self::new(&name)
    }
}

impl From<&String> for RuleName {
    fn from(name: &String) -> Self {
        Self::new(name)
    }
}

impl From<std::sync::Arc<str>> for RuleName {
    fn from(name: std::sync::Arc<str>) -> Self {
        Self::new(&name)
    }
}

impl PartialEq<str> for RuleName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RuleName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<RuleName> for str {
    fn eq(&self, other: &RuleName) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<RuleName> for &str {
    fn eq(&self, other: &RuleName) -> bool {
        *self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_text_one_name_whichever_thread_makes_it() {
        let made: Vec<RuleName> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| RuleName::new("interned-race"))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(made.iter().all(|n| n.id() == made[0].id()), "one pointer for one text");
        assert_eq!(made[0], RuleName::from(String::from("interned-race")));
        assert_ne!(made[0], RuleName::new("interned-race2"));
        assert_eq!(&*made[0], "interned-race");
        assert!(made[0] == "interned-race");
        assert!("interned-race" == made[0]);
        assert!(*"interned-race" == made[0]);
        assert_eq!(RuleName::existing("interned-race"), Some(made[0]));
        assert_eq!(RuleName::existing("never-made-by-anyone"), None);
    }
}
