//! Shared helpers for integration tests (`mod support;`).
#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod redis;
pub mod sentinel;

/// A handler that reports the `x-tokens` it "used" as a `tollgate::Charge` (none without
/// the header), and answers 200.
#[cfg(test)]
pub fn llm() -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = http::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(|req: http::Request<axum::body::Body>| async move {
        let mut res = http::Response::new(axum::body::Body::empty());
        if let Some(n) = req.headers().get("x-tokens").and_then(|v| v.to_str().ok()?.parse().ok()) {
            res.extensions_mut().insert(tollgate::Charge(n));
        }
        Ok(res)
    })
}

/// Ready on its second poll: it wakes its task first, as a future that yields.
pub struct YieldOnce(pub bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// The value of a Prometheus counter line `name{labels…} value` whose labels include all
/// of `labels` (summed over the lines that match).
#[cfg(test)]
pub fn counter(scrape: &str, name: &str, labels: &[&str]) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

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

/// Polls `f` once: a check the store batches is then in its queue, and the store's flush
/// task (spawned on this current-thread runtime) has not run yet.
#[cfg(test)]
pub async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
            std::task::Poll::Ready(r) => Some(r),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// A check's answer, boxed so that several can be held and polled in turn.
#[cfg(test)]
pub type Answer<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<tollgate::store::Outcome, tollgate::StoreError>> + Send + 'a>,
>;

/// `Store::check_one` of every check, queued together in this order ([`queued_together`]).
#[cfg(test)]
pub async fn together<S: tollgate::store::Store>(
    store: &S,
    checks: &[tollgate::store::Check],
) -> Vec<Result<tollgate::store::Outcome, tollgate::StoreError>> {
    queued_together(checks.iter().map(|c| Box::pin(store.check_one(c)) as Answer<'_>).collect()).await
}

/// Store calls queued together in this order (each polled once before any is awaited;
/// on a current-thread runtime, before the store's flush task runs), then awaited.
#[cfg(test)]
pub async fn queued_together<T>(
    mut futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + '_>>>,
) -> Vec<T> {
    let mut early = Vec::new();
    for f in &mut futures {
        early.push(poll_once(f).await);
    }
    let mut out = Vec::new();
    for (f, e) in futures.into_iter().zip(early) {
        out.push(match e {
            Some(r) => r,
            None => f.await,
        });
    }
    out
}
