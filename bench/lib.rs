//! Measurements of [tollgate](https://docs.rs/tollgate): `cargo run --release -p tollgate-bench --example …`
//! and `cargo bench -p tollgate-bench`. See `docs/performance.md`.
