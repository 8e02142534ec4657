//! A real Apache Kafka broker (KRaft, one node on loopback) for what librdkafka's mock cluster
//! cannot model: TLS and SASL listeners, transactions with aborts, compaction, large partitions.
//! Started once per test binary, on first use, and killed with it.
//!
//! The jars come from Maven Central through `tests/kafka/pom.xml` (Maven's local repository caches
//! them); certificates are made with `openssl` for each start; the SCRAM user is created when the
//! storage is formatted. docs/testing.md says how to run the same broker by hand.

use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication, TopicResult,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_ports;

pub const SCRAM_USER: &str = "warmstore";
pub const SCRAM_PASSWORD: &str = "scram-secret";
/// A SCRAM user with no ACLs but those a test grants (`Kafka::allow`); every other client of the
/// tests is a super user of the broker's authorizer.
pub const READER_USER: &str = "reader";
pub const READER_PASSWORD: &str = "reader-secret";
/// The password of the client's private key (the TLS listener asks for a client certificate).
pub const CLIENT_KEY_PASSWORD: &str = "client-key-secret";

pub struct Kafka {
    /// `host:port` of each listener.
    pub plaintext: String,
    pub ssl: String,
    pub sasl_ssl: String,
    /// A plaintext listener whose advertised address is `corruptible_proxy`: a test that puts a
    /// proxy there sees every request and response of the clients it bootstraps.
    pub corruptible: String,
    pub corruptible_proxy: String,
    /// Certificates and the broker's data and log.
    pub dir: PathBuf,
}

/// How a client reaches the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Plaintext,
    /// TLS with a client certificate whose key has a password.
    Ssl,
    /// TLS, SASL SCRAM-SHA-512.
    SaslSsl,
    /// The same, as `READER_USER`.
    SaslSslReader,
}

static KAFKA: OnceLock<Kafka> = OnceLock::new();

/// The broker of this test binary, started on first use.
pub fn kafka() -> &'static Kafka {
    KAFKA.get_or_init(Kafka::start)
}

impl Kafka {
    fn start() -> Kafka {
        let classpath = classpath();
        let dir = work_dir();
        make_certificates(&dir);
        let [plaintext, ssl, sasl_ssl, controller, corruptible, proxy] =
            free_ports::<6>().map(|port| format!("127.0.0.1:{port}"));
        let kafka = Kafka {
            plaintext,
            ssl,
            sasl_ssl,
            corruptible,
            corruptible_proxy: proxy,
            dir,
        };
        let properties = kafka.server_properties(&controller);
        std::fs::write(kafka.dir.join("server.properties"), properties).unwrap();
        std::fs::write(kafka.dir.join("log4j2.properties"), log4j(&kafka.dir)).unwrap();
        kafka.format(&classpath);
        kafka.launch(&classpath);
        kafka.wait_ready();
        kafka
    }

    fn server_properties(&self, controller: &str) -> String {
        let d = self.dir.display();
        format!(
            "process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={controller}
listeners=PLAINTEXT://{p},SSL://{s},SASL_SSL://{ss},CONTROLLER://{controller},CORRUPTIBLE://{c}
advertised.listeners=PLAINTEXT://{p},SSL://{s},SASL_SSL://{ss},CORRUPTIBLE://{cp}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,CORRUPTIBLE:PLAINTEXT
log.dirs={d}/data
ssl.keystore.type=PEM
ssl.keystore.location={d}/server-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location={d}/ca.pem
listener.name.ssl.ssl.client.auth=required
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:{SCRAM_USER};User:CN=warmstore
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=200
log.cleaner.dedupe.buffer.size=16777216
",
            p = self.plaintext,
            s = self.ssl,
            ss = self.sasl_ssl,
            c = self.corruptible,
            cp = self.corruptible_proxy,
        )
    }

    fn java(&self, classpath: &str) -> Command {
        let mut java = Command::new("java");
        java.arg("-Xms128m")
            .arg("-Xmx512m")
            .arg("-XX:+UseSerialGC")
            .arg("-XX:TieredStopAtLevel=1")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(classpath);
        java
    }

    fn format(&self, classpath: &str) {
        let output = self
            .java(classpath)
            .args(["kafka.tools.StorageTool", "format", "--standalone"])
            .args(["--cluster-id", "d2FybXN0b3JlLXRlc3RzAA"])
            .arg("--config")
            .arg(self.dir.join("server.properties"))
            .arg("--add-scram")
            .arg(format!(
                "SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"
            ))
            .arg("--add-scram")
            .arg(format!(
                "SCRAM-SHA-512=[name={READER_USER},password={READER_PASSWORD}]"
            ))
            .output()
            .expect("java runs (Java 17; ./x test installs it)");
        assert!(
            output.status.success(),
            "formatting the broker's storage failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts the broker from a thread that lives as long as the test binary: the broker gets
    /// SIGKILL when the thread that started it ends, so it never outlives the tests.
    fn launch(&self, classpath: &str) {
        let mut java = self.java(classpath);
        java.arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(self.dir.join("stdout.log")).unwrap())
            .stderr(std::fs::File::create(self.dir.join("stderr.log")).unwrap());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            java.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let (started, result) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kafka-broker".into())
            .spawn(move || {
                let child = java.spawn();
                let started_ok = child.is_ok();
                started.send(child.map(|c| c.id())).unwrap();
                if started_ok {
                    loop {
                        std::thread::park();
                    }
                }
            })
            .unwrap();
        result
            .recv()
            .unwrap()
            .expect("java runs (Java 17; ./x test installs it)");
    }

    fn wait_ready(&self) {
        let consumer: BaseConsumer = self.client_config(Listener::Plaintext).create().unwrap();
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(m) = consumer.fetch_metadata(None, Duration::from_secs(2)) {
                if !m.brokers().is_empty() {
                    return;
                }
            }
            if Instant::now() > until {
                panic!("the Kafka broker did not start:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The end of the broker's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["broker.log", "stderr.log"] {
            let log = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            text += &lines[lines.len().saturating_sub(40)..].join("\n");
        }
        text
    }

    /// librdkafka properties that reach the broker through `listener`.
    pub fn client_properties(&self, listener: Listener) -> Vec<(String, String)> {
        let file = |name: &str| self.dir.join(name).display().to_string();
        let pairs: Vec<(&str, String)> = match listener {
            Listener::Plaintext => vec![("bootstrap.servers", self.plaintext.clone())],
            Listener::Ssl => vec![
                ("bootstrap.servers", self.ssl.clone()),
                ("security.protocol", "SSL".into()),
                ("ssl.ca.location", file("ca.pem")),
                ("ssl.certificate.location", file("client.pem")),
                ("ssl.key.location", file("client.key")),
                ("ssl.key.password", CLIENT_KEY_PASSWORD.into()),
            ],
            Listener::SaslSsl | Listener::SaslSslReader => {
                let (user, password) = if listener == Listener::SaslSsl {
                    (SCRAM_USER, SCRAM_PASSWORD)
                } else {
                    (READER_USER, READER_PASSWORD)
                };
                vec![
                    ("bootstrap.servers", self.sasl_ssl.clone()),
                    ("security.protocol", "SASL_SSL".into()),
                    ("ssl.ca.location", file("ca.pem")),
                    ("sasl.mechanism", "SCRAM-SHA-512".into()),
                    ("sasl.username", user.into()),
                    ("sasl.password", password.into()),
                ]
            }
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    pub fn client_config(&self, listener: Listener) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("group.id", "warmstore-tests");
        for (key, value) in self.client_properties(listener) {
            config.set(key, value);
        }
        config
    }

    /// Creates a topic with topic-level configs (`cleanup.policy`, `segment.ms`, ...).
    pub fn create_topic(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in configs {
            new = new.set(key, value);
        }
        let (admin, options, runtime) = self.admin();
        all_done(
            "create",
            runtime.block_on(admin.create_topics([&new], &options)),
        );
        self.wait_for_leaders(topic, partitions);
    }

    /// Gives a topic more partitions, `partitions` in all.
    pub fn add_partitions(&self, topic: &str, partitions: i32) {
        let (admin, options, runtime) = self.admin();
        let new = NewPartitions::new(topic, partitions as usize);
        all_done(
            "add partitions",
            runtime.block_on(admin.create_partitions([&new], &options)),
        );
        self.wait_for_leaders(topic, partitions);
    }

    /// Leadership is ready when metadata names a leader for every partition.
    fn wait_for_leaders(&self, topic: &str, partitions: i32) {
        let consumer: BaseConsumer = self.client_config(Listener::Plaintext).create().unwrap();
        super::wait_until("the topic's leaders", Duration::from_secs(30), || {
            consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| leaders(m.topics().iter().find(|t| t.name() == topic)?))
                == Some(partitions as usize)
        });
    }

    /// Deletes a topic, and waits until metadata no longer lists it.
    pub fn delete_topic(&self, topic: &str) {
        let (admin, options, runtime) = self.admin();
        all_done(
            "delete",
            runtime.block_on(admin.delete_topics(&[topic], &options)),
        );
        let consumer: BaseConsumer = self.client_config(Listener::Plaintext).create().unwrap();
        super::wait_until("the topic gone", Duration::from_secs(30), || {
            consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .is_ok_and(|m| m.topics().iter().all(|t| t.error().is_some()))
        });
    }

    /// Allows `user` the ACL operation (READ, DESCRIBE, ...) on a literal resource (TOPIC, GROUP),
    /// as a platform team does with `kafka-acls`. rust-rdkafka has no ACL calls, so Python's
    /// confluent-kafka makes it (./x test installs it with quixstreams).
    pub fn allow(&self, user: &str, operation: &str, resource_type: &str, name: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/allow.py");
        let output = Command::new("python3")
            .arg(script)
            .args([&self.plaintext, user, operation, resource_type, name])
            .output()
            .expect("python3 runs (./x test puts confluent-kafka in target/test-venv)");
        assert!(
            output.status.success(),
            "granting {operation} on {resource_type} {name} to {user}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn admin(
        &self,
    ) -> (
        AdminClient<DefaultClientContext>,
        AdminOptions,
        tokio::runtime::Runtime,
    ) {
        let admin = self
            .client_config(Listener::Plaintext)
            .create()
            .expect("admin client");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (admin, options, runtime)
    }
}

/// Panics unless the broker answered and did `action` to every topic.
fn all_done(action: &str, answer: rdkafka::error::KafkaResult<Vec<TopicResult>>) {
    for result in answer.unwrap_or_else(|e| panic!("no answer to {action} topics: {e}")) {
        if let Err((name, code)) = result {
            panic!("cannot {action} topic {name}: {code}");
        }
    }
}

/// How many of the topic's partitions have a leader; `None` while the topic has an error.
fn leaders(topic: &rdkafka::metadata::MetadataTopic) -> Option<usize> {
    if topic.error().is_some() {
        return None;
    }
    Some(
        topic
            .partitions()
            .iter()
            .filter(|p| p.leader() >= 0)
            .count(),
    )
}

/// The broker's classpath, resolved by Maven once and kept beside the build.
fn classpath() -> String {
    maven_classpath("tests/kafka/pom.xml", "kafka-broker", &[])
}

/// The classpath of the project `pom` (relative to the repository) describes with `properties`
/// set, resolved by Maven once and kept beside the build as `<name>.classpath`.
pub fn maven_classpath(pom: &str, name: &str, properties: &[(&str, &str)]) -> String {
    let pom = Path::new(env!("CARGO_MANIFEST_DIR")).join(pom);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.classpath"));
    let fresh = std::fs::read_to_string(&out).ok().filter(|cp| {
        let newer = |a: &Path, b: &Path| -> bool {
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            modified(a) >= modified(b)
        };
        newer(&out, &pom) && cp.split(':').all(|jar| Path::new(jar).exists())
    });
    if let Some(classpath) = fresh {
        return classpath.trim().to_string();
    }
    let status = Command::new("mvn")
        .args(["-q", "-B", "-f"])
        .arg(&pom)
        .arg("org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath")
        .arg(format!("-Dmdep.outputFile={}", out.display()))
        .args(properties.iter().map(|(k, v)| format!("-D{k}={v}")))
        .status()
        .expect("mvn runs (Maven; ./x test installs it)");
    assert!(
        status.success(),
        "Maven could not resolve {}",
        pom.display()
    );
    std::fs::read_to_string(&out).unwrap().trim().to_string()
}

/// A directory of this process under the build's temporary directory; those of earlier runs whose
/// process is gone are removed.
fn work_dir() -> PathBuf {
    let parent = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kafka-broker");
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for entry in entries.flatten() {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok();
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = parent.join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA, the broker's certificate for 127.0.0.1, a client certificate whose key has a password,
/// and an unrelated CA (`other-ca.pem`) for tests of a wrong trust anchor.
fn make_certificates(dir: &Path) {
    let x509 = |key: &str, cert: &str, subject: &str| {
        openssl(
            dir,
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", key,
                "-out", cert, "-subj", subject,
            ],
        )
    };
    x509("ca.key", "ca.pem", "/CN=warmstore-test-ca");
    x509("other-ca.key", "other-ca.pem", "/CN=some-other-ca");
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    for (name, subject, ext) in [
        ("server", "/CN=localhost", Some("server.ext")),
        ("client", "/CN=warmstore", None),
    ] {
        let key = format!("{name}-plain.key");
        let csr = format!("{name}.csr");
        let cert = format!("{name}.pem");
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ],
        );
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &cert,
        ];
        if let Some(ext) = ext {
            sign.extend(["-extfile", ext]);
        }
        openssl(dir, &sign);
    }
    // Java reads unencrypted PKCS#8 keys in a PEM keystore; the client's key is encrypted, as
    // production keys often are, so `ssl.key.password` is exercised.
    openssl(
        dir,
        &[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-in",
            "server-plain.key",
            "-out",
            "server.key",
        ],
    );
    let keystore = std::fs::read_to_string(dir.join("server.key")).unwrap()
        + &std::fs::read_to_string(dir.join("server.pem")).unwrap();
    std::fs::write(dir.join("server-keystore.pem"), keystore).unwrap();
    let pass = format!("pass:{CLIENT_KEY_PASSWORD}");
    openssl(
        dir,
        &[
            "pkcs8",
            "-topk8",
            "-v2",
            "aes-256-cbc",
            "-in",
            "client-plain.key",
            "-out",
            "client.key",
            "-passout",
            &pass,
        ],
    );
}

fn log4j(dir: &Path) -> String {
    format!(
        "rootLogger.level=INFO
rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName={}/broker.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=%d %p %c{{1}} %m%n
logger.kafka.name=kafka
logger.kafka.level=WARN
logger.apache.name=org.apache.kafka
logger.apache.level=WARN
",
        dir.display()
    )
}
