//! The service as `run` and `demo` share it: the restore engine on its own runtime, the HTTP
//! endpoints on the caller's, and a clean stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::observe::http::{self, AppState};
use crate::observe::readiness::{NotReady, WarmUp};
use crate::observe::status::Board;
use crate::restore::{Engine, EngineError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Why `warmstore restore` ends without warm stores.
#[derive(Debug, thiserror::Error)]
pub enum NotWarm {
    #[error("{}", listed("failed", .0))]
    Failed(Vec<NotReady>),
    #[error("not warm after {}s: {}", .after.as_secs(), listed("still", .not_ready))]
    TimedOut {
        after: Duration,
        not_ready: Vec<NotReady>,
    },
    #[error("stopped by a signal before every store was warm")]
    Interrupted,
}

/// One line per partition (or store), for the error a one-shot restore exits with.
fn listed(what: &str, not_ready: &[NotReady]) -> String {
    let lines: Vec<String> = not_ready
        .iter()
        .map(|n| match (&n.topic, n.partition) {
            (Some(topic), Some(partition)) => {
                format!("store {} ({topic}-{partition}): {}", n.store, n.reason)
            }
            // The process as a whole: its consumer group.
            _ if n.store.is_empty() => n.reason.clone(),
            _ => format!("store {}: {}", n.store, n.reason),
        })
        .collect();
    format!(
        "{} store partition(s) {what}:\n  {}",
        lines.len(),
        lines.join("\n  ")
    )
}

/// How often a one-shot restore looks at the board.
const WARM_UP_LOOK_EVERY: Duration = Duration::from_millis(100);
/// How often a stop that has not finished says so.
const STOP_REPORT_EVERY: Duration = Duration::from_secs(5);

pub struct Service {
    engine: Engine,
    pub board: Arc<Board>,
    pub http_addr: SocketAddr,
    http_stop: oneshot::Sender<()>,
    http_task: JoinHandle<std::io::Result<()>>,
}

impl Service {
    pub async fn start(config: &Config) -> Result<Service, ServiceError> {
        let addr = config.http.listen;
        let listener = http::bind(addr)
            .await
            .map_err(|source| ServiceError::Listen { addr, source })?;
        let http_addr = listener.local_addr().unwrap_or(addr);
        let board = Arc::new(Board::default());
        let engine = Engine::start(config, board.clone())?;
        let state = AppState {
            board: board.clone(),
            registry: Arc::new(crate::observe::metrics::registry(
                board.clone(),
                config.restore.ready_max_lag,
            )),
            ready_max_lag: config.restore.ready_max_lag,
        };
        let (http_stop, stopped) = oneshot::channel::<()>();
        let http_task = tokio::spawn(http::serve(listener, state, async {
            let _ = stopped.await;
        }));
        tracing::info!(%http_addr, "serving /metrics, /livez, /readyz and /stores");
        Ok(Service {
            engine,
            board,
            http_addr,
            http_stop,
            http_task,
        })
    }

    /// Waits until every store partition is within `ready_max_lag` records of its end offset, as
    /// `/readyz` judges it. Ends early when one fails (an init container should fail visibly, not
    /// retry where the application cannot see it), on `timeout`, or when `interrupt` resolves.
    pub async fn until_warm(
        &self,
        ready_max_lag: u64,
        timeout: Option<Duration>,
        interrupt: impl std::future::Future<Output = ()>,
    ) -> Result<(), NotWarm> {
        let started = Instant::now();
        tokio::pin!(interrupt);
        loop {
            let readiness = self.board.readiness(ready_max_lag);
            match readiness.warm_up() {
                WarmUp::Warm => return Ok(()),
                WarmUp::Failed(failed) => return Err(NotWarm::Failed(failed)),
                WarmUp::Restoring => {}
            }
            if let Some(after) = timeout.filter(|t| started.elapsed() >= *t) {
                let not_ready = readiness.not_ready;
                return Err(NotWarm::TimedOut { after, not_ready });
            }
            tokio::select! {
                _ = &mut interrupt => return Err(NotWarm::Interrupted),
                _ = tokio::time::sleep(WARM_UP_LOOK_EVERY) => {}
            }
        }
    }

    /// Stops fetching, commits, flushes and closes every store, then stops the HTTP server. A stop
    /// that takes long says every few seconds what it still waits for: RocksDB retries a failed
    /// flush after a second, on one thread shared by every store, so stores whose disk is gone or
    /// full close one a second.
    pub async fn stop(self) {
        let engine = self.engine;
        let progress = engine.stop_progress();
        let stopping = tokio::task::spawn_blocking(move || engine.stop());
        tokio::pin!(stopping);
        let stopped = loop {
            tokio::select! {
                stopped = &mut stopping => break stopped,
                _ = tokio::time::sleep(STOP_REPORT_EVERY) => tracing::warn!(
                    unfinished = progress.unfinished(),
                    "stopping: store partitions are still committing, flushing and closing; a \
                     SIGTERM, SIGINT or SIGHUP now exits at once and leaves them as a crash would"
                ),
            }
        };
        if stopped.is_err() {
            tracing::error!("the restore engine panicked while stopping");
        }
        let _ = self.http_stop.send(());
        match self.http_task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "HTTP server task failed"),
            Ok(Ok(())) => {}
        }
    }
}

/// Resolves on SIGTERM, SIGINT or SIGHUP. SIGHUP (the terminal of a foreground process closing)
/// would otherwise end the process as SIGKILL does, leaving every store open: under
/// `on_unclean_shutdown: wipe` the next start would rebuild them all.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (term, hangup) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    let received = |signal: Result<tokio::signal::unix::Signal, _>| async move {
        match signal {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = received(term) => {}
        _ = received(hangup) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested; closing stores");
}
