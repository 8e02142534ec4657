//! Prometheus metrics (docs/metrics.md lists them), computed from the status board when scraped. The
//! restore loop only bumps atomics once per batch; turning them into series costs nothing until
//! someone asks.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Registry, TextEncoder};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::observe::group::RebalanceKind;
use crate::observe::status::{Board, PartitionState, PartitionStatus};
use crate::restore::policy;
use crate::store::dirty::WipeReason;

const PARTITION_LABELS: [&str; 3] = ["store", "topic", "partition"];

/// Every per-partition family the board produces. A variant, not a string, names a series, so a
/// misspelt one does not compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    ChangelogEndOffset,
    ChangelogStartOffset,
    StoreAppliedOffset,
    RestoreLagRecords,
    RestoreLagSeconds,
    RestoreProgressRatio,
    RestoreEtaSeconds,
    RecordsRestoredTotal,
    BytesRestoredTotal,
    StoreState,
    StoreWipesTotal,
    UncleanShutdownsTotal,
    InvalidRecordsTotal,
    CommitsTotal,
    StoreEstimatedKeys,
    StoreDiskBytes,
    RestoreWaiting,
}

impl Family {
    const ALL: [Family; 17] = [
        Family::ChangelogEndOffset,
        Family::ChangelogStartOffset,
        Family::StoreAppliedOffset,
        Family::RestoreLagRecords,
        Family::RestoreLagSeconds,
        Family::RestoreProgressRatio,
        Family::RestoreEtaSeconds,
        Family::RecordsRestoredTotal,
        Family::BytesRestoredTotal,
        Family::StoreState,
        Family::StoreWipesTotal,
        Family::UncleanShutdownsTotal,
        Family::InvalidRecordsTotal,
        Family::CommitsTotal,
        Family::StoreEstimatedKeys,
        Family::StoreDiskBytes,
        Family::RestoreWaiting,
    ];

    /// Name, help, and the label beyond store, topic and partition, if any.
    fn describe(self) -> (&'static str, &'static str, Option<&'static str>) {
        use Family as F;
        match self {
            F::ChangelogEndOffset => ("warmstore_changelog_end_offset", "Latest end offset seen for the changelog partition", None),
            F::ChangelogStartOffset => ("warmstore_changelog_start_offset", "Log-start offset of the changelog partition", None),
            F::StoreAppliedOffset => ("warmstore_store_applied_offset", "Applied offset committed in the store (-1 if none)", None),
            F::RestoreLagRecords => ("warmstore_restore_lag_records", "End offset minus consumer position", None),
            F::RestoreLagSeconds => ("warmstore_restore_lag_seconds", "Age of the oldest record not yet applied, estimated from record timestamps (0 when caught up)", None),
            F::RestoreProgressRatio => ("warmstore_restore_progress_ratio", "Progress of the current catch-up, 1 when caught up", None),
            F::RestoreEtaSeconds => ("warmstore_restore_eta_seconds", "Lag divided by the smoothed apply rate; absent when unknown", None),
            F::RecordsRestoredTotal => ("warmstore_records_restored_total", "Records applied, tombstones included", None),
            F::BytesRestoredTotal => ("warmstore_bytes_restored_total", "Key plus value bytes applied", None),
            F::StoreState => ("warmstore_store_state", "1 for the partition's current state", Some("state")),
            F::StoreWipesTotal => ("warmstore_store_wipes_total", "Store wipes by reason", Some("reason")),
            F::UncleanShutdownsTotal => ("warmstore_unclean_shutdowns_total", "Stores found open (not closed cleanly) and resumed", None),
            F::InvalidRecordsTotal => ("warmstore_invalid_records_total", "Records skipped as invalid, by reason", Some("reason")),
            F::CommitsTotal => ("warmstore_commits_total", "Store commits", None),
            F::StoreEstimatedKeys => ("warmstore_store_estimated_keys", "RocksDB's estimate of the keys in the store", None),
            F::StoreDiskBytes => ("warmstore_store_disk_bytes", "Bytes of the store directory on disk", None),
            F::RestoreWaiting => ("warmstore_restore_waiting", "1 while the partition is behind but waits for its turn to catch up (catch_up_turns)", None),
        }
    }

    fn name(self) -> &'static str {
        self.describe().0
    }

    /// Counters end in `_total`, as Prometheus' naming rules have it; the rest are gauges.
    fn kind(self) -> MetricType {
        if self.name().ends_with("_total") {
            MetricType::COUNTER
        } else {
            MetricType::GAUGE
        }
    }
}

/// Turns the board into metric families at scrape time.
struct BoardCollector {
    board: Arc<Board>,
    ready_max_lag: u64,
    descs: Vec<Desc>,
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_string());
    pair.set_value(value.to_string());
    pair
}

fn sample(labels: Vec<LabelPair>, kind: MetricType, value: f64) -> Metric {
    let mut metric = Metric::default();
    metric.set_label(labels);
    if kind == MetricType::COUNTER {
        let mut c = Counter::default();
        c.set_value(value);
        metric.set_counter(c);
    } else {
        let mut g = Gauge::default();
        g.set_value(value);
        metric.set_gauge(g);
    }
    metric
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One series of a partition: its family, the optional extra label (state or reason), value.
type Sample = (Family, Option<(&'static str, &'static str)>, f64);

/// Every series of one partition.
fn partition_values(p: &PartitionStatus, now_ms: i64) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut gauge = |family: Family, v: i64| {
        if v >= 0 {
            out.push((family, None, v as f64));
        }
    };
    gauge(Family::ChangelogEndOffset, p.end_offset.load(Relaxed));
    gauge(Family::ChangelogStartOffset, p.log_start.load(Relaxed));
    out.push((
        Family::StoreAppliedOffset,
        None,
        p.applied.load(Relaxed) as f64,
    ));
    let state = p.state();
    if let Some(lag) = p.lag() {
        out.push((Family::RestoreLagRecords, None, lag as f64));
        let caught_up = lag == 0;
        let ts = p.last_record_ts_ms.load(Relaxed);
        if caught_up {
            out.push((Family::RestoreLagSeconds, None, 0.0));
        } else if ts >= 0 {
            out.push((
                Family::RestoreLagSeconds,
                None,
                ((now_ms - ts).max(0) as f64) / 1000.0,
            ));
        }
        let progress = if caught_up {
            1.0
        } else {
            policy::progress(
                p.catchup_from.load(Relaxed),
                p.catchup_target.load(Relaxed),
                p.position.load(Relaxed),
            )
        };
        out.push((Family::RestoreProgressRatio, None, progress));
        if let Some(eta) = policy::eta_seconds(lag, p.rate()) {
            out.push((Family::RestoreEtaSeconds, None, eta));
        }
    }
    let plain = [
        (Family::RecordsRestoredTotal, &p.records),
        (Family::BytesRestoredTotal, &p.bytes),
        (Family::UncleanShutdownsTotal, &p.unclean_shutdowns),
        (Family::CommitsTotal, &p.commits),
        (Family::StoreEstimatedKeys, &p.estimated_keys),
        (Family::StoreDiskBytes, &p.disk_bytes),
    ];
    for (family, value) in plain {
        out.push((family, None, value.load(Relaxed) as f64));
    }
    out.push((
        Family::RestoreWaiting,
        None,
        f64::from(u8::from(p.waiting.load(Relaxed))),
    ));
    for s in PartitionState::ALL {
        out.push((
            Family::StoreState,
            Some(("state", s.label())),
            f64::from(u8::from(s == state)),
        ));
    }
    for r in WipeReason::ALL {
        out.push((
            Family::StoreWipesTotal,
            Some(("reason", r.label())),
            p.wipes(r) as f64,
        ));
    }
    out.push((
        Family::InvalidRecordsTotal,
        Some(("reason", "null_key")),
        p.null_keys.load(Relaxed) as f64,
    ));
    out
}

impl Collector for BoardCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = now_ms();
        let mut samples: BTreeMap<Family, Vec<Metric>> = BTreeMap::new();
        let mut histograms = Vec::new();
        for p in self.board.partitions() {
            let partition = p.partition.to_string();
            for (family, extra, value) in partition_values(&p, now) {
                let mut labels = vec![
                    label("store", &p.store),
                    label("topic", &p.topic),
                    label("partition", &partition),
                ];
                if let Some((k, v)) = extra {
                    labels.push(label(k, v));
                }
                samples
                    .entry(family)
                    .or_default()
                    .push(sample(labels, family.kind(), value));
            }
            for family in p.commit_seconds.collect() {
                histograms.extend(family.get_metric().iter().cloned());
            }
        }
        // A store whose partitions cannot even be listed (its topic is missing, or Kafka refuses
        // the connection) has no partition series: it shows as failed with empty topic and
        // partition, so the failed-store alert fires for it as well.
        for store in self.board.store_errors().into_keys() {
            let labels = vec![
                label("store", &store),
                label("topic", ""),
                label("partition", ""),
                label("state", PartitionState::Failed.label()),
            ];
            samples.entry(Family::StoreState).or_default().push(sample(
                labels,
                MetricType::GAUGE,
                1.0,
            ));
        }
        let mut families: Vec<MetricFamily> = samples
            .into_iter()
            .map(|(f, metrics)| {
                let (name, help, _) = f.describe();
                let mut family = MetricFamily::default();
                family.set_name(name.to_string());
                family.set_help(help.to_string());
                family.set_field_type(f.kind());
                family.set_metric(metrics);
                family
            })
            .collect();
        if !histograms.is_empty() {
            let mut family = MetricFamily::default();
            family.set_name("warmstore_commit_duration_seconds".into());
            family.set_help("Store commit latency".into());
            family.set_field_type(MetricType::HISTOGRAM);
            family.set_metric(histograms);
            families.push(family);
        }
        families.extend(process_families(&self.board));
        let mut ready = MetricFamily::default();
        ready.set_name("warmstore_ready".into());
        ready.set_help("1 when /readyz answers 200".into());
        ready.set_field_type(MetricType::GAUGE);
        let is_ready = self.board.readiness(self.ready_max_lag).ready;
        ready.set_metric(vec![sample(
            Vec::new(),
            MetricType::GAUGE,
            f64::from(u8::from(is_ready)),
        )]);
        families.push(ready);
        families
    }
}

/// A family of one unlabelled series, or one series per label value.
fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    samples: Vec<(Option<(&str, &str)>, f64)>,
) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    family.set_metric(
        samples
            .into_iter()
            .map(|(l, v)| sample(l.map(|(k, v)| label(k, v)).into_iter().collect(), kind, v))
            .collect(),
    );
    family
}

const ASSIGNED_PARTITIONS: (&str, &str) = (
    "warmstore_assigned_partitions",
    "Store partitions this process restores (in group mode, those the consumer group assigned it)",
);
const REBALANCES: (&str, &str) = (
    "warmstore_rebalances_total",
    "Consumer group rebalances seen by this process, by kind (group mode)",
);
const GROUP_ASSIGNED: (&str, &str) = (
    "warmstore_group_assigned_partitions",
    "Changelog partitions the consumer group assigned to this process (group mode)",
);
const GROUP_CHANGELOG: (&str, &str) = (
    "warmstore_group_changelog_partitions",
    "Every partition of the changelogs the group shares, which its members should own between them (group mode)",
);
const SINCE_REBALANCE: (&str, &str) = (
    "warmstore_seconds_since_rebalance",
    "Seconds since the consumer group last rebalanced (group mode; absent before the first)",
);

/// The process's own series: what it owns and, in group mode, how the group moves.
fn process_families(board: &Board) -> Vec<MetricFamily> {
    let owned = board
        .partitions()
        .iter()
        .filter(|p| p.state() != PartitionState::Unassigned)
        .count();
    let (name, help) = ASSIGNED_PARTITIONS;
    let mut families = vec![family(
        name,
        help,
        MetricType::GAUGE,
        vec![(None, owned as f64)],
    )];
    let Some(group) = board.group() else {
        return families;
    };
    let (name, help) = REBALANCES;
    let by_kind = RebalanceKind::ALL
        .iter()
        .map(|k| (Some(("kind", k.label())), group.rebalances(*k) as f64))
        .collect();
    families.push(family(name, help, MetricType::COUNTER, by_kind));
    let (name, help) = GROUP_ASSIGNED;
    let assigned = group.assigned.as_ref().map_or(0, Vec::len) as f64;
    families.push(family(
        name,
        help,
        MetricType::GAUGE,
        vec![(None, assigned)],
    ));
    if let Some(total) = group.changelog_partitions {
        let (name, help) = GROUP_CHANGELOG;
        families.push(family(
            name,
            help,
            MetricType::GAUGE,
            vec![(None, total as f64)],
        ));
    }
    if let Some(last) = group.last_rebalance {
        let (name, help) = SINCE_REBALANCE;
        let since = last.elapsed().as_secs_f64();
        families.push(family(name, help, MetricType::GAUGE, vec![(None, since)]));
    }
    families
}

/// The registry behind `/metrics`: the board's families plus the process collector.
pub fn registry(board: Arc<Board>, ready_max_lag: u64) -> Registry {
    let registry = Registry::new();
    let mut descs: Vec<Desc> = Family::ALL
        .iter()
        .map(|f| f.describe())
        .filter_map(|(name, help, extra)| {
            let mut labels: Vec<String> = PARTITION_LABELS.iter().map(|s| s.to_string()).collect();
            labels.extend(extra.map(str::to_string));
            Desc::new(
                name.to_string(),
                help.to_string(),
                labels,
                Default::default(),
            )
            .ok()
        })
        .collect();
    for ((name, help), labels) in [
        (ASSIGNED_PARTITIONS, vec![]),
        (REBALANCES, vec!["kind".to_string()]),
        (GROUP_ASSIGNED, vec![]),
        (GROUP_CHANGELOG, vec![]),
        (SINCE_REBALANCE, vec![]),
    ] {
        descs.extend(Desc::new(name.into(), help.into(), labels, Default::default()).ok());
    }
    descs.extend(
        Desc::new(
            "warmstore_ready".into(),
            "1 when /readyz answers 200".into(),
            vec![],
            Default::default(),
        )
        .ok(),
    );
    descs.extend(
        Desc::new(
            "warmstore_commit_duration_seconds".into(),
            "Store commit latency".into(),
            PARTITION_LABELS.iter().map(|s| s.to_string()).collect(),
            Default::default(),
        )
        .ok(),
    );
    let collector = BoardCollector {
        board,
        ready_max_lag,
        descs,
    };
    if let Err(e) = registry.register(Box::new(collector)) {
        tracing::error!(error = %e, "cannot register warmstore metrics");
    }
    if let Err(e) = registry.register(Box::new(super::process::ProcessMetrics::for_self())) {
        tracing::warn!(error = %e, "cannot register process metrics");
    }
    registry
}

/// The Prometheus text exposition of everything registered.
pub fn render(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buffer) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buffer).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_its_own_name_and_counters_are_the_totals() {
        let names: std::collections::BTreeSet<&str> =
            Family::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), Family::ALL.len());
        for family in Family::ALL {
            assert!(family.name().starts_with("warmstore_"), "{family:?}");
            let counter = family.kind() == MetricType::COUNTER;
            assert_eq!(counter, family.name().ends_with("_total"), "{family:?}");
        }
        assert_eq!(
            Family::ALL
                .iter()
                .filter(|f| f.kind() == MetricType::COUNTER)
                .count(),
            6
        );
    }
}
