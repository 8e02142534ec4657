//! What shows the engine to its operators: the status board every partition reports to, the
//! readiness rule read from it, the Prometheus metrics computed from it, the HTTP endpoints that
//! serve all three, and the logs.

pub mod group;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod process;
pub mod readiness;
pub mod status;
