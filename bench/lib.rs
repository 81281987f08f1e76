//! Measurements of [tollgate](https://docs.rs/tollgate): `cargo run --release -p tollgate-bench --example …`
//! and `cargo bench -p tollgate-bench`. See `docs/performance.md`.

/// What `http_bench` and the `layer` bench serve: an axum "hello" route, and the in-process
/// peer, tower_governor, keyed by the same header as the layer.
pub mod http {
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use tollgate::Quota;
    use tower_governor::governor::GovernorConfigBuilder;
    use tower_governor::key_extractor::KeyExtractor;
    use tower_governor::{GovernorError, GovernorLayer};

    /// The server: one route answering "hello".
    pub fn hello() -> Router {
        Router::new().route("/", get(|| async { "hello" }))
    }

    /// tower_governor's key: the `x-api-key` header, as the layer's `key::header`.
    #[derive(Debug, Clone, Copy)]
    pub struct ApiKey;

    impl KeyExtractor for ApiKey {
        type Key = String;

        fn extract<T>(&self, req: &http::Request<T>) -> Result<String, GovernorError> {
            req.headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or(GovernorError::UnableToExtractKey)
        }
    }

    /// tower_governor at `quota`: one unit replenished every period / limit, a burst of
    /// the limit (governor's GCRA, as the layer's default quota means), with its
    /// rate-limit headers on (`use_headers`) as the layer has.
    ///
    /// # Errors
    ///
    /// A quota tower_governor cannot express.
    pub fn tower_governor(
        quota: Quota,
    ) -> Result<GovernorLayer<ApiKey, governor::middleware::StateInformationMiddleware, Body>, Box<dyn std::error::Error>>
    {
        let interval = u64::try_from(quota.period().as_nanos() / u128::from(quota.limit()))?;
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(interval)
            .burst_size(u32::try_from(quota.burst_size())?)
            .key_extractor(ApiKey)
            .use_headers()
            .finish()
            .ok_or("tower_governor refused the quota")?;
        Ok(GovernorLayer::new(config))
    }
}
