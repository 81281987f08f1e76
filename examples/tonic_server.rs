//! A gRPC service (tonic) behind `RateLimitLayer`, limited per API key (the `x-api-key`
//! metadata) and per client address.
//!
//! ```text
//! cargo run -p tollgate-examples --features tonic --example tonic_server            # serve on 127.0.0.1:50051
//! cargo run -p tollgate-examples --features tonic --example tonic_server -- demo    # serve, call itself until limited, exit
//! grpcurl -plaintext -H 'x-api-key: demo' -d '{"name":"you"}' 127.0.0.1:50051 hello.Greeter/SayHello
//! ```
//!
//! An over-limit call fails with `RESOURCE_EXHAUSTED`; its metadata carries
//! `grpc-retry-pushback-ms` (the gRPC retry pushback, which gRPC clients with a retry
//! policy honour), `retry-after` in seconds, and the `x-ratelimit-*` headers naming the
//! rule. The handler is never called for it.
//!
//! The service, in proto form:
//!
//! ```proto
//! syntax = "proto3";
//! package hello;
//! service Greeter { rpc SayHello (HelloRequest) returns (HelloReply); }
//! message HelloRequest { string name = 1; }
//! message HelloReply { string message = 1; }
//! ```
//!
//! A real project generates the `hello` module below from that file with
//! `tonic-prost-build` in its `build.rs`. This example writes the same few items by hand
//! (prost's derive for the messages, tonic's `server::Grpc` and `client::Grpc` for the
//! method), so it builds without `protoc` and without a build script in this library.
//! The rate limiting does not care: it is a tower layer in front of whatever server tonic
//! routes to.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::store::Store;
use tollgate::{key, Algorithm, MemoryStore, Quota, RateLimitLayer};

/// What `tonic-prost-build` would generate from `hello.proto`, written by hand.
pub mod hello {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tonic::body::Body;
    use tonic::transport::Channel;
    use tonic::{IntoRequest, Status};
    use tonic_prost::ProstCodec;

    /// `message HelloRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloRequest {
        /// Who to greet.
        #[prost(string, tag = "1")]
        pub name: String,
    }

    /// `message HelloReply`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloReply {
        /// The greeting.
        #[prost(string, tag = "1")]
        pub message: String,
    }

    /// The method's path: `/<package>.<Service>/<Method>`.
    pub const SAY_HELLO: &str = "/hello.Greeter/SayHello";

    /// The server: routes `SayHello` to [`say_hello`]. tonic serves any
    /// `Service<tollgate::http::Request<Body>>` that is also a `NamedService`.
    #[derive(Debug, Clone, Default)]
    pub struct GreeterServer;

    impl tonic::server::NamedService for GreeterServer {
        const NAME: &'static str = "hello.Greeter";
    }

    impl tower::Service<tollgate::http::Request<Body>> for GreeterServer {
        type Response = tollgate::http::Response<Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: tollgate::http::Request<Body>) -> Self::Future {
            Box::pin(async move {
                if req.uri().path() != SAY_HELLO {
                    return Ok(Status::unimplemented(format!("no method {}", req.uri().path())).into_http());
                }
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(grpc.unary(tower::service_fn(say_hello), req).await)
            })
        }
    }

    /// The handler. The rate limiter put its [`tollgate::Decision`] into the request's
    /// extensions, so the reply can say how many calls are left.
    ///
    /// # Errors
    ///
    /// None: every name gets a greeting.
    pub async fn say_hello(req: tonic::Request<HelloRequest>) -> Result<tonic::Response<HelloReply>, Status> {
        let left = req.extensions().get::<tollgate::Decision>().map(|d| d.remaining());
        let name = &req.get_ref().name;
        let message = match left {
            Some(n) => format!("Hello, {name}! ({n} calls left)"),
            None => format!("Hello, {name}!"),
        };
        Ok(tonic::Response::new(HelloReply { message }))
    }

    /// The client side.
    #[derive(Debug, Clone)]
    pub struct GreeterClient {
        inner: tonic::client::Grpc<Channel>,
    }

    impl GreeterClient {
        /// Connects to `http://host:port`.
        ///
        /// # Errors
        ///
        /// A malformed address, or a server that cannot be reached.
        pub async fn connect(addr: String) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
            let channel = Channel::from_shared(addr)?.connect().await?;
            Ok(Self { inner: tonic::client::Grpc::new(channel) })
        }

        /// Calls `SayHello`.
        ///
        /// # Errors
        ///
        /// The call's status: `RESOURCE_EXHAUSTED` when rate limited.
        pub async fn say_hello(
            &mut self,
            req: impl IntoRequest<HelloRequest>,
        ) -> Result<tonic::Response<HelloReply>, Status> {
            self.inner.ready().await.map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
            let path = tollgate::http::uri::PathAndQuery::from_static(SAY_HELLO);
            self.inner.unary(req.into_request(), path, ProstCodec::<HelloRequest, HelloReply>::default()).await
        }
    }
}

/// The limits of the gRPC server. gRPC metadata travels as HTTP/2 headers, so the
/// `x-api-key` metadata is read with `key::header`, and `key::PeerIp` finds the client
/// address in tonic's `TcpConnectInfo` (the crate's `tonic` feature).
///
/// # Panics
///
/// Never: the rule names are unique.
pub fn limits<St: Store>(store: St) -> RateLimitLayer<St> {
    RateLimitLayer::builder(store)
        // 5 calls a minute per API key. Calls without the metadata are not limited by
        // this rule, only by the next one.
        .rule("api-key", Quota::per_minute(5), key::header("x-api-key"))
        // 20 calls a minute per client address, whatever the key: one client cannot get
        // around the key limit by inventing keys.
        .rule("peer-ip", Quota::per_minute(20), key::PeerIp)
        // GCRA spaces calls evenly (one every 12 s for 5/min, after a burst of 5), so
        // the pushback a client gets is the real wait, not the end of a window.
        .algorithm(Algorithm::Gcra)
        .build()
        .expect("rule names are unique")
}

/// Serves the greeter behind `limits` on `listener` until the process ends.
///
/// # Errors
///
/// When the server fails (e.g. the listener breaks).
pub async fn serve<St: Store>(
    listener: TcpListener,
    limits: RateLimitLayer<St>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        // `Server::layer` puts the limiter in front of every service of this server; a
        // rejected call never reaches the router.
        .layer(limits)
        .add_service(hello::GreeterServer)
        // A TcpIncoming makes tonic insert `TcpConnectInfo` into each request.
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await
}

/// How long the server asks a client to wait before retrying a rejected call:
/// `grpc-retry-pushback-ms`, else `retry-after` (seconds). `None` for other errors, and
/// for a call that can never succeed (no retry information).
pub fn retry_delay(status: &tonic::Status) -> Option<Duration> {
    if status.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    let md = status.metadata();
    let read = |name: &str| md.get(name)?.to_str().ok()?.parse::<u64>().ok();
    read("grpc-retry-pushback-ms").map(Duration::from_millis).or_else(|| read("retry-after").map(Duration::from_secs))
}

/// Calls the server at `addr` with one API key until it is limited, printing each result.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = hello::GreeterClient::connect(format!("http://{addr}")).await?;
    for i in 1..=6 {
        let mut req = tonic::Request::new(hello::HelloRequest { name: "demo".into() });
        req.metadata_mut().insert("x-api-key", "demo".parse()?);
        match client.say_hello(req).await {
            Ok(res) => println!("call {i}: OK {}", res.get_ref().message),
            Err(status) => {
                let rule = status.metadata().get("x-ratelimit-rule").and_then(|v| v.to_str().ok()).unwrap_or("?");
                match retry_delay(&status) {
                    Some(wait) => {
                        println!("call {i}: {:?} by rule {rule}, retry in {} ms", status.code(), wait.as_millis());
                    }
                    None => println!("call {i}: {:?}: {}", status.code(), status.message()),
                }
            }
        }
    }
    Ok(())
}

/// Errors are printed as their message (`error: …`), not their `Debug` form.
#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(50051);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let server = tokio::spawn(serve(listener, limits(MemoryStore::new())));
    if std::env::args().nth(1).as_deref() == Some("demo") {
        return demo(addr).await;
    }
    server.await??;
    Ok(())
}
