//! Keling under Slurm: real munge, slurmctld and two slurmd on this machine
//! (`keling_tests::slurm`), each node with its own simulated driver and its own
//! Keling instance (`--instance n1` / `n2`), the SPANK plugin loaded through
//! `plugstack.conf`, real eBPF. The cluster is started once and the phases run
//! in turn against it (a start costs seconds; each phase says its wall time).
//! The truth is the simulator's (memory per process), the kernel's (cgroup
//! freezes) and Slurm's (`squeue`, `scontrol show job`).
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use keling_agent::control::{SlurmRef, StatusReply, TaskStatus};
use keling_sched::WaitReason;
use keling_tests::{
    Fixture,
    agent::{frozen, progress, wait_for},
    gpu_workload_bin,
    slurm::{Cluster, ClusterOptions, can_run_slurm},
};
use serde_json::Value;

const GIB: u64 = 1 << 30;

/// Runs one phase, saying how long it took.
fn phase(name: &str, f: impl FnOnce()) {
    let t = Instant::now();
    eprintln!("== phase: {name}");
    f();
    eprintln!("== phase: {name}: {} ms", t.elapsed().as_millis());
}

/// A batch script running the busy workload on its node's simulated driver
/// (`$KDEV/dev-$SLURMD_NODENAME`), holding `mib` MiB, its progress in `progress`.
fn busy_script(progress: &Path, mib: u64) -> String {
    format!(
        "exec {} --dev-dir $KDEV/dev-$SLURMD_NODENAME --scenario busy --iterations 100000000 \
         --alloc-mib {mib} --progress {}",
        gpu_workload_bin().display(),
        progress.display()
    )
}

/// The Keling task of Slurm job `job` in `status`.
fn slurm_task(status: StatusReply, job: u32) -> Option<TaskStatus> {
    status
        .tasks
        .into_iter()
        .find(|t| t.slurm.is_some_and(|s| s.job == job) && t.exit_code.is_none())
}

/// The simulator's video bytes charged to `pid` on GPU `gpu` (the simulator's
/// state file, not Keling's reply: raw JSON).
fn truth_bytes(state: &Value, pid: u64, gpu: u64) -> u64 {
    state["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["pid"] == pid)
        .flat_map(|p| p["gpus"].as_array().cloned().unwrap_or_default())
        .filter(|g| g["gpu"] == gpu)
        .map(|g| g["bytes"].as_u64().unwrap_or(0))
        .sum()
}

/// `GET /metrics` of an agent (its address is in its ready line).
fn scrape(agent: &keling_tests::agent::Agent) -> String {
    use std::io::{Read, Write};
    let addr = agent
        .stderr()
        .iter()
        .find_map(|l| {
            let rest = l.split_once("metrics http://")?.1;
            Some(rest.split('/').next()?.to_owned())
        })
        .expect("the agent says where /metrics is");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn slurm_jobs_run_under_keling() {
    let Some(fx) = Fixture::needs("slurm_jobs_run_under_keling")
        .cgroups()
        .check(can_run_slurm)
        .ready()
    else {
        return;
    };
    let started = Instant::now();
    let sim = vec![
        "--gpus".to_string(),
        "1".into(),
        "--mem-per-gpu".into(),
        (8 * GIB).to_string(),
    ];
    let mut cluster = Cluster::start(
        &fx.dir,
        ClusterOptions {
            nodes: vec![sim.clone(), sim],
            // The agents' defaults: a GPU runs every task whose budget (its
            // shards) fits.
            agent_args: vec!["--slurm-report".into()],
            plugin: Some(Vec::new()),
        },
    );
    let dir = fx.dir.clone();
    phase("a shard step runs", || a_shard_step_runs(&cluster));
    phase("two shard jobs share a GPU as Keling tasks", || {
        two_shard_jobs_share_a_gpu(&cluster, &dir)
    });
    phase("a job over its shards is ended, the reason told", || {
        a_job_over_its_shards_is_ended(&cluster, &dir)
    });
    phase(
        "a higher --gpu-priority preempts, squeue sees nothing",
        || gpu_priority_preempts(&cluster, &dir),
    );
    phase(
        "memory outside Slurm's jobs sends shard jobs elsewhere",
        || memory_outside_slurm_sends_jobs_elsewhere(&cluster, &dir),
    );
    phase(
        "memory pressure on n1's GPU sends shard jobs elsewhere while it lasts",
        || memory_pressure_sends_jobs_elsewhere(&cluster, &dir),
    );
    phase("a node whose agent is down runs jobs, told once", || {
        agent_down_runs_jobs_told_once(&mut cluster, &dir)
    });
    eprintln!(
        "slurm_jobs_run_under_keling: {} ms in all",
        started.elapsed().as_millis()
    );
}

/// The harness works: a step with shards of a GPU runs to completion.
fn a_shard_step_runs(cluster: &Cluster) {
    let out = cluster
        .cmd("srun")
        .args([
            "--gres=shard:2",
            "-w",
            "n1",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES $SLURM_SHARDS_ON_NODE",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "srun: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        cluster.logs()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0 2");
}

/// Two jobs given shards of one GPU run at once, each a Keling task with its
/// Slurm job, its budget (its shards) and its priority; the memory each holds
/// is the simulator's, and `keling status` shows it.
fn two_shard_jobs_share_a_gpu(cluster: &Cluster, dir: &Path) {
    let n1 = cluster.node("n1");
    let (p1, p2) = (dir.join("share-1"), dir.join("share-2"));
    let (o1, o2) = (dir.join("share-1.out"), dir.join("share-2.out"));
    let j1 = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:2",
        "--gpu-priority=6",
        "-o",
        o1.to_str().unwrap(),
        "--wrap",
        &busy_script(&p1, 1024),
    ]);
    let j2 = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:3",
        // The same priority: under memory sharing a higher one that works
        // freezes a lower one on its GPU (tested below); equals run side by side.
        "--gpu-priority=6",
        "-o",
        o2.to_str().unwrap(),
        "--wrap",
        &busy_script(&p2, 2048),
    ]);
    for (j, p) in [(j1, &p1), (j2, &p2)] {
        wait_for(&format!("job {j} to work"), Duration::from_secs(30), || {
            progress(p) > 0
        });
    }
    let expect = [(j1, 6, 2 * GIB, 1024 << 20), (j2, 6, 3 * GIB, 2048 << 20)];
    // Both progress at the same time: neither is frozen behind the other.
    let (a, b) = (progress(&p1), progress(&p2));
    wait_for(
        "both jobs to progress at once",
        Duration::from_secs(10),
        || progress(&p1) > a + 20 && progress(&p2) > b + 20,
    );
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = n1.agent().status_reply();
        let state = n1.sim.state();
        let mut ok = true;
        last.clear();
        for (job, priority, budget, held) in expect {
            let Some(t) = slurm_task(status.clone(), job) else {
                ok = false;
                last.push_str(&format!("job {job}: no task; "));
                continue;
            };
            assert_eq!(t.priority, priority, "job {job}: {t:?}");
            assert_eq!(t.mem_quota_bytes, Some(budget), "job {job}'s budget: {t:?}");
            assert_eq!(t.gpu, Some(0), "job {job}: {t:?}");
            assert_eq!(
                t.slurm.map(|s| s.step),
                Some(SlurmRef::BATCH_STEP),
                "the batch step: {t:?}"
            );
            let truth = truth_bytes(&state, t.pid.into(), 0);
            let ours = t.mem_bytes_per_gpu.get(&0).copied().unwrap_or(0);
            last.push_str(&format!(
                "job {job}: keling {ours}, simulator {truth}, state {}; ",
                t.state
            ));
            ok &= ours == truth && truth == held && t.state == "RUNNING";
        }
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "figures never agreed: {last}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = n1.keling(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    for j in [j1, j2] {
        assert!(
            text.contains(&format!("{j}.batch")),
            "keling status names job {j}'s step:\n{text}"
        );
    }
    // /metrics names each process's Slurm job step, beside its memory.
    let metrics = scrape(n1.agent());
    for (job, _, _, held) in expect {
        let step = format!("slurm_job=\"{job}.batch\"");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("keling_process_gpu_memory_bytes{")
                    && l.contains(&step)
                    && l.contains("memory=\"video\"")
                    && l.ends_with(&format!(" {held}"))),
            "/metrics has job {job}'s {held} bytes:\n{metrics}"
        );
    }
    for j in [j1, j2] {
        assert_eq!(cluster.squeue_state(j), "RUNNING");
    }
    let _ = cluster
        .cmd("scancel")
        .args([&j1.to_string(), &j2.to_string()])
        .status();
    for j in [j1, j2] {
        wait_for(
            &format!("job {j} to leave"),
            Duration::from_secs(20),
            || cluster.squeue_state(j).is_empty(),
        );
    }
}

/// A job that allocates past its shards is ended, and the reason is in its
/// output file and in `scontrol show job`; with `--requeue` it is requeued.
fn a_job_over_its_shards_is_ended(cluster: &Cluster, dir: &Path) {
    let out = dir.join("over.out");
    let j = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:1",
        "-o",
        out.to_str().unwrap(),
        "--wrap",
        &busy_script(&dir.join("over"), 2048),
    ]);
    wait_for("the job to end", Duration::from_secs(30), || {
        cluster.squeue_state(j).is_empty()
    });
    let text = read(&out);
    assert!(
        text.contains("keling: Keling sent") && text.contains("over its GPU memory quota"),
        "the output file tells why:\n{text}"
    );
    // Slurm is told off the agent's loop: it may come a moment after the end.
    let mut shown = Default::default();
    wait_for(
        "the reason in scontrol show job",
        Duration::from_secs(20),
        || {
            shown = cluster.job(j);
            shown
                .get("AdminComment")
                .is_some_and(|c| c.contains("over its GPU memory quota"))
        },
    );
    assert_ne!(shown["JobState"], "COMPLETED", "{shown:?}");
    // Not asked for (JobRequeue=0 in the harness: only `--requeue` jobs are).
    assert_eq!(shown["Restarts"], "0", "not requeued: {shown:?}");
    assert_eq!(shown["Requeue"], "0", "{shown:?}");

    let out = dir.join("requeue.out");
    let j = cluster.sbatch(&[
        "-w",
        "n1",
        "--requeue",
        "--gres=shard:1",
        "-o",
        out.to_str().unwrap(),
        "--wrap",
        &busy_script(&dir.join("requeue"), 2048),
    ]);
    let mut seen = std::collections::BTreeMap::new();
    wait_for(
        "the job to be requeued, the reason told",
        Duration::from_secs(40),
        || {
            seen = cluster.job(j);
            seen.get("Restarts").is_some_and(|r| r != "0")
                && seen
                    .get("AdminComment")
                    .is_some_and(|c| c.contains("over its GPU memory quota"))
        },
    );
    let text = read(&out);
    assert!(text.contains("over its GPU memory quota"), "{text}");
    let _ = cluster.cmd("scancel").arg(j.to_string()).status();
    wait_for("the requeued job to leave", Duration::from_secs(20), || {
        cluster.squeue_state(j).is_empty()
    });
}

/// A `--gpu-priority` job preempts a lower one on the same GPU while it works
/// (frozen in its cgroup, then resumed), while `squeue` shows both RUNNING.
/// Two low jobs of one priority run side by side (their shards fit); the high
/// one freezes both while it works (they keep their memory), and both resume.
fn gpu_priority_preempts(cluster: &Cluster, dir: &Path) {
    let n2 = cluster.node("n2");
    let (pl, pll, ph) = (dir.join("low"), dir.join("lower"), dir.join("high"));
    let low = cluster.sbatch(&[
        "-w",
        "n2",
        "--gres=shard:1",
        "--gpu-priority=10",
        "-o",
        "/dev/null",
        "--wrap",
        &busy_script(&pl, 64),
    ]);
    let lower = cluster.sbatch(&[
        "-w",
        "n2",
        "--gres=shard:1",
        "--gpu-priority=10",
        "-o",
        "/dev/null",
        "--wrap",
        &busy_script(&pll, 64),
    ]);
    for p in [&pl, &pll] {
        wait_for("the low jobs to work", Duration::from_secs(30), || {
            progress(p) > 0
        });
    }
    let lower_cg = cgroup_of_job(n2, lower);
    let low_cg = cgroup_of_job(n2, low);
    assert!(
        !frozen(&lower_cg) && !frozen(&low_cg),
        "equal priorities whose shards fit: both low jobs run"
    );
    // A short high-priority job: it works, then ends.
    let high_script = format!(
        "exec {} --dev-dir $KDEV/dev-$SLURMD_NODENAME --scenario busy --iterations 500 \
         --alloc-mib 64 --progress {}",
        gpu_workload_bin().display(),
        ph.display()
    );
    let high = cluster.sbatch(&[
        "-w",
        "n2",
        "--gres=shard:1",
        "--gpu-priority=1",
        "-o",
        "/dev/null",
        "--wrap",
        &high_script,
    ]);
    wait_for(
        "both low jobs to be frozen",
        Duration::from_secs(30),
        || frozen(&lower_cg) && frozen(&low_cg),
    );
    wait_for("the high job to work", Duration::from_secs(10), || {
        progress(&ph) > 0
    });
    for j in [low, lower, high] {
        let s = cluster.squeue_state(j);
        assert!(
            s == "RUNNING" || (j == high && s.is_empty()),
            "squeue does not see a freeze: job {j} is {s:?}"
        );
    }
    assert!(
        frozen(&lower_cg) && frozen(&low_cg),
        "still frozen while squeue said RUNNING"
    );
    wait_for("the high job to end", Duration::from_secs(60), || {
        cluster.squeue_state(high).is_empty()
    });
    wait_for("the low jobs to resume", Duration::from_secs(10), || {
        !frozen(&lower_cg) && !frozen(&low_cg)
    });
    let p = progress(&pll);
    wait_for(
        "the lowest job to progress again",
        Duration::from_secs(10),
        || progress(&pll) > p,
    );
    let _ = cluster
        .cmd("scancel")
        .args([low.to_string(), lower.to_string()])
        .status();
    for j in [low, lower] {
        wait_for("the low jobs to leave", Duration::from_secs(20), || {
            cluster.squeue_state(j).is_empty()
        });
    }
}

/// A process outside Slurm (and outside Keling's tasks) holding `mib` MiB of
/// GPU 0 of `sim`, its progress in `held`; returns once it holds it.
fn stray_holder(sim: &keling_tests::Nvsim, mib: u64, held: &Path) -> keling_tests::ChildGuard {
    let stray = keling_tests::ChildGuard(
        std::process::Command::new(gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args(["--iterations", "100000000", "--alloc-mib", &mib.to_string()])
            .arg("--progress")
            .arg(held)
            .env("CUDA_VISIBLE_DEVICES", "0")
            .spawn()
            .unwrap(),
    );
    wait_for(
        "the stray process to hold its memory",
        Duration::from_secs(20),
        || progress(held) > 0,
    );
    stray
}

/// A process outside Slurm holding most of node n1's GPU memory: the next
/// shard job that would not fit there runs on n2, and n1 takes shard jobs again
/// once the process exits.
fn memory_outside_slurm_sends_jobs_elsewhere(cluster: &Cluster, dir: &Path) {
    let n1 = cluster.node("n1");
    let held = dir.join("stray");
    let stray = stray_holder(&n1.sim, 7168, &held);
    let mut shown = String::new();
    wait_for("n1 drained by Keling", Duration::from_secs(20), || {
        shown = node_line(cluster, "n1");
        shown.contains("DRAIN")
            && shown.contains("Reason=keling: GPU memory held outside Slurm jobs: GPU 0 7 GiB")
    });
    let out = dir.join("elsewhere.out");
    let j = cluster.sbatch(&[
        "--gres=shard:2",
        "-o",
        out.to_str().unwrap(),
        "--wrap",
        "true",
    ]);
    cluster.wait_job(j, "COMPLETED", Duration::from_secs(30));
    assert_eq!(
        cluster.job(j)["NodeList"],
        "n2",
        "the job went elsewhere: {:?}",
        cluster.job(j)
    );
    drop(stray);
    wait_for("n1 resumed by Keling", Duration::from_secs(30), || {
        shown = node_line(cluster, "n1");
        !shown.contains("DRAIN")
    });
    let j = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:2",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    ]);
    cluster.wait_job(j, "COMPLETED", Duration::from_secs(30));
}

/// A GPU under memory pressure: a stray process holds 768 MiB of n1's GPU (under
/// the shard that drains a node by itself), a job holds 4 of its 8 GiB, and a
/// second job's 4 shards then do not fit beside them: its task waits for
/// memory. n1 is drained with Keling's pressure reason, the next shard job runs
/// on n2; once the wait is over (the first job cancelled) n1 stays drained for
/// the hold, then is resumed and takes jobs again.
fn memory_pressure_sends_jobs_elsewhere(cluster: &Cluster, dir: &Path) {
    let n1 = cluster.node("n1");
    let held = dir.join("pressure-stray");
    let stray = stray_holder(&n1.sim, 768, &held);
    let (pa, pb) = (dir.join("pressure-a"), dir.join("pressure-b"));
    let a = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:4",
        "-o",
        "/dev/null",
        "--wrap",
        &busy_script(&pa, 4096),
    ]);
    wait_for("job A to work", Duration::from_secs(30), || {
        progress(&pa) > 0
    });
    assert!(
        !node_line(cluster, "n1").contains("DRAIN"),
        "768 MiB outside alone does not drain n1: {}",
        node_line(cluster, "n1")
    );
    let b = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:4",
        "-o",
        "/dev/null",
        "--wrap",
        &busy_script(&pb, 1024),
    ]);
    let mut task = None;
    wait_for(
        "job B's task to wait for memory",
        Duration::from_secs(30),
        || {
            task = slurm_task(n1.agent().status_reply(), b);
            task.as_ref()
                .is_some_and(|t| t.wait_reason == Some(WaitReason::Memory))
        },
    );
    assert_eq!(progress(&pb), 0, "job B waits: {task:?}");
    let mut shown = String::new();
    wait_for(
        "n1 drained by Keling for memory pressure",
        Duration::from_secs(20),
        || {
            shown = node_line(cluster, "n1");
            shown.contains("DRAIN")
                && shown.contains("Reason=keling: GPU memory pressure: GPU 0 ")
                && shown.contains("/8 GiB held, 1 task waits for memory")
        },
    );
    assert!(
        !shown.contains("held outside Slurm jobs"),
        "pressure only: {shown}"
    );
    let j = cluster.sbatch(&["--gres=shard:2", "-o", "/dev/null", "--wrap", "true"]);
    cluster.wait_job(j, "COMPLETED", Duration::from_secs(30));
    assert_eq!(
        cluster.job(j)["NodeList"],
        "n2",
        "the job went elsewhere: {:?}",
        cluster.job(j)
    );
    // The pressure ends: A leaves, B runs.
    let _ = cluster.cmd("scancel").arg(a.to_string()).status();
    wait_for("job B to work", Duration::from_secs(30), || {
        progress(&pb) > 0
    });
    let ended = Instant::now();
    // The hold: not resumed at once (it would flap at every wait).
    shown = node_line(cluster, "n1");
    assert!(
        shown.contains("DRAIN") && shown.contains("GPU memory pressure"),
        "still drained right after the wait ended: {shown}"
    );
    wait_for("n1 resumed by Keling", Duration::from_secs(60), || {
        shown = node_line(cluster, "n1");
        !shown.contains("DRAIN")
    });
    eprintln!(
        "n1 resumed {} ms after the wait ended",
        ended.elapsed().as_millis()
    );
    let j = cluster.sbatch(&[
        "-w",
        "n1",
        "--gres=shard:2",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    ]);
    cluster.wait_job(j, "COMPLETED", Duration::from_secs(30));
    let _ = cluster.cmd("scancel").arg(b.to_string()).status();
    wait_for("job B to leave", Duration::from_secs(20), || {
        cluster.squeue_state(b).is_empty()
    });
    drop(stray);
}

/// `scontrol show node -o NAME`.
fn node_line(cluster: &Cluster, name: &str) -> String {
    let out = cluster
        .cmd("scontrol")
        .args(["show", "node", "-o", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cgroup_of_job(node: &keling_tests::slurm::Node, job: u32) -> PathBuf {
    let mut cg = None;
    wait_for(
        &format!("job {job}'s task"),
        Duration::from_secs(10),
        || {
            cg = slurm_task(node.agent().status_reply(), job)
                .and_then(|t| t.cgroup.map(PathBuf::from));
            cg.is_some()
        },
    );
    cg.unwrap()
}

/// A node whose agent is stopped still runs jobs, each told once on its
/// standard error.
fn agent_down_runs_jobs_told_once(cluster: &mut Cluster, dir: &Path) {
    cluster.stop_agent("n2");
    for i in 0..2 {
        let out = dir.join(format!("down-{i}.out"));
        let j = cluster.sbatch(&[
            "-w",
            "n2",
            "--gres=shard:1",
            "-o",
            out.to_str().unwrap(),
            "--wrap",
            "echo ran",
        ]);
        cluster.wait_job(j, "COMPLETED", Duration::from_secs(30));
        let text = read(&out);
        assert!(text.contains("ran"), "{text}");
        // Once, in one piece: any other line that says it (slurmstepd's own
        // log of the plugin's error, or a second copy) would count here.
        let told: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("is not running"))
            .collect();
        assert_eq!(told.len(), 1, "told once:\n{text}");
        assert!(
            told[0].starts_with("keling: the Keling agent of node n2 is not running"),
            "{text}"
        );
    }
}

/// What the plugin adds to a job step's start (for `cargo xtask bench`, part
/// `slurm`; not asserted): `srun --gres=shard:1 true` with the plugin (it hands
/// the task to the node's agent) and without it (an empty `plugstack.conf`:
/// each step's slurmstepd reads it afresh), interleaved, medians. Prints
/// `slurm step start ms: without W with P` for the bench to read.
#[test]
#[ignore = "a benchmark: cargo xtask bench runs it"]
fn slurm_step_start_cost() {
    let Some(fx) = Fixture::needs("slurm_step_start_cost")
        .cgroups()
        .check(can_run_slurm)
        .ready()
    else {
        return;
    };
    let rounds: usize = std::env::var("KELING_SLURM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    let sim = vec!["--gpus".to_string(), "1".into()];
    let cluster = Cluster::start(
        &fx.dir,
        ClusterOptions {
            nodes: vec![sim],
            agent_args: Vec::new(),
            plugin: Some(Vec::new()),
        },
    );
    let plugstack = cluster.dir.join("plugstack.conf");
    let with_plugin = std::fs::read_to_string(&plugstack).unwrap();
    let step = |plugin: bool| {
        std::fs::write(&plugstack, if plugin { with_plugin.as_str() } else { "" }).unwrap();
        let t = Instant::now();
        let out = cluster
            .cmd("srun")
            .args(["-w", "n1", "--gres=shard:1", "true"])
            .output()
            .unwrap();
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ms
    };
    step(true); // warm: the first step pays for loading everything once
    step(false);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(step(false));
        with.push(step(true));
    }
    let attached = cluster.node("n1").agent().status_reply().archive.completed;
    std::fs::write(&plugstack, &with_plugin).unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "slurm step start ms: without {:.1} with {:.1} (rounds {rounds}, Keling tasks completed {attached})",
        median(&mut without),
        median(&mut with)
    );
}
