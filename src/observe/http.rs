//! The HTTP endpoints: `/metrics`, `/livez`, `/readyz`, `/stores`. GET only;
//! any other method gets 405, and request bodies are refused.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus::Registry;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::observe::status::Board;

#[derive(Clone)]
pub struct AppState {
    pub board: Arc<Board>,
    pub registry: Arc<Registry>,
    pub ready_max_lag: u64,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/stores", get(stores))
        .layer(middleware::from_fn(refuse_bodies))
        .with_state(state)
}

/// The endpoints take no input: a request announcing a body over 1 KiB (or a chunked one) is refused
/// before anything reads it.
async fn refuse_bodies(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let too_long = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > 1024);
    if too_long || headers.contains_key(header::TRANSFER_ENCODING) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted\n",
        )
            .into_response();
    }
    next.run(request).await
}

async fn metrics(State(state): State<AppState>) -> Response {
    let body = crate::observe::metrics::render(&state.registry);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Checks no dependency: only that the restore engine is still running.
async fn livez(State(state): State<AppState>) -> Response {
    if state.board.restore_alive.load(Relaxed) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "restore engine is not running\n",
        )
            .into_response()
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.board.readiness(state.ready_max_lag);
    let code = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(readiness)).into_response()
}

async fn stores(State(state): State<AppState>) -> Response {
    let rows: Vec<_> = state
        .board
        .partitions()
        .iter()
        .map(|p| p.snapshot())
        .collect();
    let mut body = serde_json::json!({
        "partitions": rows,
        "store_errors": state.board.store_errors(),
    });
    if let Some(group) = state.board.group() {
        body["group"] = serde_json::json!(group);
    }
    Json(body).into_response()
}

/// Binds first (so a taken port is reported before anything else starts), then serves until
/// `shutdown` resolves.
pub async fn bind(listen: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
