//! What shows the engine to its operators: the status board every partition reports to (with the
//! readiness rule), the Prometheus metrics computed from it, the HTTP endpoints that serve both,
//! and the logs.

pub mod group;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod status;
