//! [`RequestHead`]: what an HTTP layer's rules see of a request.

/// What the rules of an HTTP layer see of a request: its head (method, URI, version,
/// headers, extensions) without the body, whatever the body type, so that neither rules
/// nor layers carry it. Key extractors and closures take `&RequestHead`
/// (`req.headers()`, `req.extensions()`, as on any `http::Request`).
pub type RequestHead = http::Request<()>;
