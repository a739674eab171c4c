//! The loop's behaviour with no root and no kernel: the daemon on its fake host
//! ([`FakeHost`]), and fakes of the kernel's maps, the ring buffer and the
//! fail-safe. The test plays everything around the loop through the channels it
//! reads (requests, wakes, confirmations, scrapes) and the fakes (events, full
//! tables, fail-safe notices), under tokio's paused clock: time moves only when
//! the loop and the test both wait, so [`settle`] returns once the loop has
//! handled everything sent to it.
use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use keling_common::{EventHeader, EventKind};
use keling_sched::{ActionKind, GpuInfo, SchedConfig, Scheduler, TaskId};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{Agent, Guard, Inputs, Kernel, Settings};
use crate::{
    control::{
        LaunchRequest, Reply, Request, StatusReply, TaskStatus,
        server::{Incoming, Peer, Replier, TestReceiver},
    },
    event::{
        decode::{DeviceFile, Event, GpuOpenEvent, OpenHow},
        fake::{FakeEvents, Ring},
    },
    gpu::stats::GpuAccounting,
    latency::{LatencyRecorder, ModelKind},
    os::{proc::ProcessFacts, users::Credentials},
    prometheus::http::Scrape,
    sched::{
        config::Config,
        daemon::{Daemon, DaemonSettings},
        host::{
            Wake,
            fake::{Call, FakeHost, Process},
        },
        log_writer::Logs,
        supervisor::Notice,
        worker::Confirmation,
    },
};

/// The kernel's maps, as the test sets them.
#[derive(Clone, Default)]
struct FakeKernel(Arc<Mutex<KernelMaps>>);

#[derive(Default)]
struct KernelMaps {
    tracked: Vec<u32>,
    table_full: BTreeMap<u32, u64>,
    drops: u64,
    /// Per process: the sound lower bound of its video memory.
    sure_bytes: BTreeMap<u32, u64>,
    /// Rows of `table_full` the kernel created and queued, and those it could not.
    unsure_new: Vec<u32>,
    unsure_lost: u64,
    /// Processes whose rows the loop removed.
    forgotten: Vec<u32>,
}

impl FakeKernel {
    fn maps(&self) -> std::sync::MutexGuard<'_, KernelMaps> {
        self.0.lock().unwrap()
    }
}

impl Kernel for FakeKernel {
    fn track(&mut self, pid: u32) -> anyhow::Result<()> {
        self.maps().tracked.push(pid);
        Ok(())
    }

    fn table_full_pids(&self) -> anyhow::Result<BTreeMap<u32, u64>> {
        Ok(self.maps().table_full.clone())
    }

    fn drops(&self) -> anyhow::Result<u64> {
        Ok(self.maps().drops)
    }

    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting> {
        Ok(GpuAccounting::default())
    }

    fn tracked_processes(&self) -> anyhow::Result<usize> {
        Ok(self.maps().tracked.len())
    }

    fn sure_video_bytes(&self, pids: &std::collections::BTreeSet<u32>) -> anyhow::Result<u64> {
        let maps = self.maps();
        Ok(pids.iter().filter_map(|p| maps.sure_bytes.get(p)).sum())
    }

    fn new_unsure_pids(&mut self) -> anyhow::Result<(Vec<u32>, u64)> {
        let mut maps = self.maps();
        let new = std::mem::take(&mut maps.unsure_new);
        Ok((new, maps.unsure_lost))
    }

    fn forget_books(&mut self, pid: u32) -> anyhow::Result<()> {
        let mut maps = self.maps();
        maps.table_full.remove(&pid);
        maps.forgotten.push(pid);
        Ok(())
    }
}

/// What the fail-safe saw, across restarts.
#[derive(Default)]
struct GuardLog {
    /// When each heartbeat was sent.
    beats: Vec<Instant>,
    /// The pids of fail-safes started again.
    restarted: Vec<u32>,
    /// A restart fails with this.
    refuse_restart: Option<String>,
    /// The pids of fail-safes closed (dropped).
    closed: Vec<u32>,
}

struct FakeGuard {
    pid: u32,
    log: Arc<Mutex<GuardLog>>,
    notices: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Notice>>>,
}

impl Guard for FakeGuard {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn heartbeat(&self) {
        self.log.lock().unwrap().beats.push(Instant::now());
    }

    async fn notice(&self) -> Notice {
        match self.notices.lock().await.recv().await {
            Some(n) => n,
            None => std::future::pending().await,
        }
    }

    fn restart(&self) -> anyhow::Result<Self> {
        let mut log = self.log.lock().unwrap();
        if let Some(e) = &log.refuse_restart {
            anyhow::bail!("{e}");
        }
        let pid = self.pid + 1;
        log.restarted.push(pid);
        Ok(Self {
            pid,
            log: self.log.clone(),
            notices: self.notices.clone(),
        })
    }
}

impl Drop for FakeGuard {
    fn drop(&mut self) {
        self.log.lock().unwrap().closed.push(self.pid);
    }
}

const GUARD_PID: u32 = 900;

/// Everything around the loop, as the test plays it.
struct World {
    host: FakeHost,
    kernel: FakeKernel,
    guard: Arc<Mutex<GuardLog>>,
    events: Ring,
    notices: mpsc::UnboundedSender<Notice>,
    requests: mpsc::Sender<Incoming>,
    confirmations: mpsc::UnboundedSender<Confirmation>,
    wakes: mpsc::UnboundedSender<Wake>,
    scrapes: mpsc::Sender<Scrape>,
    next_conn: u64,
}

type TestAgent = Agent<FakeKernel, FakeEvents, FakeGuard>;

/// One GPU with one slot; no task goes idle in a test. `rules`: the config file.
fn one_gpu() -> SchedConfig {
    SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: 80 << 30,
        }],
        idle_timeout_ms: 3_600_000,
        ..SchedConfig::default()
    }
}

fn world(rules: &str, watchdog_ms: u64) -> (World, TestAgent) {
    let host = FakeHost::default();
    let daemon = Daemon::new(
        Scheduler::new(one_gpu()),
        LatencyRecorder::new(ModelKind::Adaptive),
        Logs::open(None, None).unwrap(),
        Config::parse(rules).unwrap(),
        DaemonSettings {
            default_priority: 8,
            archive_retention_ns: 3_600_000_000_000,
            archive_max: crate::defaults::ARCHIVE_MAX,
        },
        Box::new(host.clone()),
    );
    let kernel = FakeKernel::default();
    let (events, fake_events) = FakeEvents::new();
    let (notices, notices_rx) = mpsc::unbounded_channel();
    let guard = Arc::new(Mutex::new(GuardLog::default()));
    let (requests, requests_rx) = mpsc::channel(64);
    let (confirmations, confirmations_rx) = mpsc::unbounded_channel();
    let (wakes, wakes_rx) = mpsc::unbounded_channel();
    let (scrapes, scrapes_rx) = mpsc::channel(4);
    let agent = Agent::new(
        daemon,
        kernel.clone(),
        fake_events,
        FakeGuard {
            pid: GUARD_PID,
            log: guard.clone(),
            notices: Arc::new(tokio::sync::Mutex::new(notices_rx)),
        },
        Inputs {
            requests: requests_rx,
            confirmations: confirmations_rx,
            wakes: wakes_rx,
            scrapes: scrapes_rx,
        },
        None,
        Settings {
            status_interval_s: 0,
            histo_interval_s: 1,
            watchdog_ms,
            metrics_grace_ns: 0,
            capacities: Vec::new(),
        },
    );
    let w = World {
        host,
        kernel,
        guard,
        events,
        notices,
        requests,
        confirmations,
        wakes,
        scrapes,
        next_conn: 1,
    };
    (w, agent)
}

/// Runs `agent` until `script` is done, then stops it as a signal would: the
/// loop's result, and the script's (`None`: the loop ended first).
async fn play<T>(
    agent: TestAgent,
    script: impl Future<Output = T>,
) -> (anyhow::Result<i32>, Option<T>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let mut stop = Some(stop);
    let run = agent.run(async {
        let _ = stopped.await;
    });
    tokio::pin!(run, script);
    let mut out = None;
    loop {
        tokio::select! {
            result = &mut run => return (result, out),
            o = &mut script, if out.is_none() => {
                out = Some(o);
                let _ = stop.take().expect("stopped once").send(());
            }
        }
    }
}

/// Returns once the loop has handled everything sent to it: under the paused
/// clock, time moves (here by 1 us) only when the loop waits on every source.
async fn settle() {
    tokio::time::sleep(Duration::from_micros(1)).await;
}

fn header(kind: EventKind, pid: u32) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        cpu: 0,
        ts_ns: 5,
        pid,
        tid: pid,
    }
}

fn gpu_open(pid: u32) -> Event {
    Event::GpuOpen(GpuOpenEvent {
        header: header(EventKind::GpuOpen, pid),
        fd: 5,
        device: DeviceFile::Gpu(0),
        file_id: 0xf00,
        how: OpenHow::Open,
    })
}

fn exit(pid: u32, code: u32) -> Event {
    Event::Exit(keling_common::ExitEvent {
        header: header(EventKind::Exit, pid),
        exit_status: code << 8,
        group_dead: 1,
        tracked: 1,
        _reserved: 0,
        comm: [0; keling_common::COMM_LEN],
    })
}

fn launch_request(priority: u8, max_duration_ms: Option<u64>) -> LaunchRequest {
    LaunchRequest {
        argv: vec!["/usr/bin/work".into()],
        cwd: "/".into(),
        priority: Some(priority),
        gpu: Some(0),
        max_duration_ms,
        grace_ms: Some(100),
        mem_quota_bytes: None,
        hard_kill: Some(true),
        expected_runtime_ms: None,
        env: None,
        notify_preempt: true,
    }
}

impl World {
    /// Sends `request` on a new connection as root; its client's end.
    async fn send(&mut self, request: Request) -> TestReceiver {
        let (reply, rx) = Replier::for_test();
        let conn = self.next_conn;
        self.next_conn += 1;
        let incoming = Incoming {
            request,
            fds: Vec::new(),
            peer: Peer {
                creds: Credentials {
                    uid: 0,
                    gid: 0,
                    groups: Vec::new(),
                },
                pid: None,
            },
            reply,
            conn,
        };
        assert!(self.requests.send(incoming).await.is_ok(), "loop gone");
        settle().await;
        rx
    }

    async fn status(&mut self) -> StatusReply {
        let mut replies = self.send(Request::Status(true)).await.drain();
        match (replies.pop(), replies.is_empty()) {
            (Some(Reply::Status(s)), true) => *s,
            other => panic!("status answered {other:?} after {replies:?}"),
        }
    }

    async fn task(&mut self, id: TaskId) -> TaskStatus {
        self.status()
            .await
            .tasks
            .into_iter()
            .find(|t| t.id == id)
            .unwrap_or_else(|| panic!("task {id} not in status"))
    }

    /// A launch whose exec succeeded: its id and client.
    async fn running(
        &mut self,
        priority: u8,
        max_duration_ms: Option<u64>,
    ) -> (TaskId, TestReceiver) {
        let rx = self
            .send(Request::Launch(launch_request(priority, max_duration_ms)))
            .await;
        let id = self
            .host
            .calls()
            .iter()
            .rev()
            .find_map(|c| match c {
                Call::Start { id, .. } => Some(*id),
                _ => None,
            })
            .expect("the launch started");
        self.wake(Wake::Exec(id, Ok(()))).await;
        (id, rx)
    }

    async fn wake(&self, wake: Wake) {
        self.wakes.send(wake).unwrap();
        settle().await;
    }

    async fn confirm(&self, id: TaskId, kind: ActionKind) {
        self.confirmations
            .send(self.host.confirm(id, kind))
            .unwrap();
        settle().await;
    }

    /// A kernel event that wakes the loop.
    async fn event(&self, event: Event) {
        self.events.event(event);
        settle().await;
    }

    /// A kernel event that waits in the ring buffer for the next drain.
    fn detail_event(&self, event: Event) {
        self.events.detail(event);
    }

    async fn notice(&self, notice: Notice) {
        self.notices.send(notice).unwrap();
        settle().await;
    }

    fn calls_since(&self, n: usize) -> Vec<Call> {
        self.host.calls()[n..].to_vec()
    }
}

/// A GPU process the config manages: the kernel's open makes it a task, and its
/// exit code is the trace's, read before the pidfd's wake is handled (the pidfd
/// has no code for a process Keling did not start).
#[tokio::test(start_paused = true)]
async fn kernel_events_adopt_a_process_and_its_exit_code_is_the_traces() {
    let rules = "[[rule]]\nname = \"jobs\"\ncomm = \"train\"\npriority = 3\n";
    let (mut w, agent) = world(rules, 1000);
    let pid = 4242;
    w.host.add_process(
        pid,
        Process {
            facts: ProcessFacts {
                comm: "train".into(),
                uid: Some(1000),
                ..ProcessFacts::default()
            },
            uid: 1000,
            start_ticks: 77,
            started_ns: 0,
        },
    );
    let (result, done) = play(agent, async {
        assert!(w.status().await.tasks.is_empty());
        w.event(gpu_open(pid)).await;
        let id = match w.host.calls().as_slice() {
            [Call::Adopt { id, pid: p }] if *p == pid => *id,
            other => panic!("{other:?}"),
        };
        let t = w.task(id).await;
        assert_eq!(
            (t.state.as_str(), t.priority, t.pid, t.gpu),
            ("RUNNING", 3, pid, Some(0))
        );
        // The process ends: the kernel's exit event (code 7) waits in the ring
        // buffer when its pidfd wakes the loop.
        let wake = w.host.exit(id, 99);
        w.detail_event(exit(pid, 7));
        w.wake(wake).await;
        let t = w.task(id).await;
        assert_eq!((t.state.as_str(), t.exit_code), ("FAILED", Some(7)));
        assert_eq!(w.host.calls().last(), Some(&Call::Forget(id)));
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert!(done.is_some(), "the script ran to its end");
}

/// A rule that names a process only by its `comm` (which its owner chooses)
/// gives no more priority than the owner's `[access]` allows (3 by default for
/// a user); one that names the uid gives what it says; root's process is not
/// capped. Before, naming a process `rt` bought the real-time class.
#[tokio::test(start_paused = true)]
async fn a_rule_matched_by_comm_alone_gives_no_more_than_the_owners_access() {
    let rules = "[[rule]]\nname = \"by-uid\"\ncomm = \"rt\"\nuid = 1001\npriority = 1\n\
                 [[rule]]\nname = \"by-comm\"\ncomm = \"rt\"\npriority = 0\n";
    let (mut w, agent) = world(rules, 1000);
    for (pid, uid) in [(4242, 1000), (4243, 1001), (4244, 0)] {
        w.host.add_process(
            pid,
            Process {
                facts: ProcessFacts {
                    comm: "rt".into(),
                    uid: Some(uid),
                    gid: Some(uid),
                    ..ProcessFacts::default()
                },
                uid,
                start_ticks: 77,
                started_ns: 0,
            },
        );
    }
    let (result, done) = play(agent, async {
        let mut got = Vec::new();
        for pid in [4242, 4243, 4244] {
            w.event(gpu_open(pid)).await;
            let id = match w.host.calls().last() {
                Some(Call::Adopt { id, pid: p }) if *p == pid => *id,
                other => panic!("{other:?}"),
            };
            got.push(w.task(id).await.priority);
        }
        assert_eq!(got, vec![3, 1, 0], "by comm for uid 1000; by uid; root's");
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert!(done.is_some(), "the script ran to its end");
}

/// A launch is traced from its start, frozen for a higher priority once the
/// actuation thread confirms it, and the stop thaws it, closes the fail-safe
/// after the daemon, and returns 0.
#[tokio::test(start_paused = true)]
async fn a_frozen_launch_is_thawed_when_the_loop_stops() {
    let (mut w, agent) = world("", 1000);
    let guard = w.guard.clone();
    let host = w.host.clone();
    let (result, done) = play(agent, async {
        let (low, mut low_client) = w.running(10, None).await;
        assert_eq!(w.kernel.maps().tracked, vec![w.host.pid(low)]);
        assert_eq!(w.task(low).await.state, "RUNNING");
        low_client.drain();
        let (high, _) = w.running(2, None).await;
        assert_eq!(w.kernel.maps().tracked.len(), 2);
        assert_eq!(w.host.submitted(low, ActionKind::Freeze).len(), 1);
        assert_eq!(w.task(low).await.state, "RUNNING", "until confirmed");
        w.confirm(low, ActionKind::Freeze).await;
        assert_eq!(w.task(low).await.state, "PREEMPTED");
        assert_eq!(w.task(high).await.state, "RUNNING");
        assert!(
            low_client
                .drain()
                .iter()
                .any(|r| matches!(r, Reply::Notice(crate::control::Notice::Frozen { .. }))),
            "the frozen task's client is told"
        );
        (low, w.host.calls().len())
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    let (low, calls_at_stop) = done.expect("the script ran to its end");
    let after: Vec<Call> = host.calls()[calls_at_stop..].to_vec();
    assert!(
        after.contains(&Call::SetFrozen {
            id: low,
            frozen: false
        }),
        "{after:?}"
    );
    assert_eq!(after.last(), Some(&Call::ForgetStopped));
    assert_eq!(guard.lock().unwrap().closed, vec![GUARD_PID]);
}

/// Time rules are the tick's: a launch past its duration limit is killed within
/// a tick of it, not before; and idle or busy, the fail-safe hears a heartbeat at
/// least every quarter of its watchdog.
#[tokio::test(start_paused = true)]
async fn the_tick_enforces_the_duration_limit_and_carries_the_heartbeat() {
    let watchdog_ms = 200;
    let (mut w, agent) = world("", watchdog_ms);
    let guard = w.guard.clone();
    let started = Instant::now();
    let (result, done) = play(agent, async {
        // Idle: nothing lives.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (id, _client) = w.running(5, Some(1000)).await;
        let n = w.host.calls().len();
        tokio::time::sleep(Duration::from_millis(990)).await;
        assert_eq!(w.calls_since(n), vec![], "nothing before the limit");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            w.calls_since(n),
            vec![Call::Kill(id)],
            "killed at the limit"
        );
        let wake = w.host.exit(id, 137);
        w.wake(wake).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert!(done.is_some(), "the script ran to its end");
    let beats = guard.lock().unwrap().beats.clone();
    let mut last = started;
    for b in &beats {
        assert!(
            *b - last <= Duration::from_millis(watchdog_ms / 4),
            "{:?} without a heartbeat",
            *b - last
        );
        last = *b;
    }
    assert!(Instant::now() - last <= Duration::from_millis(watchdog_ms / 4));
}

/// The fail-safe tripped: what the core holds frozen is frozen again. It died:
/// another is started (and never scheduled); when none can be, the loop stops
/// with an error rather than freeze tasks without one.
#[tokio::test(start_paused = true)]
async fn the_fail_safe_is_restarted_after_it_died_and_its_refusal_stops_the_loop() {
    let (mut w, agent) = world("", 1000);
    let guard = w.guard.clone();
    let (result, _) = play(agent, async {
        let (low, _c1) = w.running(10, None).await;
        let (_high, _c2) = w.running(2, None).await;
        w.confirm(low, ActionKind::Freeze).await;
        let n = w.host.calls().len();
        w.notice(Notice::Tripped).await;
        assert_eq!(
            w.calls_since(n),
            vec![Call::ForgetStopped, Call::Refreeze(low)]
        );
        w.notice(Notice::Gone).await;
        assert_eq!(w.guard.lock().unwrap().restarted, vec![GUARD_PID + 1]);
        assert_eq!(w.guard.lock().unwrap().closed, vec![GUARD_PID]);
        w.guard.lock().unwrap().refuse_restart = Some("no more processes".into());
        w.notice(Notice::Gone).await;
        unreachable!("the loop stopped");
    })
    .await;
    let e = result.expect_err("no fail-safe: the loop stops");
    assert!(format!("{e:#}").contains("no more processes"), "{e:#}");
    assert_eq!(guard.lock().unwrap().closed, vec![GUARD_PID, GUARD_PID + 1]);
}

fn fork(parent: u32, child: u32) -> Event {
    Event::Fork(keling_common::ForkEvent {
        header: header(EventKind::Fork, parent),
        child_pid: child,
        child_tid: child,
        tracked: 1,
        _reserved: 0,
        comm: [0; keling_common::COMM_LEN],
    })
}

/// The kernel's full tables reach the daemon before the events drained with
/// them, and a process's count is remembered only once told to its task: a child
/// whose fork was still in the ring buffer at the first look is told at the next.
#[tokio::test(start_paused = true)]
async fn a_full_table_makes_the_figure_unsure_once_its_process_is_known() {
    let (mut w, agent) = world("", 1000);
    let (result, done) = play(agent, async {
        let (id, _client) = w.running(5, None).await;
        let (root, child) = (w.host.pid(id), 5151);
        w.host.add_child(id, child);
        w.kernel.maps().table_full.insert(child, 1);
        w.kernel.maps().unsure_new.push(child);
        // The fork is drained after the look at the tables: nobody to tell yet.
        w.event(fork(root, child)).await;
        assert!(!w.task(id).await.mem_unsure, "the child was no member yet");
        // The next drain (the tick's) looks again.
        tokio::time::sleep(Duration::from_millis(crate::defaults::RUN_TICK_MS)).await;
        assert!(w.task(id).await.mem_unsure);
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert!(done.is_some(), "the script ran to its end");
}

/// A `/metrics` scrape is answered by the loop, from the daemon's state now.
#[tokio::test(start_paused = true)]
async fn a_scrape_is_answered_with_the_tasks_of_the_moment() {
    let (mut w, agent) = world("", 1000);
    let (result, done) = play(agent, async {
        let (_id, _client) = w.running(5, None).await;
        let (reply, text) = oneshot::channel();
        assert!(w.scrapes.send(Scrape { reply }).await.is_ok());
        text.await.expect("answered")
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    let text = done.expect("the script ran to its end");
    assert!(
        text.lines()
            .any(|l| l == r#"keling_tasks{state="RUNNING"} 1"#),
        "{text}"
    );
}
