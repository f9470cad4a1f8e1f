//! The Kubernetes manifests of a fleet (`deploy/kubernetes/`) and its image
//! (`deploy/Dockerfile`), checked without a cluster:
//!
//! - every document against the API schemas of two Kubernetes releases ([`KUBERNETES`]) by
//!   `kubernetes-validate --strict` (PyPI, pinned in `scripts/kubernetes-validate.sh`, which
//!   makes `target/kubernetes-venv`): wrong types and unknown fields refused, and a kind the
//!   validator has no schema for (a removed API version) a failure too. Broken manifests must
//!   fail the same check, which shows that it runs;
//! - what no schema says, on the documents as the venv's PyYAML reads them: selectors that
//!   select their pods, probes on ports that exist, requests and limits, the etcd members'
//!   names, the command lines of the node and the gateway;
//! - `kustomization.yaml` names exactly the other files (and `kubectl kustomize` builds it,
//!   when kubectl is installed);
//! - what Rampart needs, by text (the workspace has no YAML parser): the node DaemonSet
//!   privileged on the host's network with its host paths, the gateway unprivileged, one
//!   image for both, the image's packages and binaries.
//!
//! Without the venv, the tests that need it print `skipped: <reason>`. Nothing here talks
//! to a cluster.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Kubernetes releases whose schemas every manifest must pass: the newest the pinned
/// validator knows, and an older one still found on clusters.
const KUBERNETES: [&str; 2] = ["1.30", "1.37"];

/// The Debian packages the node's image must install (what the daemon runs and what the
/// `base` template shows of the machine's `/usr`).
const RUNTIME_PACKAGES: [&str; 19] = [
    "e2fsprogs",
    "util-linux",
    "bash",
    "coreutils",
    "python3",
    "python-is-python3",
    "curl",
    "git",
    "ncurses-bin",
    "sudo",
    "ca-certificates",
    "procps",
    "iproute2",
    "libnss-myhostname",
    "nftables",
    "openssl",
    "mmdebstrap",
    "xfsprogs",
    "runsc",
];

fn dir() -> PathBuf {
    support::workspace().join("deploy/kubernetes")
}

fn python() -> PathBuf {
    support::venv_python("RAMPART_KUBERNETES_VENV", "kubernetes-venv")
}

fn skip() -> Option<String> {
    support::venv_lacks(
        &python(),
        "kubernetes_validate, yaml",
        "scripts/kubernetes-validate.sh makes it",
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The manifests: every `*.yaml` of `deploy/kubernetes/` but `kustomization.yaml`, sorted.
fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml" || x == "yml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir().display());
    files
}

/// A line without its comment and surrounding blanks (the manifests put no `#` in values).
fn bare(line: &str) -> &str {
    let line = if line.trim_start().starts_with('#') {
        ""
    } else {
        line.split(" #").next().unwrap_or_default()
    };
    line.trim()
}

/// The documents of a YAML stream: split at `---` lines, those with nothing but comments
/// left out (as YAML readers do).
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().unwrap();
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.retain(|d| d.lines().any(|l| !bare(l).is_empty()));
    docs
}

/// The bare lines of a document.
fn lines(doc: &str) -> Vec<&str> {
    doc.lines().map(bare).filter(|l| !l.is_empty()).collect()
}

/// The one document of `deploy/kubernetes/<file>` whose kind is `kind`.
fn document(file: &str, kind: &str) -> String {
    let found: Vec<String> = documents(&read(&dir().join(file)))
        .into_iter()
        .filter(|d| d.lines().any(|l| l == format!("kind: {kind}")))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{file}: want one {kind}, found {}",
        found.len()
    );
    found.into_iter().next().unwrap()
}

/// The values of the `key: value` lines of a document.
fn values<'a>(doc: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}: ");
    lines(doc)
        .into_iter()
        .filter_map(|l| {
            l.strip_prefix("- ")
                .unwrap_or(l)
                .strip_prefix(prefix.as_str())
        })
        .map(|v| v.trim_matches('"'))
        .collect()
}

/// What `kubernetes-validate` said of some files.
struct Report {
    status: std::process::ExitStatus,
    /// Resources that passed, once per release.
    passed: usize,
    /// The documents times the releases: what `passed` must be.
    expected: usize,
    /// Every line that is not a pass: warnings (no schema for a kind), errors, tracebacks.
    complaints: Vec<String>,
    output: String,
}

impl Report {
    fn clean(&self) -> bool {
        self.status.success() && self.complaints.is_empty() && self.passed == self.expected
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kubernetes-validate {}: {} of {} document checks passed\n{}",
            self.status, self.passed, self.expected, self.output
        )
    }
}

/// Runs the venv's `kubernetes-validate --strict` on `files` against each of [`KUBERNETES`].
fn validate(files: &[PathBuf]) -> Report {
    let tool = python().with_file_name("kubernetes-validate");
    let mut cmd = Command::new(&tool);
    cmd.arg("--strict");
    for k in KUBERNETES {
        cmd.args(["--kubernetes-version", k]);
    }
    let out = cmd
        .args(files)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", tool.display()));
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = output
        .lines()
        .filter(|l| l.starts_with("INFO ") && l.contains(" passed for resource "))
        .count();
    let complaints = output
        .lines()
        .filter(|l| !l.starts_with("INFO ") && !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    let docs: usize = files.iter().map(|f| documents(&read(f)).len()).sum();
    Report {
        status: out.status,
        passed,
        expected: docs * KUBERNETES.len(),
        complaints,
        output,
    }
}

/// Every document of `files` as the venv's PyYAML reads it, as JSON.
fn load(files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(python())
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]\n\
             print(json.dumps(docs))",
        ])
        .args(files)
        .stdin(Stdio::null())
        .output()
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "PyYAML could not read the manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("PyYAML's JSON")
}

/// `kubectl kustomize deploy/kubernetes`'s output; `None` (and says so) without kubectl.
fn kustomize() -> Option<Vec<u8>> {
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(dir())
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("kubectl kustomize not run ({e}): the kustomize build is not checked");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/kubernetes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

#[test]
fn kustomization_names_exactly_the_manifests() {
    let text = read(&dir().join("kustomization.yaml"));
    let mut listed = Vec::new();
    let mut in_resources = false;
    for line in text.lines() {
        let l = bare(line);
        if l.is_empty() {
            continue;
        }
        if !line.starts_with(' ') && !line.starts_with('-') {
            in_resources = l == "resources:";
            continue;
        }
        if in_resources {
            let item = l.strip_prefix("- ").expect("a resources item");
            listed.push(item.trim_matches('"').to_owned());
        }
    }
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        listed_set.len(),
        "a file listed twice: {listed:?}"
    );
    let files: BTreeSet<String> = manifests()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed_set, files,
        "kustomization.yaml's resources must name exactly the other manifests"
    );

    // Built by kustomize (kubectl's own) when kubectl is on this machine: every document
    // comes out.
    if let Some(built) = kustomize() {
        let built = documents(&String::from_utf8_lossy(&built)).len();
        let ours: usize = manifests().iter().map(|f| documents(&read(f)).len()).sum();
        assert_eq!(built, ours, "kubectl kustomize's output has every document");
        eprintln!("kubectl kustomize: {built} documents");
    }
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let files = manifests();
    let report = validate(&files);
    assert!(report.clean(), "{report}");
    eprintln!("{report}");

    // And as kustomize renders them, when kubectl is here.
    if let Some(built) = kustomize() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("built.yaml");
        std::fs::write(&file, built).unwrap();
        let report = validate(&[file]);
        assert!(report.clean(), "kustomize's output: {report}");
        eprintln!(
            "kustomize's output: {} document checks passed",
            report.passed
        );
    }
}

/// A manifest that passes, for the broken variants below to differ from by one change.
const GOOD: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: example
  namespace: rampart
spec:
  replicas: 2
  selector:
    matchLabels:
      app: example
  template:
    metadata:
      labels:
        app: example
    spec:
      containers:
        - name: example
          image: rampart:0.1.0
          securityContext:
            privileged: false
";

/// An API version Kubernetes removed (1.25): the validator has no schema for it and only
/// warns, with exit status 0.
const REMOVED_API: &str = "\
apiVersion: policy/v1beta1
kind: PodDisruptionBudget
metadata:
  name: example
spec:
  minAvailable: 1
  selector:
    matchLabels:
      app: example
";

#[test]
fn kubernetes_validate_rejects_broken_manifests() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let good = validate(&[write("good.yaml", GOOD)]);
    assert!(good.clean(), "the unbroken manifest must pass: {good}");

    // (file, text, what the validator's message must name, whether its exit status fails)
    let cases = [
        (
            "replicas-two.yaml",
            GOOD.replace("replicas: 2", "replicas: \"two\""),
            "spec.replicas",
            true,
        ),
        (
            "unknown-field.yaml",
            GOOD.replace("privileged: false", "privilidged: false"),
            "privilidged",
            true,
        ),
        (
            "removed-api.yaml",
            REMOVED_API.to_owned(),
            "policy/v1beta1",
            false,
        ),
    ];
    for (name, text, names, exit_fails) in cases {
        let report = validate(&[write(name, &text)]);
        eprintln!("--- {name} ---\n{report}");
        assert!(!report.clean(), "{name} must be rejected: {report}");
        assert!(
            report.complaints.iter().any(|c| c.contains(names)),
            "{name}: the complaint names {names:?}: {report}"
        );
        assert_eq!(
            !report.status.success(),
            exit_fails,
            "{name}: exit status {}",
            report.status
        );
    }
}

/// Whether every label of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// `Kind/name` of a document, for messages.
fn what(d: &Value) -> String {
    format!(
        "{}/{}",
        d["kind"].as_str().unwrap_or("?"),
        d["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The workloads (Deployments, DaemonSets, StatefulSets) among `docs`.
fn workloads(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| {
            ["Deployment", "DaemonSet", "StatefulSet"]
                .iter()
                .any(|k| d["kind"] == *k)
        })
        .collect()
}

/// The workloads whose pods `selector` (a set of labels) selects.
fn selected<'a>(workloads: &[&'a Value], selector: &Value) -> Vec<&'a Value> {
    workloads
        .iter()
        .copied()
        .filter(|w| selects(selector, &w["spec"]["template"]["metadata"]["labels"]))
        .collect()
}

/// The names of the ports of a workload's containers.
fn port_names(workload: &Value) -> Vec<&Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().unwrap().iter().map(|p| &p["name"]))
        .collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no env {name} in {}", container["name"]))
}

#[test]
fn the_manifests_hold_together() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let docs = load(&manifests());
    let all = workloads(&docs);

    for d in &docs {
        let what = what(d);
        if d["kind"] != "Namespace" {
            assert_eq!(d["metadata"]["namespace"], "rampart", "{what}");
        }
        let part_of = &d["metadata"]["labels"]["app.kubernetes.io/part-of"];
        assert_eq!(part_of, "rampart", "{what}");
        match d["kind"].as_str().unwrap() {
            "Deployment" | "DaemonSet" | "StatefulSet" => {
                let spec = &d["spec"];
                let labels = &spec["template"]["metadata"]["labels"];
                let selector = &spec["selector"]["matchLabels"];
                assert!(selects(selector, labels), "{what}: its selector");
                let pod = &spec["template"]["spec"];
                assert_eq!(pod["automountServiceAccountToken"], false, "{what}");
                assert_eq!(pod["enableServiceLinks"], false, "{what}: RAMPART_*");
                let ports = port_names(d);
                for c in pod["containers"].as_array().unwrap() {
                    let mine = c["image"].as_str().unwrap().starts_with("rampart:");
                    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                        let get = &c[probe]["httpGet"];
                        assert!(
                            ports.contains(&&get["port"]),
                            "{what}: {probe} on port {}, not a port of the pod",
                            get["port"]
                        );
                        if mine {
                            assert_eq!(get["path"], "/health", "{what}: {probe}");
                        }
                    }
                    for side in ["requests", "limits"] {
                        for r in ["cpu", "memory"] {
                            let v = &c["resources"][side][r];
                            assert!(!v.is_null(), "{what}: {side}.{r}");
                        }
                    }
                }
            }
            "Service" => {
                let chosen = selected(&all, &d["spec"]["selector"]);
                assert_eq!(chosen.len(), 1, "{what} selects one workload's pods");
                let ports = port_names(chosen[0]);
                for p in d["spec"]["ports"].as_array().unwrap() {
                    let target = &p["targetPort"];
                    assert!(ports.contains(&target), "{what}: target port {target}");
                }
            }
            "PodDisruptionBudget" => {
                let chosen = selected(&all, &d["spec"]["selector"]["matchLabels"]);
                assert_eq!(chosen.len(), 1, "{what} selects one workload's pods");
            }
            "NetworkPolicy" => {
                // An empty podSelector selects every pod of the namespace.
                let sel = &d["spec"]["podSelector"]["matchLabels"];
                if !sel.is_null() {
                    assert_eq!(selected(&all, sel).len(), 1, "{what} selects one workload");
                }
            }
            _ => {}
        }
    }

    // etcd: the members the StatefulSet makes are the ones the initial cluster and the
    // fleet's endpoints name.
    let etcd = named(&docs, "StatefulSet", "etcd");
    let service = etcd["spec"]["serviceName"].as_str().unwrap();
    let headless = named(&docs, "Service", service);
    assert_eq!(
        headless["spec"]["clusterIP"], "None",
        "{service} is headless"
    );
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(etcd["spec"]["podManagementPolicy"], "Parallel");
    let replicas = etcd["spec"]["replicas"].as_u64().unwrap();
    assert_eq!(replicas, 3);
    let members: Vec<String> = (0..replicas).map(|i| format!("etcd-{i}")).collect();
    let c = &etcd["spec"]["template"]["spec"]["containers"][0];
    let initial = env(c, "ETCD_INITIAL_CLUSTER")["value"].as_str().unwrap();
    let want: Vec<String> = members
        .iter()
        .map(|m| format!("{m}=http://{m}.{service}:2380"))
        .collect();
    assert_eq!(initial, want.join(","));
    assert_eq!(
        env(c, "ETCD_INITIAL_ADVERTISE_PEER_URLS")["value"],
        format!("http://$(POD_NAME).{service}:2380")
    );
    let endpoints = named(&docs, "ConfigMap", "rampart-fleet")["data"]["endpoints"]
        .as_str()
        .unwrap();
    let want: Vec<String> = members
        .iter()
        .map(|m| format!("http://{m}.{service}:2379"))
        .collect();
    assert_eq!(endpoints, want.join(","), "the fleet's endpoints");
    let pdb = named(&docs, "PodDisruptionBudget", "rampart-etcd");
    assert_eq!(pdb["spec"]["minAvailable"], 2);

    // The node: the documented command line, its name and address from the downward API.
    let node = named(&docs, "DaemonSet", "rampart-node");
    let pod = &node["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(strings(&c["command"]), ["/usr/local/bin/rampart"]);
    assert_eq!(
        strings(&c["args"]),
        [
            "serve",
            "--listen",
            "0.0.0.0:3000",
            "--data-dir",
            "/var/lib/rampart",
            "--fleet",
            "$(FLEET_ENDPOINTS)",
            "--node-name",
            "$(NODE_NAME)",
            "--advertise",
            "http://$(HOST_IP):3000",
        ]
    );
    assert_eq!(
        env(c, "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(
        env(c, "HOST_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    assert_eq!(
        env(c, "FLEET_ENDPOINTS")["valueFrom"]["configMapKeyRef"]["name"],
        "rampart-fleet"
    );
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        pod["dnsPolicy"], "ClusterFirstWithHostNet",
        "etcd's names from the host network"
    );
    assert_ne!(pod["hostPID"], true);
    assert_eq!(c["securityContext"]["privileged"], true);
    let mut host_paths = BTreeSet::new();
    for v in pod["volumes"].as_array().unwrap() {
        let path = v["hostPath"]["path"].as_str().expect("host paths only");
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == v["name"])
            .unwrap_or_else(|| panic!("volume {} is not mounted", v["name"]));
        assert_eq!(
            mount["mountPath"], path,
            "mounted where it is on the machine"
        );
        assert_eq!(
            mount["readOnly"] == true,
            path == "/lib/modules",
            "{path} read-only"
        );
        let kind = if path == "/var/lib/rampart" {
            "DirectoryOrCreate"
        } else {
            "Directory"
        };
        assert_eq!(v["hostPath"]["type"], kind, "{path}");
        host_paths.insert(path);
    }
    assert_eq!(
        host_paths,
        BTreeSet::from(["/var/lib/rampart", "/sys/fs/cgroup", "/dev", "/lib/modules"])
    );

    // The gateway: its command line, the admin key from the Secret, and nothing privileged.
    let gw = named(&docs, "Deployment", "rampart-gateway");
    assert_eq!(gw["spec"]["replicas"], 2);
    let pod = &gw["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        strings(&c["args"]),
        [
            "gateway",
            "--listen",
            "0.0.0.0:8080",
            "--fleet",
            "$(FLEET_ENDPOINTS)",
            "--data-dir",
            "/var/lib/rampart-gateway",
            "--admin-key-file",
            "/etc/rampart/admin-key",
        ]
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    assert_ne!(pod["hostNetwork"], true);
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let key = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "rampart-admin")
        .expect("the Secret rampart-admin is a volume");
    assert_eq!(key["secret"]["items"][0]["key"], "admin-key");
    assert_eq!(key["secret"]["items"][0]["path"], "admin-key");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == key["name"])
        .expect("the admin key is mounted");
    assert_eq!(mount["mountPath"], "/etc/rampart");
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        assert!(
            v["hostPath"].is_null(),
            "the gateway mounts nothing of the machine"
        );
    }
    let svc = named(&docs, "Service", "rampart-gateway");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    let target = &svc["spec"]["ports"][0]["targetPort"];
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| &p["name"] == target)
        .expect("the Service's target port is the gateway's");
    assert_eq!(port["containerPort"], 8080);
}

#[test]
fn the_node_is_privileged_on_the_host_network_and_the_gateway_is_not() {
    let node = document("node.yaml", "DaemonSet");
    let node_lines = lines(&node);
    for want in [
        "hostNetwork: true",
        "privileged: true",
        "dnsPolicy: ClusterFirstWithHostNet",
        "fieldPath: spec.nodeName",
        "fieldPath: status.hostIP",
        "type: DirectoryOrCreate",
    ] {
        assert!(node_lines.contains(&want), "node.yaml's DaemonSet: {want}");
    }
    assert!(
        !node_lines.contains(&"hostPID: true"),
        "node.yaml: no hostPID"
    );
    let paths = values(&node, "path");
    for want in [
        "/var/lib/rampart",
        "/sys/fs/cgroup",
        "/dev",
        "/lib/modules",
        "/health",
    ] {
        assert!(paths.contains(&want), "node.yaml: path {want}");
    }

    let gateway = document("gateway.yaml", "Deployment");
    let gateway_lines = lines(&gateway);
    assert!(
        !gateway_lines.contains(&"privileged: true"),
        "the gateway is never privileged"
    );
    for want in [
        "privileged: false",
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "drop: [\"ALL\"]",
        "secretName: rampart-admin",
        "- /etc/rampart/admin-key",
        "emptyDir:",
    ] {
        assert!(
            gateway_lines.contains(&want),
            "gateway.yaml's Deployment: {want}"
        );
    }
    assert!(
        !gateway_lines
            .iter()
            .any(|l| l.starts_with("host") || l.starts_with("- host")),
        "the gateway uses nothing of the machine (hostNetwork, hostPath, ...)"
    );

    // One image for the node and the gateway, tagged with this workspace's version; etcd's
    // pinned to a release.
    let mine = format!("rampart:{}", env!("CARGO_PKG_VERSION"));
    for (what, doc) in [("node.yaml", &node), ("gateway.yaml", &gateway)] {
        let images = values(doc, "image");
        assert!(!images.is_empty(), "{what}: no image");
        assert!(
            images.iter().all(|i| *i == mine),
            "{what}: {images:?}, want {mine}"
        );
    }
    let etcd = document("etcd.yaml", "StatefulSet");
    let etcd = values(&etcd, "image");
    assert_eq!(etcd.len(), 1);
    let tag = etcd[0]
        .strip_prefix("quay.io/coreos/etcd:v")
        .unwrap_or_else(|| panic!("etcd's image from the etcd project: {}", etcd[0]));
    assert!(
        tag.split('.').count() == 3 && tag.split('.').all(|n| n.parse::<u32>().is_ok()),
        "etcd's image pinned to a release tag: {}",
        etcd[0]
    );
}

#[test]
fn the_image_has_the_binaries_and_packages_the_node_needs() {
    let text = read(&support::workspace().join("deploy/Dockerfile"));
    // Continuation lines joined: one instruction a line.
    let joined = text.replace("\\\n", " ");
    let instructions: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = instructions
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(froms[0].contains("bookworm"), "{}", froms[0]);
    assert!(
        froms[1].starts_with("FROM debian:bookworm-slim"),
        "{}",
        froms[1]
    );
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let build = instructions
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build");
    let w = words(build);
    for want in [
        "--release",
        "--locked",
        "-p rampart-cli",
        "-p rampart-agent",
        "-p rampart-jail",
    ] {
        assert!(
            w.windows(want.split(' ').count())
                .any(|x| x.join(" ") == want),
            "the build: {want} in {build}"
        );
    }
    let runtime = joined.split("FROM debian:bookworm-slim").nth(1).unwrap();
    let installs: Vec<String> = runtime
        .lines()
        .filter(|l| l.contains("apt-get install"))
        .flat_map(words)
        .collect();
    for p in RUNTIME_PACKAGES {
        assert!(
            installs.iter().any(|w| w == p),
            "the runtime image installs {p}"
        );
    }
    for bin in ["rampart", "rampart-jailer", "rampart-agent"] {
        assert!(
            runtime
                .lines()
                .any(|l| l.trim_start().starts_with("COPY --from=")
                    && l.contains(&format!("/release/{bin} "))
                    && l.trim_end().ends_with("/usr/local/bin/")),
            "the runtime image has {bin} in /usr/local/bin"
        );
    }
}
