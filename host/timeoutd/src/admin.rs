//! The operators' API: probes, Prometheus metrics, and under bearer-token auth (every call
//! audited in `admin_audit`) the overdue orders, an order's timeline, manual close, dead letters
//! and their re-drive, failed ledger effects and their retry, plugins, the sweep's run-time
//! tuning, and pausing a merchant or an order. `GET /v1/openapi.json` describes it.
//!
//! Manual close and re-drive are never side doors: a manual close is a trigger of kind `manual`
//! through the same dispatcher (plugin, guard, compare-and-set, ledger); a re-drive re-arms the
//! order's outbox row, which the outbox timer then handles like any other.

mod bulk;
mod dead_letters;
mod ledger;
mod ops;
mod orders;
mod pauses;
mod shadow;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::db::Db;
use crate::dispatch::Dispatcher;
use crate::gauges::Sample;
use crate::policies::Policies;
use crate::sources::outbox::Waker;
use crate::sources::sweep::SweepTuning;

/// Every route: `(method, path)`, as in the OpenAPI document.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/console"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/orders/overdue"),
    ("get", "/v1/orders/{id}"),
    ("post", "/v1/orders/{id}/close"),
    ("post", "/v1/orders/close"),
    ("post", "/v1/orders/rearm"),
    ("get", "/v1/dead-letters"),
    ("get", "/v1/dead-letters/{id}"),
    ("post", "/v1/dead-letters/{id}/redrive"),
    ("post", "/v1/dead-letters/redrive"),
    ("get", "/v1/ledger/failed"),
    ("post", "/v1/ledger/{id}/retry"),
    ("post", "/v1/ledger/retry"),
    ("get", "/v1/backlog"),
    ("get", "/v1/plugins"),
    ("post", "/v1/plugins/reload"),
    ("get", "/v1/sweep"),
    ("put", "/v1/sweep"),
    ("get", "/v1/pauses"),
    ("post", "/v1/merchants/{merchant}/pause"),
    ("post", "/v1/merchants/{merchant}/resume"),
    ("get", "/v1/merchants/{merchant}/shadow"),
    ("post", "/v1/orders/{id}/pause"),
    ("post", "/v1/orders/{id}/resume"),
];

/// The operators' console: one page over this API (sign in with a token), with the chart
/// code it shares with `timeoutd plugin whatif`'s report ([`CHART_JS`]) in its script.
pub static CONSOLE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| include_str!("admin/console.html").replace("/*CHART*/", CHART_JS));

/// The stacked-bar chart, drawn as SVG in the page (`assets/chart.js`): the console's and the
/// what-if report's one chart code.
pub const CHART_JS: &str = include_str!("../assets/chart.js");

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI: &str = include_str!("admin/openapi.json");

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    pub(crate) db: Db,
    pub(crate) clock: Clock,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) policies: Arc<Policies>,
    pub(crate) effects: crate::effects::EffectRunner,
    pub(crate) waker: Waker,
    pub(crate) sweep: watch::Sender<SweepTuning>,
    pub(crate) sample: watch::Receiver<Sample>,
    pub(crate) overdue_margin_ms: i64,
    /// Token → the name audited for it.
    tokens: Arc<BTreeMap<String, String>>,
}

impl AdminState {
    /// State over the daemon's parts (`ctx`), its effect runner, the sweep's live tuning and
    /// the latest backlog sample; `tokens` maps names to bearer tokens ([`tokens`]).
    pub fn new(
        ctx: &crate::context::Context,
        effects: crate::effects::EffectRunner,
        sweep: watch::Sender<SweepTuning>,
        sample: watch::Receiver<Sample>,
        config: &crate::config::AdminConfig,
        tokens: &BTreeMap<String, String>,
    ) -> Self {
        let crate::context::Context {
            db,
            clock,
            policies,
            dispatcher,
            waker,
            ..
        } = ctx.clone();
        AdminState {
            db,
            clock,
            dispatcher,
            policies,
            effects,
            waker,
            sweep,
            sample,
            overdue_margin_ms: config.overdue_margin.as_millis() as i64,
            tokens: Arc::new(
                tokens
                    .iter()
                    .map(|(name, token)| (token.clone(), name.clone()))
                    .collect(),
            ),
        }
    }
}

/// The API's bearer tokens by name: the configured ones that are not empty; when there are
/// none, the console's (`console`) from `admin.token_file`, generated there first if the file
/// is missing (32 hex characters from the OS's random source, mode 0600). Returns the tokens
/// and, when the file was used, its path.
///
/// # Errors
/// The token file cannot be read or written, or holds fewer than 16 characters.
pub fn tokens(
    config: &crate::config::AdminConfig,
) -> Result<(BTreeMap<String, String>, Option<std::path::PathBuf>), String> {
    let given: BTreeMap<String, String> = config
        .tokens
        .iter()
        .filter(|(_, token)| !token.is_empty())
        .map(|(name, token)| (name.clone(), token.clone()))
        .collect();
    let Some(file) = config.token_file.as_ref().filter(|_| given.is_empty()) else {
        return Ok((given, None));
    };
    let shown = file.display();
    let token = match std::fs::read_to_string(file) {
        Ok(text) => text.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).map_err(|e| format!("admin.token_file {shown}: {e}"))?;
            let token = hex::encode(bytes);
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("admin.token_file {shown}: {e}"))?;
            }
            match write_private(file, &token) {
                Ok(()) => token,
                // Another daemon on the same data directory made it first (whole: it is
                // written aside and linked into place).
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::read_to_string(file)
                        .map_err(|e| format!("admin.token_file {shown}: {e}"))?
                        .trim()
                        .to_string()
                }
                Err(e) => return Err(format!("admin.token_file {shown}: {e}")),
            }
        }
        Err(e) => return Err(format!("admin.token_file {shown}: {e}")),
    };
    if token.len() < 16 {
        return Err(format!(
            "admin.token_file {shown}: holds a token shorter than 16 characters"
        ));
    }
    Ok((
        BTreeMap::from([("console".to_string(), token)]),
        Some(file.clone()),
    ))
}

/// Writes `text` to a new file at `path` that only its owner can read, all at once: written to a
/// temporary file beside it first, then hard-linked into place (which fails with
/// `AlreadyExists` rather than replace a file another process made), so nobody ever reads it
/// half-written.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let aside = path.with_extension(format!("tmp{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&aside)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::hard_link(&aside, path)
    })();
    let _ = std::fs::remove_file(&aside);
    written
}

/// Who made an authenticated call: its token's name (`[admin.tokens]`), handed to handlers that
/// record it (a pause's `paused_by`).
#[derive(Debug, Clone)]
pub struct Actor(pub String);

/// An API error: a status and a message naming what was wrong.
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

impl ApiError {
    /// 503 for a failed statement of the API's own reads and writes ([`crate::db::views`], the
    /// retry and re-drive updates): the driver's message alone, without the `database:` prefix
    /// of [`From<DbError>`](crate::db::DbError), as these answers have always read.
    pub(crate) fn query(e: crate::db::DbError) -> Self {
        match e {
            crate::db::DbError::Sql(e) => ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            other => other.into(),
        }
    }
}

/// Handler result.
pub type ApiResult<T> = Result<Json<T>, ApiError>;

/// The routes.
pub fn router(state: AdminState) -> Router {
    let v1 = Router::new()
        .route(
            "/v1/openapi.json",
            get(|| async { ([("content-type", "application/json")], OPENAPI) }),
        )
        .route("/v1/orders/overdue", get(orders::overdue))
        .route("/v1/orders/{id}", get(orders::timeline))
        .route("/v1/orders/{id}/close", post(orders::close))
        .route("/v1/orders/close", post(orders::close_many))
        .route("/v1/orders/rearm", post(orders::rearm_many))
        .route("/v1/dead-letters", get(dead_letters::list))
        .route("/v1/dead-letters/{id}", get(dead_letters::inspect))
        .route("/v1/dead-letters/{id}/redrive", post(dead_letters::redrive))
        .route("/v1/dead-letters/redrive", post(dead_letters::redrive_many))
        .route("/v1/ledger/failed", get(ledger::failed))
        .route("/v1/ledger/{id}/retry", post(ledger::retry))
        .route("/v1/ledger/retry", post(ledger::retry_many))
        .route("/v1/backlog", get(ops::backlog))
        .route("/v1/plugins", get(ops::plugins))
        .route("/v1/plugins/reload", post(ops::reload_plugins))
        .route("/v1/sweep", get(ops::sweep_get).put(ops::sweep_put))
        .route("/v1/pauses", get(pauses::list))
        .route(
            "/v1/merchants/{merchant}/pause",
            post(pauses::pause_merchant),
        )
        .route(
            "/v1/merchants/{merchant}/resume",
            post(pauses::resume_merchant),
        )
        .route("/v1/merchants/{merchant}/shadow", get(shadow::summary))
        .route("/v1/orders/{id}/pause", post(pauses::pause_order))
        .route("/v1/orders/{id}/resume", post(pauses::resume_order))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authenticate_and_audit,
        ));
    Router::new()
        .route(
            "/console",
            get(|| async { axum::response::Html(CONSOLE.as_str()) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .merge(v1)
        .fallback(crate::http::no_route)
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: watch::Receiver<bool>,
) {
    crate::http::serve_until(listener, router(state), shutdown, "admin API").await;
}

/// Refuses calls without a known bearer token (401, logged on target `timeoutd::audit`) and
/// writes every authenticated call to `admin_audit`.
async fn authenticate_and_audit(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let actor = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| state.tokens.get(token).cloned());
    let mut request = request;
    let response = match &actor {
        Some(name) => {
            request.extensions_mut().insert(Actor(name.clone()));
            next.run(request).await
        }
        None => ApiError(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required".into(),
        )
        .into_response(),
    };
    let status = response.status().as_u16();
    let Some(actor) = actor else {
        // Refused calls are logged, not written: an anonymous client must not be able to make
        // the daemon write to its database.
        tracing::warn!(target: "timeoutd::audit", %method, %path, status, "unauthenticated admin call refused");
        return response;
    };
    tracing::info!(target: "timeoutd::audit", %actor, %method, %path, status, "admin call");
    if let Err(e) = audit(&state, &actor, &method, &path, status).await {
        tracing::error!(error = %e, "admin call not audited");
    }
    response
}

async fn audit(
    state: &AdminState,
    actor: &str,
    method: &str,
    path: &str,
    status: u16,
) -> Result<(), crate::db::DbError> {
    let now = state.clock.now_ms(&state.db).await?;
    crate::db::audit::record(&state.db, now, actor, method, path, status).await
}
