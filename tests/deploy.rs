//! Shipping artifacts, each checked with a real tool: the Helm CLI (lint, render) and
//! kubernetes-validate on the chart, warmstore's own config check on the config the chart renders,
//! promtool on the alert rules and their unit tests, and a real Prometheus evaluating every
//! dashboard and alert expression against a running warmstore.

mod common;

use common::{runtime, service_config, store, wait_until, Broker, Prometheus};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use warmstore::config::{Assignment, GroupConfig, DEFAULT_KEEP_UNASSIGNED};
use warmstore::observe::status::PartitionState;
use warmstore::service::Service;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Helm's own linter, strict (warnings fail too), with the default values (plus the one value a
/// user must give) and with every option on.
#[test]
fn helm_lint_strict_passes_with_default_and_all_options() {
    for args in [
        vec!["--set", "image.repository=registry.example.com/warmstore"],
        vec!["-f", "helm/warmstore/ci/all-options-values.yaml"],
    ] {
        let out = Command::new("helm")
            .args(["lint", "--strict"])
            .arg(repo("helm/warmstore"))
            .args(args.iter().map(|a| {
                if a.ends_with(".yaml") {
                    repo(a).display().to_string()
                } else {
                    a.to_string()
                }
            }))
            .output()
            .expect("helm is installed (./x test builds it into target/tools/bin)");
        assert!(
            out.status.success(),
            "helm lint --strict {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_config_the_chart_renders_is_accepted() {
    for values in [
        "helm/warmstore/values.yaml",
        "helm/warmstore/ci/all-options-values.yaml",
    ] {
        let text = std::fs::read_to_string(repo(values)).unwrap();
        let parsed: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let config = serde_yaml::to_string(&parsed["config"]).unwrap();
        assert_warmstore_accepts(&config, values);
    }
}

/// `warmstore check-config` accepts `config`, with the bootstrap servers from the environment as
/// the chart passes them.
fn assert_warmstore_accepts(config: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warmstore.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .args(["check-config", "--config", path.to_str().unwrap()])
        .env("WARMSTORE_BOOTSTRAP_SERVERS", "kafka:9092")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}\n{config}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_the_chart_ships_the_same_rules() {
    promtool(&["check", "rules"], "dashboards/alerts.yaml");
    assert_eq!(
        std::fs::read_to_string(repo("dashboards/alerts.yaml")).unwrap(),
        std::fs::read_to_string(repo("helm/warmstore/files/alerts.yaml")).unwrap(),
        "helm/warmstore/files/alerts.yaml must be a copy of dashboards/alerts.yaml"
    );
}

/// Every alert has a series that fires it and one that must not (dashboards/alerts_test.yaml).
#[test]
fn every_alert_passes_its_promtool_unit_tests() {
    promtool(&["test", "rules"], "dashboards/alerts_test.yaml");
    let tests = std::fs::read_to_string(repo("dashboards/alerts_test.yaml")).unwrap();
    for rule in rule_field("alert") {
        assert!(
            tests.contains(&format!(
                "alertname: {rule}\n        exp_alerts:\n          - "
            )),
            "{rule} has no test in which it fires"
        );
    }
}

/// Runs promtool on a file of the repository and asserts it succeeds.
fn promtool(args: &[&str], file: &str) {
    let out = Command::new("promtool")
        .args(args)
        .arg(repo(file))
        .output()
        .expect("promtool is installed (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool {args:?} {file}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One field (`alert`, `expr`) of every rule in dashboards/alerts.yaml.
fn rule_field(field: &str) -> Vec<String> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo("dashboards/alerts.yaml")).unwrap())
            .unwrap();
    rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r[field].as_str().unwrap().to_string())
        .collect()
}

/// Grafana variables replaced by what the test's Prometheus holds.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$__range", "1h")
        .replace("$cluster", ".*")
        .replace("$job", "warmstore")
        .replace("$namespace", "test")
        .replace("$pod", "warmstore-0")
        .replace("$store", "obs")
        .replace("$partition", ".*")
}

/// Series that Kubernetes serves, not warmstore: the kubelet's volume stats (the state volume's
/// fill) and cAdvisor's container memory (what the memory limit sees). The test has no kubelet, so
/// a dashboard expression reading them must parse and evaluate, but cannot return data.
const KUBERNETES_METRICS: [&str; 3] = [
    "kubelet_volume_stats_used_bytes",
    "kubelet_volume_stats_capacity_bytes",
    "container_memory_working_set_bytes",
];

fn reads_kubernetes_metrics(expr: &str) -> bool {
    KUBERNETES_METRICS.iter().any(|m| expr.contains(m))
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(repo("dashboards/warmstore.json")).unwrap())
        .unwrap()
}

/// Every panel of the dashboard, those inside collapsed rows included; rows themselves are not
/// panels that query.
fn dashboard_panels(dashboard: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            panels.extend(panel["panels"].as_array().into_iter().flatten().cloned());
        } else {
            panels.push(panel.clone());
        }
    }
    panels
}

/// Every PromQL expression of the dashboard: panel targets, and the selectors inside the template
/// variables' `label_values(...)` queries.
fn dashboard_expressions() -> Vec<String> {
    let dashboard = dashboard();
    let mut exprs = Vec::new();
    for panel in dashboard_panels(&dashboard) {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = var["definition"].as_str() {
            let inner = query
                .trim_start_matches("label_values(")
                .trim_end_matches(')');
            let selector = inner.rsplit_once(',').map_or(inner, |(s, _)| s);
            exprs.push(selector.to_string());
        }
    }
    exprs
}

/// What a platform team looks for first: the rows, the pod in every legend, Ready in red and
/// green, state as words in a table of instant queries, and the resource panels.
#[test]
fn the_dashboard_has_the_rows_legends_and_panels_an_operator_needs() {
    let dashboard = dashboard();
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            "Overview",
            "Group",
            "Restore progress",
            "Lag",
            "Store health",
            "Resources"
        ]
    );
    let panels = dashboard_panels(&dashboard);
    let titled = |title: &str| {
        panels
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title}"))
            .clone()
    };
    for panel in &panels {
        for target in panel["targets"].as_array().unwrap() {
            if let Some(legend) = target["legendFormat"].as_str() {
                // A figure of the whole group belongs to no pod: its legend names the job.
                let whole_group = target["expr"]
                    .as_str()
                    .unwrap()
                    .contains("warmstore_group_changelog_partitions");
                let wanted = if whole_group { "{{job}}" } else { "{{pod}}" };
                assert!(legend.contains(wanted), "{}: {legend}", panel["title"]);
            } else {
                assert_eq!(target["format"], "table", "{}", panel["title"]);
            }
        }
    }
    let ready = titled("Ready");
    let mapped = &ready["fieldConfig"]["defaults"]["mappings"][0]["options"];
    assert_eq!(mapped["0"]["color"], "red");
    assert_eq!(mapped["1"]["color"], "green");

    let table = titled("Partitions");
    for target in table["targets"].as_array().unwrap() {
        assert_eq!(
            (&target["format"], &target["instant"]),
            (&"table".into(), &true.into())
        );
    }
    let state = table["fieldConfig"]["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["matcher"]["options"] == "state")
        .expect("the state column has an override")
        .to_string();
    for s in PartitionState::ALL {
        assert!(
            state.contains(&format!("\"{}\"", s.label())),
            "{s:?} unmapped: {state}"
        );
    }
    for title in [
        "CPU",
        "Memory",
        "State volume used",
        "Restarts",
        "Assigned partitions",
        "Unowned changelog partitions",
        "Since last rebalance",
        "Rebalances",
    ] {
        titled(title);
    }
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(
        variables.contains(&"cluster") && variables.contains(&"job"),
        "{variables:?}"
    );
}

/// The chart ships the dashboard file as it is, and renders it as valid JSON in a ConfigMap the
/// Grafana sidecar picks up.
#[test]
fn the_chart_ships_the_dashboard_for_the_grafana_sidecar() {
    let shipped = std::fs::read_to_string(repo("helm/warmstore/files/warmstore.json")).unwrap();
    assert_eq!(
        std::fs::read_to_string(repo("dashboards/warmstore.json")).unwrap(),
        shipped,
        "helm/warmstore/files/warmstore.json must be a copy of dashboards/warmstore.json"
    );
    let image = "image.repository=registry.example.com/warmstore";
    let (ok, off, err) = helm_template(&[image]);
    assert!(ok, "{err}");
    assert!(!off.contains("grafana_dashboard"), "off by default: {off}");
    let (ok, out, err) = helm_template(&[image, "dashboard.enabled=true"]);
    assert!(ok, "{err}");
    let configmap = out
        .split("\n---")
        .find(|doc| doc.contains("name: ws-warmstore-dashboard"))
        .expect("the dashboard ConfigMap");
    let doc: serde_yaml::Value = serde_yaml::from_str(configmap).unwrap();
    assert_eq!(doc["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = doc["data"]["warmstore.json"].as_str().unwrap();
    let rendered: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(rendered, dashboard());
}

#[test]
fn every_dashboard_and_alert_expression_evaluates_against_real_data() {
    // The real broker: in group mode the service joins its group coordinator.
    let mut broker = Broker::real(&[]);
    broker.create_topic("dash", 2);
    broker.produce_changelog("dash", 2, 300, 31);
    let dir = tempfile::tempdir().unwrap();
    let mut config = service_config(
        &broker.bootstrap,
        &dir.path().join("state"),
        vec![store("obs", "dash", None)],
        &[],
    );
    // In group mode, so the group's panels have data too; the others show the same either way.
    config.assignment = Assignment::Group(GroupConfig {
        group_id: "dash-standby".to_string(),
        instance_id: None,
        keep_unassigned: DEFAULT_KEEP_UNASSIGNED,
    });
    let dashboard = dashboard_expressions();
    assert!(dashboard.len() >= 30, "{dashboard:?}");
    let rules = rule_field("expr");
    assert_eq!(rules.len(), 9);
    let rt = runtime();
    rt.block_on(async {
        let service = Service::start(&config).await.unwrap();
        let target = service.http_addr.to_string();
        let s = &service;
        tokio::task::block_in_place(|| {
            wait_until("catch-up", Duration::from_secs(60), || {
                let p = s.board.partitions();
                p.len() == 2 && p.iter().all(|p| p.state() == PartitionState::CaughtUp)
            });
            let prom = Prometheus::start(dir.path(), &target);
            // Enough scrapes for rate() over the substituted 10 s window.
            wait_until("12 s of samples", Duration::from_secs(60), || {
                prom.query_scalar("count_over_time(warmstore_ready[1m])")
                    .is_some_and(|n| n >= 12.0)
            });
            let mut empty = Vec::new();
            for expr in &dashboard {
                let answer = prom.query(&substitute(expr));
                assert_eq!(answer["status"], "success", "{expr}: {answer}");
                if !reads_kubernetes_metrics(expr)
                    && answer["data"]["result"]
                        .as_array()
                        .is_none_or(Vec::is_empty)
                {
                    empty.push(expr.clone());
                }
            }
            assert!(
                empty.is_empty(),
                "dashboard expressions without data: {empty:#?}"
            );
            for expr in &rules {
                let answer = prom.query(expr);
                assert_eq!(answer["status"], "success", "{expr}: {answer}");
            }
        });
        service.stop().await;
    });
}

/// `helm template` with the real Helm CLI (`./x test` builds it from the Go module proxy):
/// (succeeded, manifests, stderr).
fn helm_template(set: &[&str]) -> (bool, String, String) {
    helm_template_for("1.31.0", None, set)
}

/// `helm template` for a Kubernetes version (a `go install` build of Helm assumes 1.20 unless
/// told), with an optional values file.
fn helm_template_for(kube: &str, values: Option<&str>, set: &[&str]) -> (bool, String, String) {
    let mut helm = Command::new("helm");
    helm.args(["template", "ws"])
        .arg(repo("helm/warmstore"))
        .args(["--kube-version", kube]);
    if let Some(values) = values {
        helm.arg("-f").arg(repo(values));
    }
    for value in set {
        helm.args(["--set", value]);
    }
    let out = helm
        .output()
        .expect("helm is installed (./x test builds it into target/tools/bin)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_chart_renders_what_the_user_asked_for() {
    let image = "image.repository=registry.example.com/warmstore";

    // No public image exists: the render says how to get one instead of an ImagePullBackOff.
    let (ok, _, err) = helm_template(&[]);
    assert!(!ok && err.contains("image.repository is required"), "{err}");

    // One port drives the Service, the container, the probes and warmstore's listen address.
    let (ok, out, err) = helm_template(&[image, "service.port=8080"]);
    assert!(ok, "{err}");
    assert!(out.contains("listen: 0.0.0.0:8080"), "{out}");
    assert!(out.contains("containerPort: 8080"), "{out}");
    assert!(!out.contains("9464"), "the old port is gone: {out}");
    let (ok, _, err) = helm_template(&[image, "config.http.listen=0.0.0.0:9000"]);
    assert!(!ok && err.contains("set service.port instead"), "{err}");

    // No disruption budget over a single pod; with two, restoring pods never block a drain.
    let (_, one, _) = helm_template(&[image]);
    assert!(!one.contains("kind: PodDisruptionBudget"), "{one}");
    assert!(one.contains("fsGroupChangePolicy: OnRootMismatch"), "{one}");
    assert!(one.contains("whenDeleted: Retain"), "{one}");
    let (_, two, _) = helm_template(&[image, "replicaCount=2"]);
    assert!(two.contains("kind: PodDisruptionBudget"), "{two}");
    assert!(
        two.contains("unhealthyPodEvictionPolicy: AlwaysAllow"),
        "{two}"
    );
    assert!(two.contains("maxUnavailable: 1"), "{two}");
    let (_, min, _) = helm_template(&[
        image,
        "replicaCount=3",
        "podDisruptionBudget.minAvailable=2",
    ]);
    assert!(
        min.contains("minAvailable: 2") && !min.contains("maxUnavailable"),
        "{min}"
    );

    // The alerts see only this release's series, and link to the runbook where the user keeps it.
    let (_, rules, _) = helm_template(&[
        image,
        "prometheusRule.enabled=true",
        "prometheusRule.runbookBaseUrl=https://wiki.example.com/runbook",
    ]);
    assert!(
        rules.contains(r#"up{job="ws-warmstore-metrics", namespace="default"} == 0"#),
        "{rules}"
    );
    assert!(!rules.contains(r#"job="warmstore""#), "{rules}");
    assert!(
        rules.contains("https://wiki.example.com/runbook#warmstorestorewiped"),
        "{rules}"
    );

    // A typo anywhere fails the render, where warmstore would refuse it at start (exit 2 and a
    // crash loop) or Helm would ignore it.
    let (ok, _, err) = helm_template(&[image, "config.restore.comit_interval=10s"]);
    assert!(!ok && err.contains("comit_interval"), "{err}");
    let (ok, _, err) = helm_template(&[image, "replicacount=3"]);
    assert!(!ok && err.contains("replicacount"), "{err}");

    // A digest pins the image.
    let digest = format!("image.digest=sha256:{}", "ab".repeat(32));
    let (_, pinned, _) = helm_template(&[image, &digest]);
    assert!(
        pinned.contains(&format!(
            "image: \"registry.example.com/warmstore@sha256:{}\"",
            "ab".repeat(32)
        )),
        "{pinned}"
    );
}

#[test]
fn the_config_the_chart_renders_with_another_port_is_accepted() {
    let (ok, out, err) = helm_template(&[
        "image.repository=registry.example.com/warmstore",
        "service.port=8080",
    ]);
    assert!(ok, "{err}");
    let config_map = out
        .split("\n---")
        .find(|doc| doc.contains("kind: ConfigMap"))
        .expect("a ConfigMap");
    let doc: serde_yaml::Value = serde_yaml::from_str(config_map).unwrap();
    let config = doc["data"]["warmstore.yaml"].as_str().unwrap();
    assert_warmstore_accepts(config, "the config rendered with service.port=8080");
}

/// Both renders (defaults, every option on) pass strict schema validation for the oldest and newest
/// Kubernetes versions the chart is checked against. The Prometheus Operator's kinds have no schema
/// there and are skipped with a warning.
#[test]
fn every_render_passes_strict_kubernetes_validation() {
    let dir = tempfile::tempdir().unwrap();
    for kube in ["1.29.0", "1.31.0"] {
        for (name, values, set) in [
            (
                "defaults",
                None,
                vec!["image.repository=registry.example.com/warmstore"],
            ),
            (
                "all-options",
                Some("helm/warmstore/ci/all-options-values.yaml"),
                vec![],
            ),
        ] {
            let (ok, manifests, err) = helm_template_for(kube, values, &set);
            assert!(ok, "{name} for {kube}: {err}");
            let file = dir.path().join(format!("{name}-{kube}.yaml"));
            std::fs::write(&file, &manifests).unwrap();
            let out = kubernetes_validate(kube, &file);
            assert!(
                out.status.success(),
                "{name} for {kube}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // The validator does reject what Kubernetes would: an unknown field in the StatefulSet.
    let (_, manifests, _) = helm_template(&["image.repository=registry.example.com/warmstore"]);
    let broken = manifests.replacen("  serviceName:", "  servicename:", 1);
    assert_ne!(broken, manifests);
    let file = dir.path().join("broken.yaml");
    std::fs::write(&file, broken).unwrap();
    assert!(!kubernetes_validate("1.31.0", &file).status.success());
}

/// docs/kafka-streams.md's worked example: valid Kubernetes, and a config warmstore accepts.
#[test]
fn the_kafka_streams_init_container_example_is_valid() {
    let path = repo("deploy/examples/kafka-streams-init-container.yaml");
    let out = kubernetes_validate("1.31.0", &path);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let config_map = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "ConfigMap")
        .expect("the example has a ConfigMap");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("warmstore.yaml");
    std::fs::write(
        &config,
        config_map["data"]["warmstore.yaml"].as_str().unwrap(),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn kubernetes_validate(kube: &str, file: &Path) -> std::process::Output {
    Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", kube])
        .arg(file)
        .output()
        .expect("kubernetes-validate is installed (./x test puts it in target/test-venv)")
}

/// The chart's schema for `config` is the one warmstore generates from its config types, so the
/// two cannot drift. `WARMSTORE_BLESS=1` writes the generated one into the chart.
#[test]
fn the_chart_config_schema_is_the_one_warmstore_generates() {
    let out = Command::new(env!("CARGO_BIN_EXE_warmstore"))
        .arg("config-schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut generated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    generated.as_object_mut().unwrap().remove("$schema");
    let path = repo("helm/warmstore/values.schema.json");
    let mut chart: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    if std::env::var_os("WARMSTORE_BLESS").is_some() {
        chart["properties"]["config"] = generated.clone();
        let text = serde_json::to_string_pretty(&chart).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
    }
    assert_eq!(
        chart["properties"]["config"], generated,
        "helm/warmstore/values.schema.json differs from `warmstore config-schema`; regenerate it with \
         WARMSTORE_BLESS=1 cargo test --release --test deploy the_chart_config_schema"
    );
}

/// The `warmstore.yaml` of a render's ConfigMap.
fn rendered_config(out: &str) -> String {
    let doc = out
        .split("\n---")
        .find(|doc| doc.contains("warmstore.yaml:"))
        .expect("the config ConfigMap");
    let doc: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
    doc["data"]["warmstore.yaml"].as_str().unwrap().to_string()
}

/// More than one replica shares the partitions through a consumer group named after the release,
/// with each pod's name as its static instance id; one replica, or `mode: all`, restores everything.
#[test]
fn replicas_share_partitions_through_a_group_named_after_the_release() {
    let image = "image.repository=registry.example.com/warmstore";
    let (ok, one, err) = helm_template(&[image]);
    assert!(ok, "{err}");
    assert!(!rendered_config(&one).contains("assignment"), "{one}");
    let (ok, three, err) = helm_template(&[image, "replicaCount=3"]);
    assert!(ok, "{err}");
    let config = rendered_config(&three);
    let parsed: serde_yaml::Value = serde_yaml::from_str(&config).unwrap();
    assert_eq!(parsed["assignment"]["mode"], "group", "{config}");
    assert_eq!(
        parsed["assignment"]["group_id"], "default-ws-warmstore",
        "{config}"
    );
    assert_warmstore_accepts(&config, "three replicas");
    assert!(
        three.contains("name: WARMSTORE_INSTANCE_ID") && three.contains("fieldPath: metadata.name"),
        "{three}"
    );
    let (_, all, _) = helm_template(&[image, "replicaCount=3", "config.assignment.mode=all"]);
    let config = rendered_config(&all);
    assert!(
        config.contains("mode: all") && !config.contains("group_id"),
        "{config}"
    );
    assert_warmstore_accepts(&config, "three full copies");
    let (ok, two_copies, err) = helm_template_for(
        "1.31.0",
        Some("deploy/examples/helm-two-warm-copies.yaml"),
        &[],
    );
    assert!(ok, "{err}");
    let config = rendered_config(&two_copies);
    assert!(config.contains("group_id: wordcount-standby"), "{config}");
    assert_warmstore_accepts(&config, "deploy/examples/helm-two-warm-copies.yaml");
}
