//! Runnable examples of [tollgate](https://docs.rs/tollgate), one program each:
//! `cargo run -p tollgate-examples --example quickstart`. See the README's table.
