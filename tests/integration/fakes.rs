//! Small real servers on loopback that behave like the services timeoutd talks to: a payment
//! provider (idempotency keys honoured, "already paid", 503s and hangs on demand), a webhook
//! receiver, an OTLP collector, and a TCP proxy to a database that can be cut.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

/// The provider's books.
#[derive(Default)]
pub struct Books {
    /// Payment references whose buyer has paid.
    pub paid: HashSet<String>,
    /// The next this-many calls answer 503.
    pub down_for: u32,
    /// Answers already given, by idempotency key (a repeated key gets the same answer).
    pub answers: HashMap<String, (u16, Value)>,
    /// Distinct close requests (by idempotency key), in order: `(ref, key)`.
    pub closes: Vec<(String, String)>,
    /// Distinct refund requests.
    pub refunds: Vec<(String, String)>,
    /// Every request, including repeats and 503s.
    pub requests: u32,
    /// Every request, including repeats and 503s, in order: `(action, ref, key)` (key empty
    /// when missing). "Once" is counted here, not in the distinct lists above.
    pub calls: Vec<(String, String, String)>,
    /// The header the idempotency key must come in (`Idempotency-Key` when unset).
    pub key_header: Option<String>,
    /// The next this-many calls hang for 3 s before they are answered.
    pub hang_for: u32,
    /// Payment references the provider has never heard of: a status query answers
    /// `not_found`, a close `404` (the buyer never opened the cashier).
    pub unknown: HashSet<String>,
    /// When each paid reference was paid, epoch ms (status queries answer it).
    pub paid_at_ms: HashMap<String, i64>,
    /// References the buyer pays between timeoutd's status query and its close (F13's race): the
    /// query answers `unpaid`, the close `409 already_paid`.
    pub pays_during_close: HashSet<String>,
    /// When each status query arrived (for load measurements).
    pub query_times: Vec<std::time::Instant>,
}

impl Books {
    /// Whether the provider has closed `reference` (a close it answered `200 closed`).
    pub fn is_closed(&self, reference: &str) -> bool {
        self.closes.iter().any(|(r, _)| r == reference)
    }

    /// The buyer pays `reference` at `at_ms` (epoch ms), as a provider takes it: refused
    /// (`false`, nothing recorded) once the provider has closed that payment.
    pub fn pay(&mut self, reference: &str, at_ms: i64) -> bool {
        if self.is_closed(reference) {
            return false;
        }
        self.paid.insert(reference.to_string());
        self.paid_at_ms.insert(reference.to_string(), at_ms);
        true
    }

    /// Requests received for `action` on `reference`, repeats included.
    pub fn calls_for(&self, action: &str, reference: &str) -> usize {
        self.calls
            .iter()
            .filter(|(a, r, _)| a == action && r == reference)
            .count()
    }
}

/// A running fake provider.
#[derive(Clone)]
pub struct Provider {
    /// Its books.
    pub books: Arc<Mutex<Books>>,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
}

impl Provider {
    /// Starts one on a free loopback port.
    pub async fn start() -> Provider {
        let books = Arc::new(Mutex::new(Books::default()));
        let app = Router::new()
            .route("/v1/payments/{reference}/{action}", post(pay_action))
            .route("/v1/payments/{reference}", get(pay_status))
            .with_state(books.clone());
        let addr = serve(app).await;
        Provider {
            books,
            base_url: format!("http://{addr}"),
        }
    }
}

/// `GET /v1/payments/{ref}`: the payment's state (no idempotency key: a read).
async fn pay_status(
    State(books): State<Arc<Mutex<Books>>>,
    Path(reference): Path<String>,
) -> (StatusCode, Json<Value>) {
    let mut b = books.lock().unwrap();
    b.requests += 1;
    b.calls
        .push(("query".into(), reference.clone(), String::new()));
    b.query_times.push(std::time::Instant::now());
    if b.down_for > 0 {
        b.down_for -= 1;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": "maintenance" })),
        );
    }
    let body = if b.unknown.contains(&reference) {
        json!({ "status": "not_found" })
    } else if b.paid.contains(&reference) {
        let at = b.paid_at_ms.get(&reference).copied();
        json!({ "status": "paid", "paid_at_ms": at, "amount_cents": 3_490 })
    } else if b.is_closed(&reference) {
        json!({ "status": "closed" })
    } else {
        json!({ "status": "unpaid" })
    };
    (StatusCode::OK, Json(body))
}

async fn pay_action(
    State(books): State<Arc<Mutex<Books>>>,
    Path((reference, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    let hang = {
        let mut b = books.lock().unwrap();
        let hang = b.hang_for > 0;
        b.hang_for = b.hang_for.saturating_sub(1);
        hang
    };
    if hang {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    let mut b = books.lock().unwrap();
    let key_header = b
        .key_header
        .clone()
        .unwrap_or_else(|| "idempotency-key".to_string());
    b.requests += 1;
    let call_key = headers
        .get(key_header.as_str())
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    b.calls.push((action.clone(), reference.clone(), call_key));
    if b.down_for > 0 {
        b.down_for -= 1;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": "maintenance" })),
        );
    }
    let Some(key) = headers
        .get(key_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "Idempotency-Key required" })),
        );
    };
    if let Some((status, body)) = b.answers.get(&key) {
        return (StatusCode::from_u16(*status).unwrap(), Json(body.clone()));
    }
    let (status, body) = match action.as_str() {
        "close" if b.paid.contains(&reference) || b.pays_during_close.contains(&reference) => {
            (409, json!({ "status": "already_paid" }))
        }
        "close" if b.unknown.contains(&reference) => (404, json!({ "error": "no such payment" })),
        "close" => {
            b.closes.push((reference.clone(), key.clone()));
            (200, json!({ "status": "closed" }))
        }
        "refund" => {
            b.refunds.push((reference.clone(), key.clone()));
            (200, json!({ "status": "refunded" }))
        }
        _ => (404, json!({ "error": "no such action" })),
    };
    b.answers.insert(key, (status, body.clone()));
    (StatusCode::from_u16(status).unwrap(), Json(body))
}

/// Every POST a receiver got: its `Idempotency-Key` and JSON body.
pub type Inbox = Arc<Mutex<Vec<(String, Value)>>>;

/// A running webhook receiver.
#[derive(Clone)]
pub struct Receiver {
    /// What arrived.
    pub received: Inbox,
    /// `http://127.0.0.1:PORT/hook`.
    pub url: String,
    /// While `true`, every request is recorded and then held unanswered
    /// ([`Receiver::start_holding`], [`Receiver::let_go`]).
    holding: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Receiver {
    /// Starts one on a free loopback port.
    pub async fn start() -> Receiver {
        Receiver::start_with(false).await
    }

    /// Starts one that records its first request and never answers it (the sender's effect
    /// has arrived, its answer never does); later requests are answered.
    pub async fn start_hanging_first() -> Receiver {
        Receiver::start_with(true).await
    }

    /// Starts one that records every request and holds it unanswered until
    /// [`Receiver::let_go`]: a webhook that hangs, for as long as the test likes.
    pub async fn start_holding() -> Receiver {
        let receiver = Receiver::start_with(false).await;
        receiver.holding.send_replace(true);
        receiver
    }

    /// Answers the held requests, and every later one at once.
    pub fn let_go(&self) {
        self.holding.send_replace(false);
    }

    async fn start_with(hang_first: bool) -> Receiver {
        let received = Arc::new(Mutex::new(Vec::new()));
        let holding = Arc::new(tokio::sync::watch::channel(false).0);
        let app = Router::new().route("/hook", post(hook)).with_state((
            received.clone(),
            Arc::new(AtomicBool::new(hang_first)),
            holding.clone(),
        ));
        let addr = serve(app).await;
        Receiver {
            received,
            url: format!("http://{addr}/hook"),
            holding,
        }
    }
}

async fn hook(
    State((received, hang, holding)): State<(
        Inbox,
        Arc<AtomicBool>,
        Arc<tokio::sync::watch::Sender<bool>>,
    )>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    received.lock().unwrap().push((key, body));
    if hang.swap(false, Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let mut held = holding.subscribe();
    let _ = held.wait_for(|holding| !holding).await;
    StatusCode::NO_CONTENT
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A running OpenTelemetry collector stand-in: records every OTLP/HTTP export body posted to
/// `/v1/traces` (protobuf, kept as bytes) and answers 200.
#[derive(Clone)]
pub struct Collector {
    /// The export bodies, in arrival order.
    pub bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    /// `http://127.0.0.1:PORT/v1/traces`.
    pub url: String,
}

impl Collector {
    /// Starts one on a free loopback port.
    pub async fn start() -> Collector {
        let bodies: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let app = Router::new()
            .route(
                "/v1/traces",
                post(
                    |State(b): State<Arc<Mutex<Vec<Vec<u8>>>>>, body: axum::body::Bytes| async move {
                        b.lock().unwrap().push(body.to_vec());
                        StatusCode::OK
                    },
                ),
            )
            .with_state(bodies.clone());
        let addr = serve(app).await;
        Collector {
            bodies,
            url: format!("http://{addr}/v1/traces"),
        }
    }

    /// Every exported span of trace `trace_id` (32 hex digits), decoded from the OTLP/HTTP
    /// protobuf bodies.
    pub fn spans(&self, trace_id: &str) -> Vec<Span> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        let mut spans = Vec::new();
        for body in self.bodies.lock().unwrap().iter() {
            let request = ExportTraceServiceRequest::decode(body.as_slice())
                .expect("an OTLP/HTTP export body");
            for scope in request.resource_spans.iter().flat_map(|r| &r.scope_spans) {
                for s in &scope.spans {
                    if hex::encode(&s.trace_id) == trace_id {
                        spans.push(Span {
                            name: s.name.clone(),
                            span_id: hex::encode(&s.span_id),
                            parent_span_id: hex::encode(&s.parent_span_id),
                        });
                    }
                }
            }
        }
        spans
    }
}

/// One exported span: its name and ids as hex (`parent_span_id` empty for a root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Span name.
    pub name: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
}

/// A TCP proxy to the database. While `cut`, new connections are refused (accepted and dropped)
/// and every open one is torn down, as when the database host goes away.
pub struct Proxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    cut: Arc<AtomicBool>,
    hang: Arc<AtomicBool>,
    severed: Arc<tokio::sync::Notify>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &'static str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let hang = Arc::new(AtomicBool::new(false));
        let severed = Arc::new(tokio::sync::Notify::new());
        let (c, h, s) = (cut.clone(), hang.clone(), severed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                if h.load(Ordering::SeqCst) {
                    // A black hole: the connection is taken and never answered.
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_secs(120)).await;
                        drop(inbound);
                    });
                    continue;
                }
                let (s, c, h) = (s.clone(), c.clone(), h.clone());
                tokio::spawn(async move {
                    // Listen for the cut before looking at the flags: a cut set in between is
                    // seen by one or the other, never missed.
                    let severed = s.notified();
                    tokio::pin!(severed);
                    severed.as_mut().enable();
                    if c.load(Ordering::SeqCst) || h.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = severed => {}
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            hang,
            severed,
        }
    }

    /// Cuts (refuses new, tears down open connections) or restores.
    pub fn set_cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
        if on {
            self.severed.notify_waiters();
        }
    }

    /// Makes the database a black hole (open connections torn down, new ones taken and never
    /// answered, as behind a dead host whose packets are dropped) or restores it.
    pub fn set_hang(&self, on: bool) {
        self.hang.store(on, Ordering::SeqCst);
        if on {
            self.severed.notify_waiters();
        }
    }
}

/// How a [`BadPeer`] answers an HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Accepts the connection, reads the request, never answers (held open 120 s).
    Hang,
    /// Answers `200 OK` one byte a second (status line, headers, body), as a peer behind a
    /// saturated link or a stuck proxy does.
    Trickle,
    /// Answers every request `302 Found` with `Location: /login` (a webhook behind a login
    /// wall), and a GET of `/login` with `200` (counted: a client that followed the redirect).
    Redirect302,
    /// Answers every request `303 See Other` to [`SEE_OTHER`] (a provider's "see the
    /// payment"), and a GET of it with `200 {"status":"closed"}` (counted).
    Redirect303,
    /// Answers `429 Too Many Requests` with `Retry-After: 120`.
    Throttle,
}

/// Where a [`Misbehaviour::Redirect303`] peer sends every request.
pub const SEE_OTHER: &str = "/v1/payments/see-other";

/// A raw HTTP/1.1 peer that misbehaves one way ([`Misbehaviour`]), counting what reached it.
#[derive(Clone)]
pub struct BadPeer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Connections accepted.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The request lines read (`POST /hook HTTP/1.1`), in order.
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl BadPeer {
    /// Listens on a free loopback port.
    pub async fn start(how: Misbehaviour) -> BadPeer {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (count, seen) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    loop {
                        // One request: its head, then its body by Content-Length.
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            match socket.read(&mut byte).await {
                                Ok(1) => head.push(byte[0]),
                                _ => return,
                            }
                        }
                        let head = String::from_utf8_lossy(&head).into_owned();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        let mut body = vec![0u8; length];
                        if socket.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let line = head.lines().next().unwrap_or_default().to_string();
                        let get = line.starts_with("GET ");
                        let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                        seen.lock().unwrap().push(line);
                        let answer = match how {
                            Misbehaviour::Hang => {
                                tokio::time::sleep(std::time::Duration::from_secs(120)).await;
                                return;
                            }
                            Misbehaviour::Trickle => {
                                let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                                for b in answer {
                                    if socket.write_all(&[*b]).await.is_err() {
                                        return;
                                    }
                                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                                }
                                continue;
                            }
                            Misbehaviour::Redirect302 | Misbehaviour::Redirect303
                                if get && (path == "/login" || path == SEE_OTHER) =>
                            {
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n{\"status\":\"closed\"}".to_string()
                            }
                            Misbehaviour::Redirect302 => {
                                "HTTP/1.1 302 Found\r\nLocation: /login\r\nContent-Length: 0\r\n\r\n".to_string()
                            }
                            Misbehaviour::Redirect303 => format!(
                                "HTTP/1.1 303 See Other\r\nLocation: {SEE_OTHER}\r\nContent-Length: 0\r\n\r\n"
                            ),
                            Misbehaviour::Throttle => {
                                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 120\r\nContent-Length: 0\r\n\r\n".to_string()
                            }
                        };
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        BadPeer {
            base,
            connections,
            requests,
        }
    }

    /// The requests that were GETs (a client following a redirect).
    pub fn gets(&self) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("GET "))
            .count()
    }
}
