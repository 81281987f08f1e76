//! [`Charge`]: units a handler reports after the work, for rules that count them
//! ([`Rule::charged`](crate::Rule::charged)).

/// Units the work of a request used, known only once it is done (LLM tokens, bytes sent,
/// rows scanned): a handler puts it into its response's extensions, and the layer takes
/// that many units from every [`charged`](crate::Rule::charged) rule of the request, after
/// the response. Each rule's units go to whoever decided that rule: an in-process limiter
/// (`MemoryStore`, or the fallback limiter while the store fails) takes them at once,
/// before the next request is decided (an in-process store whose charge is not ready at
/// once finishes it in a task, untimed; with no tokio runtime it is polled again while it
/// wakes itself, and otherwise counted as failed); a remote store in a detached call under
/// the deadline. A failed charge is logged and counted in `tollgate_charge_failures_total{rule}`,
/// never the request's problem.
///
/// A charged rule takes nothing when a request arrives: it admits the request while the
/// key is within its quota, and refuses it (429, `Retry-After` until then) while charges
/// have put the key in debt. A response without a `Charge` takes nothing from it.
///
/// ```
/// use axum::response::IntoResponse;
///
/// async fn complete() -> axum::response::Response {
///     let tokens_used = 1_250; // what the model reported
///     let mut res = "…the completion…".into_response();
///     res.extensions_mut().insert(tollgate::Charge(tokens_used));
///     res
/// }
/// # let _ = complete;
/// ```
///
/// Outside HTTP, [`Limiter::charge`](crate::Limiter::charge) does the same for a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge(pub u64);
