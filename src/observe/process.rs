//! The process's own metrics (`process_*`), from the `prometheus` crate's collector with one
//! figure corrected. That collector divides CPU clock ticks by their rate in integers, so
//! `process_cpu_seconds_total` moved in whole seconds: an idle standby's 1-2% of a core showed as
//! a step of one second about once a minute, and a short-window rate as 0 or as a whole core's
//! fraction. The kernel's own account of the process's CPU (`getrusage`, to the microsecond)
//! replaces it.

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::{Counter, MetricFamily};

const CPU_SECONDS: &str = "process_cpu_seconds_total";

/// Collects what `ProcessCollector` does, with CPU seconds to the microsecond.
pub struct ProcessMetrics(ProcessCollector);

impl ProcessMetrics {
    pub fn for_self() -> ProcessMetrics {
        ProcessMetrics(ProcessCollector::for_self())
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.0.collect();
        if let Some(seconds) = cpu_seconds() {
            for family in families.iter_mut().filter(|f| f.name() == CPU_SECONDS) {
                for metric in family.mut_metric() {
                    let mut counter = Counter::default();
                    counter.set_value(seconds);
                    metric.set_counter(counter);
                }
            }
        }
        families
    }
}

/// User and system CPU seconds of every thread of the process so far.
fn cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given, and reports whether it did.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call above (and zeroed before it).
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}
