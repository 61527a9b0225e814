//! The examples as the tests read them: YAML documents and paths into them, the Kubernetes
//! objects (the Deployment's container, ports, volumes, security settings), the pod's file
//! system rebuilt from its mounts, what `deploy/image/build.sh` puts in the image, and the
//! descriptors of the Envoy bootstrap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use app_bootstrap::Settings;
use app_bootstrap::config::{self, Sources};
use serde::Deserialize as _;
use serde_norway::Value;

/// What the test writes as the Secret's value: 44 bytes of base64, as the README makes it.
pub(crate) const SUBJECT_SECRET: &str = "ZGVwbG95LWV4YW1wbGUtc3ViamVjdC1zZWNyZXQtMzI=\n";

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every YAML document in `deploy/<dir>`, files in name order, each with its file name.
pub(crate) fn documents(dir: &str) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy").join(dir))
        .unwrap_or_else(|e| panic!("deploy/{dir}: {e}"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML file in deploy/{dir}");
    let mut docs = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a file name")
            .to_owned();
        let text = std::fs::read_to_string(&file).expect("read the example");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("deploy/{dir}/{name} is not YAML: {e}"));
            if !value.is_null() {
                docs.push((name.clone(), value));
            }
        }
    }
    docs
}

/// `v` at `path`: mapping keys and sequence indexes separated by dots
/// (`spec.template.spec.containers.0`); a missing step panics naming the path.
pub(crate) fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, step| {
        let next = match step.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(step),
        };
        next.unwrap_or_else(|| panic!("no {path} (missing {step})"))
    })
}

pub(crate) fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

pub(crate) fn number(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path} is not a whole number"))
}

pub(crate) fn list<'a>(v: &'a Value, path: &str) -> &'a [Value] {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("{path} is not a list"))
}

/// `matchLabels` or a Service selector as a map of strings.
pub(crate) fn labels(v: &Value, path: &str) -> BTreeMap<String, String> {
    at(v, path)
        .as_mapping()
        .unwrap_or_else(|| panic!("{path} is not a mapping"))
        .iter()
        .map(|(k, v)| {
            let s = |x: &Value| x.as_str().expect("a label is a string").to_owned();
            (s(k), s(v))
        })
        .collect()
}

/// The Kubernetes objects of `deploy/kubernetes`.
pub(crate) struct Kube {
    pub(crate) docs: Vec<(String, Value)>,
}

impl Kube {
    pub(crate) fn read() -> Self {
        Self {
            docs: documents("kubernetes"),
        }
    }

    /// The one object of `kind`.
    pub(crate) fn object(&self, kind: &str) -> &Value {
        let found: Vec<&Value> = self
            .docs
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
            .collect();
        assert_eq!(found.len(), 1, "one {kind} in deploy/kubernetes");
        found[0]
    }

    pub(crate) fn deployment(&self) -> &Value {
        self.object("Deployment")
    }

    /// The Deployment's one container.
    pub(crate) fn container(&self) -> &Value {
        let containers = list(self.deployment(), "spec.template.spec.containers");
        assert_eq!(containers.len(), 1, "one container in the pod");
        &containers[0]
    }

    /// The container's ports by name.
    pub(crate) fn container_ports(&self) -> BTreeMap<String, u64> {
        list(self.container(), "ports")
            .iter()
            .map(|p| (text(p, "name").to_owned(), number(p, "containerPort")))
            .collect()
    }

    /// A probe's or a Service's target port, by number or by the container port's name.
    pub(crate) fn resolve_port(&self, port: &Value) -> u64 {
        port.as_u64().unwrap_or_else(|| {
            let name = port.as_str().expect("a port is a number or a name");
            *self
                .container_ports()
                .get(name)
                .unwrap_or_else(|| panic!("no container port named {name}"))
        })
    }

    /// A security setting as Kubernetes applies it: the container's, else the pod's.
    pub(crate) fn security(&self, key: &str) -> &Value {
        self.container()
            .get("securityContext")
            .and_then(|s| s.get(key))
            .or_else(|| at(self.deployment(), "spec.template.spec.securityContext").get(key))
            .unwrap_or_else(|| {
                panic!("securityContext.{key} is set neither on the container nor on the pod")
            })
    }

    /// The pod's volume named `name`.
    pub(crate) fn volume(&self, name: &str) -> &Value {
        list(self.deployment(), "spec.template.spec.volumes")
            .iter()
            .find(|v| text(v, "name") == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    }

    /// The container path of the ConfigMap's `config.toml`, from its volume's mount path.
    pub(crate) fn config_path(&self) -> String {
        let configmap = text(self.object("ConfigMap"), "metadata.name");
        let mount = list(self.container(), "volumeMounts")
            .iter()
            .find(|m| {
                self.volume(text(m, "name"))
                    .get("configMap")
                    .is_some_and(|c| text(c, "name") == configmap)
            })
            .unwrap_or_else(|| panic!("the ConfigMap {configmap} is not mounted"));
        format!(
            "{}/config.toml",
            text(mount, "mountPath").trim_end_matches('/')
        )
    }

    /// The pod's file system under a temporary directory: every mounted ConfigMap key and
    /// Secret item at its container path.
    pub(crate) fn pod(&self) -> Pod {
        let pod = Pod {
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        let configmap = self.object("ConfigMap");
        for m in list(self.container(), "volumeMounts") {
            let dir = pod.path(text(m, "mountPath"));
            let volume = self.volume(text(m, "name"));
            let files: Vec<(String, String)> = if let Some(c) = volume.get("configMap") {
                assert_eq!(text(c, "name"), text(configmap, "metadata.name"));
                let data = at(configmap, "data").as_mapping().expect("data");
                data.iter()
                    .map(|(k, v)| {
                        let s = |x: &Value| x.as_str().expect("a string").to_owned();
                        (s(k), s(v))
                    })
                    .collect()
            } else if volume.get("secret").is_some() {
                list(volume, "secret.items")
                    .iter()
                    .map(|i| (text(i, "path").to_owned(), SUBJECT_SECRET.to_owned()))
                    .collect()
            } else {
                panic!(
                    "volume {} is neither a ConfigMap nor a Secret",
                    text(m, "name")
                );
            };
            for (name, content) in files {
                let file = dir.join(name);
                std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
                std::fs::write(&file, content).expect("write a mounted file");
            }
        }
        pod
    }
}

/// A pod's file system, rooted in a temporary directory.
pub(crate) struct Pod {
    dir: tempfile::TempDir,
}

impl Pod {
    /// Where the container's absolute `path` is in this tree.
    pub(crate) fn path(&self, path: &str) -> PathBuf {
        self.dir.path().join(path.trim_start_matches('/'))
    }

    /// The Deployment's `args` with every absolute path moved into this tree.
    pub(crate) fn args(&self, kube: &Kube) -> Vec<String> {
        list(kube.container(), "args")
            .iter()
            .map(|a| a.as_str().expect("an argument is a string"))
            .map(|a| {
                if a.starts_with('/') {
                    self.path(a).display().to_string()
                } else {
                    a.to_owned()
                }
            })
            .collect()
    }

    /// The ConfigMap's configuration, read by the app's loader where the pod has it.
    pub(crate) fn settings(&self, kube: &Kube) -> Settings {
        config::load(&Sources {
            file: Some(self.path(&kube.config_path())),
            // No APP_ variable of the machine running the test.
            env: Some(Vec::new()),
        })
        .unwrap_or_else(|e| panic!("the ConfigMap's config.toml:\n{e}"))
    }
}

/// What `deploy/image/build.sh` puts in the image.
pub(crate) struct Image {
    /// `rate-limit:<workspace version>`, the default tag.
    pub(crate) tag: String,
    pub(crate) cmd: Vec<String>,
    pub(crate) user: (u64, u64),
    pub(crate) exposed: BTreeSet<u64>,
}

pub(crate) fn image() -> Image {
    let script = std::fs::read_to_string(root().join("deploy/image/build.sh")).expect("build.sh");
    let line = |prefix: &str| {
        script
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("build.sh has no line {prefix}..."))
            .trim()
            .to_owned()
    };
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml is TOML");
    let version = manifest["workspace"]["package"]["version"]
        .as_str()
        .expect("the workspace version");
    let tag = line("TAG=${1:-");
    let user = line("USER ");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    Image {
        tag: tag
            .strip_suffix('}')
            .expect("TAG=${1:-...}")
            .replace("$VERSION", version),
        cmd: serde_json::from_str(&line("CMD ")).expect("CMD is a JSON array"),
        user: (uid.parse().expect("a uid"), gid.parse().expect("a gid")),
        exposed: line("EXPOSE ")
            .split_whitespace()
            .map(|p| p.parse().expect("a port"))
            .collect(),
    }
}

/// The Envoy bootstrap of `deploy/envoy`.
pub(crate) fn envoy() -> Value {
    documents("envoy")
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d.get("static_resources").is_some())
        .expect("an Envoy bootstrap in deploy/envoy")
}

/// The bootstrap's HTTP connection manager and its ratelimit filter.
pub(crate) fn ratelimit_filter(bootstrap: &Value) -> (&Value, &Value) {
    let hcm = at(
        bootstrap,
        "static_resources.listeners.0.filter_chains.0.filters.0",
    );
    let filter = list(hcm, "typed_config.http_filters")
        .iter()
        .find(|f| text(f, "name") == "envoy.filters.http.ratelimit")
        .expect("the ratelimit filter");
    (hcm, filter)
}

/// The descriptors the Envoy route's `rate_limits` produce, as rule entries
/// (`remote_address`, `tenant`), and the filter's domain.
pub(crate) fn envoy_descriptors(bootstrap: &Value) -> (String, BTreeSet<Vec<String>>) {
    let (hcm, filter) = ratelimit_filter(bootstrap);
    let mut descriptors = BTreeSet::new();
    for host in list(hcm, "typed_config.route_config.virtual_hosts") {
        for route in list(host, "routes") {
            for limit in list(route, "route.rate_limits") {
                let entries = list(limit, "actions")
                    .iter()
                    .map(
                        |a| match (a.get("remote_address"), a.get("request_headers")) {
                            (Some(_), _) => "remote_address".to_owned(),
                            (_, Some(h)) => text(h, "descriptor_key").to_owned(),
                            _ => panic!("an action this test does not know: {a:?}"),
                        },
                    )
                    .collect();
                descriptors.insert(entries);
            }
        }
    }
    (text(filter, "typed_config.domain").to_owned(), descriptors)
}
