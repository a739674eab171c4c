//! A Slurm cluster on this machine for the tests: its own munge (key, socket),
//! one `slurmctld` and two `slurmd` (`-N n1`, `-N n2`, `NodeAddr=127.0.0.1`,
//! distinct ports), with config, state, spool and logs under a fresh directory.
//! Each node has its own simulated driver and its own Keling instance
//! (`--instance n1` / `n2`); `gres.conf`'s `File=` are character devices made
//! with `mknod` in the directory (Slurm refuses the simulator's regular files).
//!
//! Every daemon is started in the foreground as our child and stopped by pid
//! when the [`Cluster`] is dropped, then the agents, then the simulators:
//! nothing is left running, mounted or frozen, also when a test failed. Before
//! the daemons stop, every job the cluster ran is cancelled and its steps are
//! given a bounded time to end; whatever is still left of the cluster then (a
//! `slurmstepd`, a job's process: a process whose environment names this
//! cluster's `SLURM_CONF` or `KDEV`) is killed by pid, and said so. Waits poll
//! `sinfo` / `squeue` / `scontrol` with a deadline.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{
    Nvsim,
    agent::{Agent, AgentOptions, cleanup_cgroups_in, wait_for},
    keling_bin, skip,
};

/// What must be installed (`cargo xtask setup` installs it).
const BINARIES: &[&str] = &[
    "/usr/sbin/munged",
    "/usr/sbin/mungekey",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/bin/srun",
    "/usr/bin/sbatch",
    "/usr/bin/scontrol",
];

/// Whether Slurm and munge are installed; records a skip when they are not.
pub fn can_run_slurm(test: &str) -> bool {
    if let Some(missing) = BINARIES.iter().find(|b| !Path::new(b).exists()) {
        skip(
            test,
            &format!("{missing} is not installed: run `cargo xtask setup` (Slurm and munge)"),
        );
        return false;
    }
    true
}

/// The SPANK plugin `cargo xtask build` places next to the `keling` binary.
pub fn spank_plugin() -> PathBuf {
    let bin = keling_bin();
    bin.with_file_name("libkeling_spank.so")
}

/// A daemon we started: SIGTERM, a bounded wait, then SIGKILL, by pid, on drop.
struct Daemon {
    name: String,
    child: Child,
}

impl Daemon {
    fn start(name: &str, cmd: &mut Command, log: &Path) -> Daemon {
        let out = std::fs::File::create(log).expect("daemon log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Daemon {
            name: name.into(),
            child,
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.running() {
            return;
        }
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.running() {
            eprintln!("{} did not stop on SIGTERM: killed", self.name);
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// One node: its simulated driver and its Keling instance (named as the node).
pub struct Node {
    pub name: String,
    /// `None` once a test stopped it ([`Cluster::stop_agent`]).
    pub agent: Option<Agent>,
    pub sim: Nvsim,
    /// The `gres.conf` `File=` devices (`nvidia0`...: 195:N, opened by nothing).
    pub gpu_dir: PathBuf,
}

impl Node {
    pub fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("this node's agent was stopped")
    }

    /// `keling ARGS --instance NAME` against this node's agent.
    pub fn keling(&self, args: &[&str]) -> Output {
        Command::new(keling_bin())
            .args(args)
            .args(["--instance", &self.name])
            .output()
            .unwrap()
    }
}

/// How to build the cluster.
pub struct ClusterOptions {
    /// Simulator arguments per node (its name is `n1`, `n2`...).
    pub nodes: Vec<Vec<String>>,
    /// Extra `keling run` arguments for every node's agent.
    pub agent_args: Vec<String>,
    /// Load the SPANK plugin (`plugstack.conf` names it), with these arguments.
    pub plugin: Option<Vec<String>>,
}

/// The running cluster. Fields drop in order: daemons (after the jobs are
/// cancelled in [`Drop`]), then the agents and simulators, then the directory.
pub struct Cluster {
    /// slurmd per node, then slurmctld, then munged: stopped in that order.
    daemons: Vec<Daemon>,
    pub nodes: Vec<Node>,
    pub dir: PathBuf,
    pub conf: PathBuf,
    /// Every job `sbatch` submitted: cancelled in [`Drop`].
    submitted: Mutex<Vec<u32>>,
}

/// `n` distinct free TCP ports on 127.0.0.1: each is held bound until all are
/// chosen, then all are let go (one at a time, the kernel may give the same
/// port twice: slurmctld then found its port taken by a slurmd).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Cluster {
    /// Starts everything in `dir` (a fresh directory of the test's).
    pub fn start(dir: &Path, opts: ClusterOptions) -> Cluster {
        let started = Instant::now();
        let dir = dir.join("slurm");
        let (munge_dir, sock_dir) = (dir.join("munge"), dir.join("munge-socket"));
        for d in [&munge_dir, &sock_dir, &dir.join("state"), &dir.join("log")] {
            std::fs::create_dir_all(d).unwrap();
        }
        set_mode(&munge_dir, 0o700);
        // munged wants every directory up to its socket searchable by all.
        set_mode(&sock_dir, 0o755);
        let mut p = dir.clone();
        while let Some(parent) = p.parent() {
            set_mode_at_least(&p, 0o711);
            p = parent.to_owned();
        }
        let key = munge_dir.join("munge.key");
        run_ok(
            Command::new("/usr/sbin/mungekey")
                .arg("-c")
                .arg("-k")
                .arg(&key),
        );
        let socket = sock_dir.join("munge.sock");
        let mut cluster = Cluster {
            daemons: Vec::new(),
            nodes: Vec::new(),
            conf: dir.join("slurm.conf"),
            dir: dir.clone(),
            submitted: Mutex::new(Vec::new()),
        };
        // Nodes first: each one's simulator and agent, whose GPUs make gres.conf.
        for (i, sim_args) in opts.nodes.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
            let sim = Nvsim::mount(&sim_args);
            let gpu_dir = dir.join("gpus").join(&name);
            std::fs::create_dir_all(&gpu_dir).unwrap();
            let gpus = sim.state()["gpus"].as_array().unwrap().len();
            for g in 0..gpus {
                mknod_char(&gpu_dir.join(format!("nvidia{g}")), 195, g as u32);
            }
            // The node's own simulated driver, found by the node's name (a job
            // runs `$KDEV/$SLURMD_NODENAME`).
            std::os::unix::fs::symlink(&sim.dir, dir.join(format!("dev-{name}"))).unwrap();
            cleanup_cgroups_in(&format!("keling-{name}"));
            let mut args = vec![
                "--instance".to_string(),
                name.clone(),
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ];
            args.extend(opts.agent_args.iter().cloned());
            // The agent reaches the controller as Slurm's commands do.
            let conf = dir.join("slurm.conf");
            let agent = Agent::start_with(
                &sim,
                AgentOptions {
                    status_interval_s: Some(0),
                    env: vec![("SLURM_CONF", conf.to_str().unwrap())],
                    socket: Some(instance_socket(&name)),
                    // Shard jobs share a GPU by memory: the agent's own defaults.
                    agent_defaults: true,
                    ..AgentOptions {
                        args,
                        ..AgentOptions::default()
                    }
                },
            );
            cluster.nodes.push(Node {
                name,
                agent: Some(agent),
                sim,
                gpu_dir,
            });
        }
        let ports = free_ports(cluster.nodes.len() + 1);
        cluster.write_config(&socket, &ports, opts.plugin.as_deref());
        cluster.daemons.push(Daemon::start(
            "munged",
            Command::new("/usr/sbin/munged")
                .arg("--foreground")
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--socket={}", socket.display()))
                .arg(format!(
                    "--pid-file={}",
                    munge_dir.join("munged.pid").display()
                ))
                .arg(format!(
                    "--log-file={}",
                    munge_dir.join("munged.log").display()
                ))
                .arg(format!("--seed-file={}", munge_dir.join("seed").display())),
            &dir.join("log/munged.out"),
        ));
        wait_for("munged's socket", Duration::from_secs(10), || {
            socket.exists()
        });
        let conf = cluster.conf.clone();
        cluster.daemons.push(Daemon::start(
            "slurmctld",
            Command::new("/usr/sbin/slurmctld")
                .arg("-D")
                .env("SLURM_CONF", &conf),
            &dir.join("log/slurmctld.out"),
        ));
        let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
        for name in &names {
            cluster.daemons.push(Daemon::start(
                &format!("slurmd {name}"),
                Command::new("/usr/sbin/slurmd")
                    .args(["-D", "-N", name])
                    .env("SLURM_CONF", &conf),
                &dir.join(format!("log/slurmd-{name}.out")),
            ));
        }
        // Stopped in the reverse order of their start.
        cluster.daemons.reverse();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = cluster
                .cmd("sinfo")
                .args(["-h", "-N", "-o", "%N %T"])
                .output();
            let text = out
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let idle = text.lines().filter(|l| l.ends_with(" idle")).count();
            if idle == names.len() {
                break;
            }
            if Instant::now() > deadline {
                panic!(
                    "the Slurm nodes are not idle after 30 s (sinfo: {text:?}); logs in {}:\n{}",
                    dir.join("log").display(),
                    cluster.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "slurm cluster up in {} ms ({} nodes)",
            started.elapsed().as_millis(),
            names.len()
        );
        cluster
    }

    /// slurm.conf, gres.conf (from `keling slurm gres`), plugstack.conf.
    fn write_config(&self, munge_socket: &Path, ports: &[u16], plugin: Option<&[String]>) {
        let d = self.dir.display();
        let mut conf = format!(
            "ClusterName=keling-test\n\
             SlurmctldHost=localhost\n\
             SlurmctldPort={ctld}\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={sock}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool-%n\n\
             SlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             GresTypes=gpu,shard\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             JobRequeue=0\n\
             SlurmdParameters=config_overrides\n\
             SchedulerParameters=sched_interval=1\n\
             PlugStackConfig={d}/plugstack.conf\n",
            ctld = ports[0],
            sock = munge_socket.display(),
        );
        let mut gres = String::from("AutoDetect=off\n");
        let mut names = Vec::new();
        for (node, port) in self.nodes.iter().zip(&ports[1..]) {
            std::fs::create_dir_all(self.dir.join(format!("spool-{}", node.name))).unwrap();
            let out = run_ok(Command::new(keling_bin()).args([
                "slurm",
                "gres",
                "--instance",
                &node.name,
                "--node",
                &node.name,
                "--device-dir",
                node.gpu_dir.to_str().unwrap(),
            ]));
            let lines = String::from_utf8(out.stdout).unwrap();
            let (gpus, shards) = gres_counts(&lines);
            gres.push_str(&lines);
            conf.push_str(&format!(
                "NodeName={} Gres=gpu:{gpus},shard:{shards} NodeAddr=127.0.0.1 \
                 NodeHostname=localhost Port={port} CPUs=8 RealMemory=4000\n",
                node.name
            ));
            names.push(node.name.clone());
        }
        conf.push_str(&format!(
            "PartitionName=gpu Nodes={} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
            names.join(",")
        ));
        std::fs::write(&self.conf, conf).unwrap();
        std::fs::write(self.dir.join("gres.conf"), gres).unwrap();
        let plugstack = match plugin {
            Some(args) => {
                let so = spank_plugin();
                assert!(
                    so.exists(),
                    "{} is missing: build with `cargo xtask build`",
                    so.display()
                );
                format!("required {} {}\n", so.display(), args.join(" "))
            }
            None => String::new(),
        };
        std::fs::write(self.dir.join("plugstack.conf"), plugstack).unwrap();
    }

    /// A Slurm command (`srun`, `sbatch`...) against this cluster.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf)
            .env("KDEV", &self.dir)
            .env_remove("SLURM_JOB_ID");
        c
    }

    /// `sbatch --parsable ARGS`: the job id.
    pub fn sbatch(&self, args: &[&str]) -> u32 {
        let out = run_ok(self.cmd("sbatch").arg("--parsable").args(args));
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text
            .trim()
            .split(';')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("sbatch printed {text:?}"));
        if let Ok(mut s) = self.submitted.lock() {
            s.push(id);
        }
        id
    }

    /// `scontrol show job -o ID` as its `Key=Value` fields (the values of
    /// `Comment` and `AdminComment` may hold spaces: they run to the next key).
    pub fn job(&self, id: u32) -> BTreeMap<String, String> {
        let out = self
            .cmd("scontrol")
            .args(["show", "job", "-o", &id.to_string()])
            .output()
            .unwrap();
        parse_fields(&String::from_utf8_lossy(&out.stdout))
    }

    /// A job's state (`RUNNING`, `COMPLETED`...).
    pub fn job_state(&self, id: u32) -> String {
        self.job(id).get("JobState").cloned().unwrap_or_default()
    }

    /// What `squeue` says of the job (`R`, `PD`...), empty once it left.
    pub fn squeue_state(&self, id: u32) -> String {
        let out = self
            .cmd("squeue")
            .args(["-h", "-j", &id.to_string(), "-o", "%T"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits (bounded) until the job is in `state`.
    pub fn wait_job(&self, id: u32, state: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.job_state(id);
            if now == state {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "job {id} is {now:?}, not {state} after {timeout:?}: {:?}\n{}",
                    self.job(id),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The tail of every daemon's log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.dir.join("log"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s.push_str(&format!("== {}\n", e.path().display()));
            for l in tail.into_iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).expect("node")
    }

    /// Stops node `name`'s agent (the node goes on running jobs).
    pub fn stop_agent(&mut self, name: &str) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("node");
        if let Some(mut agent) = node.agent.take() {
            agent.stop();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, while the daemons can still end them: every job sbatch
        // submitted, and any other the queue holds (an `srun` of a test).
        let mut jobs: Vec<String> = self
            .submitted
            .lock()
            .map(|s| s.iter().map(u32::to_string).collect())
            .unwrap_or_default();
        if let Ok(o) = self.cmd("squeue").args(["-h", "-o", "%i"]).output() {
            jobs.extend(
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(String::from),
            );
        }
        jobs.sort();
        jobs.dedup();
        if !jobs.is_empty() {
            let _ = self.cmd("scancel").arg("--full").args(&jobs).output();
        }
        // Gone from the queue, and their steps ended (a slurmstepd outlives its
        // job's line in squeue by a moment): bounded.
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = self.cmd("squeue").args(["-h", "-o", "%i"]).output();
            let queue_empty = out.is_ok_and(|o| o.status.success() && o.stdout.is_empty());
            if queue_empty && self.left_behind(Some("slurmstepd")).is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.daemons.clear();
        for node in &mut self.nodes {
            drop(node.agent.take());
            cleanup_cgroups_in(&format!("keling-{}", node.name));
            let _ = std::fs::remove_dir_all(format!("/run/keling/{}", node.name));
        }
        // Whatever of the cluster is still running now was left behind: killed
        // by pid (a process frozen in a cgroup dies of SIGKILL too).
        let left = self.left_behind(None);
        for &(pid, ref comm) in &left {
            eprintln!("slurm harness: pid {pid} ({comm}) was left behind: killed");
            // SAFETY: a signal to one pid that this cluster started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !left.is_empty()
            && Instant::now() < deadline
            && left
                .iter()
                .any(|(pid, _)| Path::new(&format!("/proc/{pid}")).exists())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Cluster {
    /// The processes of this cluster still running (`comm` only if given), but
    /// this test's own: those whose environment names this cluster's config
    /// (`SLURM_CONF`: slurmd, slurmstepd, every job's process; the agents too,
    /// before they are stopped) or its directory (`KDEV`: what a job ran).
    fn left_behind(&self, comm: Option<&str>) -> Vec<(i32, String)> {
        let marks = [
            format!("SLURM_CONF={}", self.conf.display()).into_bytes(),
            format!("KDEV={}", self.dir.display()).into_bytes(),
        ];
        let me = std::process::id() as i32;
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if pid == me {
                continue;
            }
            let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let name = name.trim();
            if comm.is_some_and(|c| c != name) {
                continue;
            }
            let Ok(env) = std::fs::read(e.path().join("environ")) else {
                continue;
            };
            if env
                .split(|&b| b == 0)
                .any(|v| marks.iter().any(|m| v == m.as_slice()))
            {
                out.push((pid, name.to_owned()));
            }
        }
        out
    }
}

/// The socket of instance `name` (`/run/keling/NAME/keling.sock`).
pub fn instance_socket(name: &str) -> PathBuf {
    Path::new("/run/keling").join(name).join("keling.sock")
}

/// The `gpu` and `shard` counts of a node's `gres.conf` lines.
pub fn gres_counts(lines: &str) -> (u64, u64) {
    let (mut gpus, mut shards) = (0, 0);
    for l in lines.lines() {
        let f = parse_fields(l);
        match f.get("Name").map(String::as_str) {
            Some("gpu") => gpus += 1,
            Some("shard") => {
                shards += f
                    .get("Count")
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0)
            }
            _ => {}
        }
    }
    (gpus, shards)
}

/// `Key=Value Key=Value...` (a value runs to the next ` Key=`).
pub fn parse_fields(line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut key: Option<String> = None;
    let mut value = String::new();
    for word in line.split_whitespace() {
        let starts_key = word.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        });
        if starts_key {
            if let Some(k) = key.take() {
                out.insert(k, std::mem::take(&mut value));
            }
            let (k, v) = word.split_once('=').unwrap();
            key = Some(k.to_owned());
            value = v.to_owned();
        } else if key.is_some() {
            value.push(' ');
            value.push_str(word);
        }
    }
    if let Some(k) = key {
        out.insert(k, value);
    }
    out
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn set_mode_at_least(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(p) {
        let now = m.permissions().mode() & 0o7777;
        if now & mode != mode {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(now | mode));
        }
    }
}

fn mknod_char(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; makedev is a pure computation.
    let r = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_spaces_run_to_the_next_key() {
        let f = parse_fields("JobId=3 AdminComment=keling: over its 2 GiB Requeue=1 X=");
        assert_eq!(f["JobId"], "3");
        assert_eq!(f["AdminComment"], "keling: over its 2 GiB");
        assert_eq!(f["Requeue"], "1");
        assert_eq!(f["X"], "");
        assert_eq!(
            gres_counts(
                "NodeName=n1 Name=gpu File=/dev/nvidia0\nNodeName=n1 Name=shard Count=8 File=/dev/nvidia0\n"
            ),
            (1, 8)
        );
    }
}
