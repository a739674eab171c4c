//! deploy/: the systemd unit, the Kubernetes manifests, the Prometheus scrape
//! config and the example config, each checked for what the agent needs. Every
//! `keling run` command line in them is parsed with the agent's own argument
//! definitions, and every config is parsed by the agent's config parser, so they
//! cannot drift from the binary.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use clap::Args as _;
use keling_agent::os::proc::ProcessFacts;
use keling_agent::{cmd::run::RunArgs, sched::config::Config};
use serde::Deserialize as _;
use serde_yaml::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("deploy/{file}: {e}"))
}

/// Parses `keling run ARGS` as the binary would; panics with clap's message.
fn parse_run_args(args: &[String]) -> clap::ArgMatches {
    let cmd = RunArgs::augment_args(clap::Command::new("run").no_binary_name(true));
    cmd.try_get_matches_from(args)
        .unwrap_or_else(|e| panic!("`keling run {}` does not parse: {e}", args.join(" ")))
}

/// The rule a process in `cgroup` gets under `config`, and whether it is managed.
fn rule_for(config: &Config, cgroup: &str) -> (Option<String>, Option<u8>, bool) {
    let facts = ProcessFacts {
        comm: "python3".into(),
        uid: Some(1000),
        cgroup: Some(cgroup.into()),
        ..ProcessFacts::default()
    };
    let (settings, managed) = config.settings_for(&facts);
    (settings.rule, settings.priority, managed)
}

const GUARANTEED: &str = "/kubepods.slice/kubepods-pod0b9f0a1e_58a3_4bc2_9f71_3f2a1c6e2a11.slice/cri-containerd-4f1c.scope";
const BURSTABLE: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d3c.slice/cri-containerd-9a2b.scope";
const BESTEFFORT: &str = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod11aa.slice/cri-containerd-77e0.scope";
const SLURM: &str = "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0";

#[test]
fn systemd_unit_verifies_and_runs_the_agent_as_it_needs() {
    let unit = read("systemd/keling.service");
    let line = |key: &str| -> String {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
            .to_owned()
    };
    let exec = line("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/keling"));
    let args: Vec<String> = words
        .filter(|w| *w != "$KELING_ARGS")
        .map(str::to_owned)
        .collect();
    assert_eq!(args[0], "run");
    let m = parse_run_args(&args[1..]);
    let sched_log = m.get_one::<PathBuf>("sched_log").expect("a scheduling log");
    let input_log = m.get_one::<PathBuf>("input_log").expect("an input log");
    // Both logs under the directory systemd makes for it.
    assert_eq!(line("LogsDirectory"), "keling");
    for log in [sched_log, input_log] {
        assert!(log.starts_with("/var/log/keling"), "{}", log.display());
    }
    // SIGTERM to the agent alone, so it thaws before anything else is killed.
    assert_eq!(line("KillMode"), "mixed");
    assert_eq!(line("Restart"), "always");
    assert_eq!(line("LimitMEMLOCK"), "infinity");
    assert!(unit.contains("ConditionPathExists=/sys/fs/cgroup/cgroup.controllers"));

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        keling_tests::skip(
            "systemd_unit_verifies",
            "no systemd-analyze: the unit was parsed but not verified",
        );
        return;
    }
    // systemd-analyze checks that ExecStart is executable: point it at one.
    let dir = keling_tests::tempdir();
    let copy = dir.join("keling.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/keling", "/bin/true")).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("keling.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
    // And it does catch a bad line (so the check above means something).
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/keling", "/bin/true")
            .replace("KillMode=mixed", "KillMode=bogus"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn documents(file: &str) -> Vec<Value> {
    let text = read(file);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("deploy/{file}: {e}")))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes/keling.yaml"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s:?}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn daemonset_is_privileged_with_host_pids_and_the_mounts_the_agent_needs() {
    let docs = documents("kubernetes/keling.yaml");
    let ds = kind(&docs, "DaemonSet");
    assert_eq!(ds["apiVersion"], "apps/v1");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"], true,
        "the agent sees and signals every process"
    );
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["securityContext"]["privileged"], true);

    // The command runs `keling run` in the host's cgroup namespace, with flags
    // the agent accepts.
    let command = strs(&c["command"]);
    assert_eq!(command[0], "nsenter");
    assert!(command.contains(&"--cgroup=/proc/1/ns/cgroup".to_owned()));
    assert!(command.last().unwrap().ends_with("/keling"));
    let args = strs(&c["args"]);
    assert_eq!(args[0], "run");
    let m = parse_run_args(&args[1..]);
    let config_path = m.get_one::<PathBuf>("config").expect("--config").clone();

    // Every host path the agent needs, mounted where the agent looks for it.
    let volumes = pod["volumes"].as_sequence().unwrap();
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let mount_of = |host: &str| -> (String, bool, Option<String>) {
        let v = volumes
            .iter()
            .find(|v| v["hostPath"]["path"] == host)
            .unwrap_or_else(|| panic!("no hostPath volume for {host}"));
        let name = v["name"].as_str().unwrap();
        let m = mounts
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("volume {name} ({host}) is not mounted"));
        (
            m["mountPath"].as_str().unwrap().to_owned(),
            m["readOnly"] == true,
            v["hostPath"]["type"].as_str().map(str::to_owned),
        )
    };
    for (host, writable) in [
        ("/sys/kernel/btf", false),
        ("/sys/kernel/tracing", true),
        ("/sys/kernel/debug", true),
        ("/sys/fs/cgroup", true),
        ("/dev", true),
        ("/run/keling", true),
    ] {
        let (at, read_only, _) = mount_of(host);
        assert_eq!(at, host, "{host} must be where the agent looks for it");
        if writable {
            assert!(!read_only, "{host} must be writable");
        }
    }
    let (proc_at, _, _) = mount_of("/proc");
    assert_ne!(
        proc_at, "/proc",
        "the container's own /proc stays (hostPID shows every process in it)"
    );
    // The control socket, lock and stopped list are the host's (so `keling
    // status` on the host reaches the agent, and one agent runs per node).
    let (_, _, run_type) = mount_of("/run/keling");
    assert_eq!(run_type.as_deref(), Some("DirectoryOrCreate"));
    // The default instance (no `--instance`): socket and lock default to
    // /run/keling/keling.sock and /run/keling/keling.lock when not given.
    assert!(
        !args.iter().any(|a| a.starts_with("--instance")),
        "{args:?}"
    );
    for (flag, default) in [
        ("socket", "/run/keling/keling.sock"),
        ("lock", "/run/keling/keling.lock"),
    ] {
        let path = m
            .get_one::<PathBuf>(flag)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(default));
        assert!(
            path.starts_with("/run/keling"),
            "--{flag} {}",
            path.display()
        );
    }
    // Logs on the host, for replay and report.
    let (logs_at, _, _) = mount_of("/var/log/keling");
    for flag in ["sched_log", "input_log"] {
        assert!(
            m.get_one::<PathBuf>(flag).unwrap().starts_with(&logs_at),
            "{flag}"
        );
    }

    // The metrics port.
    let ports = c["ports"].as_sequence().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["containerPort"] == 9475 && p["name"] == "metrics"),
        "{ports:?}"
    );

    // The config comes from the ConfigMap, mounted where --config points, and
    // parses; its rules adopt pods by cgroup path.
    let cm = kind(&docs, "ConfigMap");
    let config_mount = mounts
        .iter()
        .find(|m| m["name"] == "config")
        .expect("the config mount");
    let file = config_path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        Path::new(config_mount["mountPath"].as_str().unwrap()).join(file),
        config_path
    );
    let toml = cm["data"][file]
        .as_str()
        .expect("the config file in the ConfigMap");
    let config =
        Config::parse(toml).unwrap_or_else(|(line, e)| panic!("ConfigMap {file}:{line}: {e}"));
    assert_eq!(
        rule_for(&config, GUARANTEED),
        (Some("k8s-guaranteed".into()), Some(3), true)
    );
    assert_eq!(
        rule_for(&config, BURSTABLE),
        (Some("k8s-burstable".into()), Some(6), true)
    );
    assert_eq!(
        rule_for(&config, BESTEFFORT),
        (Some("k8s-besteffort".into()), Some(12), true)
    );
    assert!(
        !rule_for(&config, "/user.slice/user-1000.slice").2,
        "not a pod: not managed"
    );
    // Everything is in one namespace.
    for d in &docs[1..] {
        assert_eq!(
            d["metadata"]["namespace"],
            kind(&docs, "Namespace")["metadata"]["name"]
        );
    }
}

#[test]
fn example_config_parses_and_matches_pods_and_slurm_jobs_by_cgroup() {
    let config = Config::parse(&read("keling.toml"))
        .unwrap_or_else(|(line, e)| panic!("deploy/keling.toml:{line}: {e}"));
    assert_eq!(
        rule_for(&config, GUARANTEED).0.as_deref(),
        Some("k8s-guaranteed")
    );
    assert_eq!(
        rule_for(&config, BURSTABLE).0.as_deref(),
        Some("k8s-burstable")
    );
    assert_eq!(
        rule_for(&config, BESTEFFORT).0.as_deref(),
        Some("k8s-besteffort")
    );
    assert_eq!(
        rule_for(&config, SLURM),
        (Some("slurm".into()), Some(10), true)
    );
    let (rule, priority, managed) = rule_for(&config, "/system.slice/cron.service");
    assert_eq!((rule, priority, managed), (None, Some(8), false));
}

#[test]
fn prometheus_scrapes_the_daemonset_and_the_hosts_on_9475() {
    let docs = documents("prometheus/scrape.yml");
    assert_eq!(docs.len(), 1);
    let jobs = docs[0]["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    let job = |name: &str| {
        jobs.iter()
            .find(|j| j["job_name"] == name)
            .unwrap_or_else(|| panic!("no scrape job {name}"))
    };
    let ds = job("keling");
    let sd = &ds["kubernetes_sd_configs"][0];
    assert_eq!(sd["role"], "pod");
    // The namespace and label the DaemonSet has.
    let k8s = documents("kubernetes/keling.yaml");
    let namespace = kind(&k8s, "Namespace")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(strs(&sd["namespaces"]["names"]), [namespace]);
    let relabel = ds["relabel_configs"].as_sequence().unwrap();
    let keep_label = relabel
        .iter()
        .find(|r| {
            strs(&r["source_labels"]) == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
        })
        .expect("keeps the DaemonSet's pods");
    assert_eq!(keep_label["action"], "keep");
    assert_eq!(
        keep_label["regex"],
        kind(&k8s, "DaemonSet")["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    );
    for name in ["keling", "keling-hosts"] {
        let port_set = job(name)["relabel_configs"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|r| {
                r["target_label"] == "__address__"
                    && r["replacement"]
                        .as_str()
                        .is_some_and(|s| s.ends_with(":9475"))
            });
        assert!(port_set, "{name} scrapes port 9475");
    }
    assert!(job("keling-hosts")["file_sd_configs"][0]["files"].is_sequence());
}
