//! Shared helpers for integration tests (`mod support;`).
#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod redis;
pub mod sentinel;

#[cfg(test)] // the crate's own tests (the bench's load test includes this module too)
/// The items of a structured-field list header (`RateLimit`, `RateLimit-Policy`), read
/// with a real parser: each string item with its integer parameters.
pub fn sf_params(value: &http::HeaderValue) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value.as_bytes()).parse().expect("a structured-field list");
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => (
                item.bare_item.as_string().expect("a string").as_str().to_owned(),
                item.params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().expect("an integer"))))
                    .collect(),
            ),
            sfv::ListEntry::InnerList(_) => panic!("an inner list"),
        })
        .collect()
}
