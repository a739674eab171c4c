//! The daemon's behaviour against a fake host ([`FakeHost`]): launch, preemption,
//! confirmation, thaw, escalation of an unconfirmed freeze, the fail-safe's
//! hand-off, silent clients, late binding. No root and no kernel: the test plays
//! the machine (it confirms actuations or lets them time out, ends tasks, reports
//! exec outcomes) and the event loop (it hands the daemon what comes back),
//! under tokio's paused clock where time matters.
//!
//! What `tests/tests/chaos.rs` once measured in milliseconds against the real
//! kernel is asserted here as what it stands for: the thaw is submitted in the
//! step that learns of the exit, decided at that instant; status is answered at
//! once while launch clients never read.
use keling_sched::{ActionKind, GpuInfo, SchedConfig, Scheduler, TaskId};

use super::{CONFIRM_WAIT_FLOOR, Daemon, DaemonSettings};
use crate::os::spawn::StartError;
use crate::{
    control::{
        ArchiveSummary, ErrorKind, LaunchRequest, Notice, Reply, ReplyError, Request,
        STATUS_ARCHIVED_DEFAULT, STATUS_ARCHIVED_MAX, SignalRequest, StatusPage, StatusReply,
        TaskStatus,
        server::{Incoming, NOTICE_QUEUE, Peer, Replier, TestReceiver},
    },
    latency::{LatencyRecorder, ModelKind},
    os::users::Credentials,
    sched::{
        config::Config,
        host::{
            EnvGpu, Host as _, Wake,
            fake::{Call, FakeHost},
        },
        log_writer::Logs,
    },
};

/// Two GPUs, one slot each; no task goes idle or reaches its limit in a test.
fn two_gpus() -> SchedConfig {
    SchedConfig {
        gpus: (0..2)
            .map(|index| GpuInfo {
                index,
                capacity_bytes: 80 << 30,
            })
            .collect(),
        idle_timeout_ms: 3_600_000,
        ..SchedConfig::default()
    }
}

/// The daemon on a fake host, and the test's side of it.
struct Agent {
    daemon: Daemon,
    host: FakeHost,
    next_conn: u64,
}

/// A launch's client, which reads only when the test says so.
struct Client {
    rx: TestReceiver,
    conn: u64,
}

/// One GPU of `capacity_bytes` shared by memory under late binding, no cap,
/// no idle timeout within a test.
fn one_gpu_shared_by_memory(capacity_bytes: u64) -> SchedConfig {
    SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes,
        }],
        sharing: keling_sched::Sharing::Memory,
        slots_per_gpu: 0,
        binding: keling_sched::Binding::Late,
        idle_timeout_ms: 3_600_000,
        ..SchedConfig::default()
    }
}

fn agent(config: SchedConfig) -> Agent {
    let host = FakeHost::default();
    let daemon = Daemon::new(
        Scheduler::new(config),
        LatencyRecorder::new(ModelKind::Adaptive),
        Logs::open(None, None).unwrap(),
        Config::parse("").unwrap(),
        DaemonSettings {
            default_priority: 8,
            archive_retention_ns: 3_600_000_000_000,
            archive_max: crate::defaults::ARCHIVE_MAX,
        },
        Box::new(host.clone()),
    );
    Agent {
        daemon,
        host,
        next_conn: 1,
    }
}

fn root() -> Peer {
    Peer {
        creds: Credentials {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        },
        pid: None,
    }
}

fn launch_request(priority: u8, gpu: Option<u32>) -> LaunchRequest {
    LaunchRequest {
        argv: vec!["/usr/bin/work".into()],
        cwd: "/".into(),
        priority: Some(priority),
        gpu,
        max_duration_ms: None,
        grace_ms: None,
        mem_quota_bytes: None,
        hard_kill: None,
        expected_runtime_ms: None,
        env: None,
        notify_preempt: true,
    }
}

impl Agent {
    /// One request on a fresh connection; what it was answered at once.
    fn request(&mut self, request: Request) -> Vec<Reply> {
        let (reply, mut rx) = Replier::for_test();
        self.handle(request, reply);
        rx.drain()
    }

    fn handle(&mut self, request: Request, reply: Replier) -> u64 {
        let conn = self.next_conn;
        self.next_conn += 1;
        let incoming = Incoming {
            request,
            fds: Vec::new(),
            peer: root(),
            reply,
            conn,
        };
        self.daemon.handle(incoming, &mut |_| Ok(()));
        conn
    }

    /// `keling launch` as root, with freeze and resume notices: the task and its
    /// client.
    fn launch(&mut self, priority: u8, gpu: Option<u32>) -> (TaskId, Client) {
        let (reply, rx) = Replier::for_test();
        let conn = self.handle(Request::Launch(launch_request(priority, gpu)), reply);
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
        (id, Client { rx, conn })
    }

    /// A launch whose exec succeeded at once.
    fn running(&mut self, priority: u8, gpu: Option<u32>) -> (TaskId, Client) {
        let (id, client) = self.launch(priority, gpu);
        self.daemon.woken(Wake::Exec(id, Ok(())));
        (id, client)
    }

    fn status(&mut self) -> StatusReply {
        let mut replies = self.request(Request::Status(true));
        match (replies.pop(), replies.is_empty()) {
            (Some(Reply::Status(s)), true) => *s,
            other => panic!("status answered {other:?} after {replies:?}"),
        }
    }

    fn task(&mut self, id: TaskId) -> TaskStatus {
        self.status()
            .tasks
            .into_iter()
            .find(|t| t.id == id)
            .unwrap_or_else(|| panic!("task {id} not in status"))
    }

    fn state(&mut self, id: TaskId) -> String {
        self.task(id).state
    }

    /// The actuation thread saw the last `kind` of `id` take effect.
    fn confirm(&mut self, id: TaskId, kind: ActionKind) {
        let c = self.host.confirm(id, kind);
        self.daemon.confirmed(c);
    }

    /// Task `id`'s process ends with `code` and its pidfd says so.
    fn exit(&mut self, id: TaskId, code: i32) {
        let wake = self.host.exit(id, code);
        self.daemon.woken(wake);
    }

    /// How many actuations the host has been handed so far.
    fn submitted(&self) -> usize {
        self.host.actuations().len()
    }
}

fn notices(replies: &[Reply]) -> Vec<&Notice> {
    replies
        .iter()
        .filter_map(|r| match r {
            Reply::Notice(n) => Some(n),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_launch_is_placed_released_and_accepted_once_it_execs() {
    let mut a = agent(two_gpus());
    let (id, mut client) = a.launch(5, None);
    let pid = a.host.pid(id);
    // Placed at arrival on the best GPU, its GPU in its environment from the
    // fork, and released to exec in the same step.
    assert_eq!(
        a.host.calls(),
        vec![
            Call::Start {
                id,
                pid,
                env_gpu: EnvGpu::Chosen(Some(0))
            },
            Call::Release { id, gpu: None },
        ]
    );
    assert_eq!(
        client.rx.drain(),
        vec![],
        "placed and accepted only once the exec succeeded"
    );
    let t = a.task(id);
    assert_eq!(
        (t.state.as_str(), t.gpu, t.uid),
        ("RUNNING", Some(0), Some(0))
    );
    assert_eq!(t.cgroup.as_deref(), Some("/fake/keling/task-1"));
    a.daemon.woken(Wake::Exec(id, Ok(())));
    assert_eq!(
        client.rx.drain(),
        vec![
            Reply::Notice(Notice::Placed {
                task: id,
                pid,
                gpu: 0,
                priority: 5
            }),
            Reply::Accepted(crate::control::Accepted {
                task: id,
                gpu: Some(0),
                pid
            })
        ]
    );
    a.exit(id, 3);
    assert_eq!(client.rx.drain(), vec![Reply::ExitCode(3)]);
    assert_eq!(a.host.calls().last(), Some(&Call::Forget(id)));
    let t = a.task(id);
    assert_eq!((t.state.as_str(), t.exit_code), ("FAILED", Some(3)));
}

#[tokio::test(start_paused = true)]
async fn a_command_that_cannot_start_is_the_clients_error() {
    let mut a = agent(two_gpus());
    // The exec failed: the client hears which step, and nothing else.
    let (id, mut client) = a.launch(5, Some(1));
    assert_eq!(
        client.rx.drain(),
        vec![],
        "nothing before the exec's outcome (issue 32: `placed` came before a start_failed)"
    );
    let why = "cannot enter the working directory /gone as uid 0".to_owned();
    a.daemon
        .woken(Wake::Exec(id, Err(StartError::other(why.clone()))));
    assert_eq!(
        client.rx.drain(),
        vec![Reply::Error(ReplyError::new(ErrorKind::StartFailed, why))]
    );
    a.exit(id, 127);
    assert_eq!(client.rx.drain(), vec![], "told everything already");
    // The start itself failed: refused at once, nothing arrives in the core.
    a.host.fail_starts("cannot fork: out of memory");
    let replies = a.request(Request::Launch(launch_request(5, None)));
    assert_eq!(
        replies,
        vec![Reply::Error(ReplyError::new(
            ErrorKind::StartFailed,
            "cannot fork: out of memory"
        ))]
    );
    assert_eq!(a.status().tasks.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_preempts_and_the_thaw_is_submitted_in_the_step_of_its_exit() {
    let mut a = agent(two_gpus());
    let (low, mut low_client) = a.running(10, Some(0));
    low_client.rx.drain();
    let (high, _high_client) = a.running(4, Some(0));
    // The freeze was handed to the actuation thread in the step of the higher
    // task's arrival, given at least the floor to show.
    let freeze = a.host.submitted(low, ActionKind::Freeze);
    assert_eq!(freeze.len(), 1);
    assert!(
        freeze[0].timeout >= CONFIRM_WAIT_FLOOR,
        "{:?}",
        freeze[0].timeout
    );
    // A task being frozen stays RUNNING until the freeze is confirmed.
    let t = a.task(low);
    assert_eq!(
        (t.state.as_str(), t.in_flight),
        ("RUNNING", Some(ActionKind::Freeze))
    );
    a.confirm(low, ActionKind::Freeze);
    assert_eq!(a.state(low), "PREEMPTED");
    match notices(&low_client.rx.drain()).as_slice() {
        [Notice::Frozen { yielded_to, .. }] => {
            assert_eq!(
                yielded_to.iter().map(|r| r.task).collect::<Vec<_>>(),
                [high]
            );
        }
        other => panic!("{other:?}"),
    }

    // The higher task exits: the thaw is submitted before the daemon returns
    // from that one wake (no tick, no other input), timed from that instant.
    let before = a.submitted();
    assert!(a.host.submitted(low, ActionKind::Thaw).is_empty());
    let exit_ns = a.host.now_ns();
    a.exit(high, 0);
    let thaw = a.host.submitted(low, ActionKind::Thaw);
    assert_eq!(thaw.len(), 1, "the thaw follows the exit in the same step");
    assert_eq!(a.submitted(), before + 1);
    assert_eq!(
        thaw[0].times.decided_ns, exit_ns,
        "decided at the exit's instant"
    );
    assert_eq!(thaw[0].times.received_ns, exit_ns);
    // Its slot is the thawing task's already; it is RUNNING once confirmed.
    assert_eq!(a.state(low), "PREEMPTED");
    tokio::time::advance(thaw[0].timeout / 2).await;
    a.confirm(low, ActionKind::Thaw);
    assert_eq!(a.state(low), "RUNNING");
    match notices(&low_client.rx.drain()).as_slice() {
        [Notice::Resumed { task, .. }] => assert_eq!(*task, low),
        other => panic!("{other:?}"),
    }
    // Confirmed within its timeout: not late.
    let latency = a.status().latency;
    assert!(latency.timeout_ms * 1e6 >= (thaw[0].timeout / 2).as_nanos() as f64);
    assert_eq!(latency.late_by_action.get("thaw").copied().unwrap_or(0), 0);
    assert_eq!(latency.late, 0, "{latency:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_freeze_times_out_and_is_escalated_to_a_stop() {
    let mut a = agent(two_gpus());
    let (low, _low_client) = a.running(10, Some(0));
    let (_high, _high_client) = a.running(4, Some(0));
    let freeze = a.host.submitted(low, ActionKind::Freeze).remove(0);
    // Not before its timeout...
    tokio::time::advance(freeze.timeout - std::time::Duration::from_micros(1)).await;
    assert!(a.host.timed_out().is_empty());
    // ...and at it: the actuation thread reports it unconfirmed, and the daemon
    // escalates in that step.
    tokio::time::advance(std::time::Duration::from_micros(1)).await;
    let reports = a.host.timed_out();
    assert_eq!(reports.len(), 1);
    assert!(a.host.submitted(low, ActionKind::Stop).is_empty());
    for r in reports {
        a.daemon.confirmed(r);
    }
    assert_eq!(a.host.submitted(low, ActionKind::Stop).len(), 1, "SIGSTOP");
    // Still RUNNING until the stop (or the freeze) shows.
    let t = a.task(low);
    assert_eq!(
        (t.state.as_str(), t.in_flight),
        ("RUNNING", Some(ActionKind::Stop))
    );
    a.confirm(low, ActionKind::Stop);
    assert_eq!(a.state(low), "PREEMPTED");
    // The freeze showing after all changes nothing (its decision was recorded
    // when it timed out).
    a.confirm(low, ActionKind::Freeze);
    assert_eq!(a.state(low), "PREEMPTED");
    let decisions = match a.request(Request::History(low)).pop() {
        Some(Reply::History(h)) => h.decisions,
        other => panic!("{other:?}"),
    };
    let seen: Vec<(&str, bool)> = decisions
        .iter()
        .map(|d| (d.action.as_str(), d.confirmation_ns.is_some()))
        .collect();
    assert_eq!(seen, [("place", false), ("freeze", false), ("stop", true)]);
}

#[tokio::test(start_paused = true)]
async fn after_the_fail_safe_thawed_everything_what_the_core_holds_frozen_is_frozen_again() {
    let mut a = agent(two_gpus());
    let (frozen, _c1) = a.running(10, Some(0));
    let (holder, _c2) = a.running(4, Some(0));
    a.confirm(frozen, ActionKind::Freeze);
    // Being frozen (in flight), not yet confirmed.
    let (freezing, _c3) = a.running(12, Some(0));
    assert_eq!(a.host.submitted(freezing, ActionKind::Freeze).len(), 1);
    let (elsewhere, _c4) = a.running(6, Some(1));
    let calls_before = a.host.calls().len();
    let submitted_before = a.submitted();
    a.daemon.refreeze_after_failsafe();
    let calls = a.host.calls()[calls_before..].to_vec();
    // The fail-safe consumed the stopped list; both held ones are frozen again,
    // without feedback; nothing else is touched.
    assert_eq!(
        calls,
        vec![
            Call::ForgetStopped,
            Call::Refreeze(frozen),
            Call::Refreeze(freezing)
        ]
    );
    assert_eq!(a.submitted(), submitted_before, "no new decision");
    assert_eq!(a.state(frozen), "PREEMPTED");
    assert_eq!(a.state(holder), "RUNNING");
    assert_eq!(a.state(elsewhere), "RUNNING");
    // The freeze in flight still completes as before.
    a.confirm(freezing, ActionKind::Freeze);
    assert_eq!(a.state(freezing), "PREEMPTED");
}

#[tokio::test(start_paused = true)]
async fn stopping_the_agent_thaws_every_task() {
    let mut a = agent(two_gpus());
    let (low, _c1) = a.running(10, Some(0));
    let (high, _c2) = a.running(4, Some(0));
    a.confirm(low, ActionKind::Freeze);
    let before = a.host.calls().len();
    a.daemon.shutdown();
    assert_eq!(
        a.host.calls()[before..],
        [
            Call::SetFrozen {
                id: low,
                frozen: false
            },
            Call::SetFrozen {
                id: high,
                frozen: false
            },
            Call::ForgetStopped,
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_delays_neither_status_nor_decisions() {
    let mut a = agent(two_gpus());
    // Never read until the end: its notices pile up past its queue.
    let (silent, mut silent_client) = a.running(10, Some(0));
    // Others that never read at all, on the other GPU.
    let mut crowd: Vec<Client> = (0..50).map(|_| a.running(9, Some(1)).1).collect();
    let cycles = NOTICE_QUEUE;
    for i in 0..cycles {
        let (high, _high_client) = a.running(4, Some(0));
        assert_eq!(
            a.host.submitted(silent, ActionKind::Freeze).len(),
            i + 1,
            "the freeze of cycle {i} was decided"
        );
        a.confirm(silent, ActionKind::Freeze);
        // Answered at once, with every task, whoever is not reading.
        let status = a.status();
        assert_eq!(status.tasks.len(), 52 + i, "cycle {i}");
        a.exit(high, 0);
        assert_eq!(
            a.host.submitted(silent, ActionKind::Thaw).len(),
            i + 1,
            "the thaw of cycle {i} was decided"
        );
        a.confirm(silent, ActionKind::Thaw);
        assert_eq!(a.state(silent), "RUNNING");
    }
    a.exit(silent, 0);
    // What it is owed is kept; only the excess of notices is dropped, and it
    // hears how many first.
    let told = silent_client.rx.drain();
    let sent = 1 + 2 * cycles as u64; // placed, then frozen and resumed per cycle
    assert_eq!(
        told.first(),
        Some(&Reply::Notice(Notice::Dropped {
            count: sent - NOTICE_QUEUE as u64
        }))
    );
    assert_eq!(notices(&told).len(), NOTICE_QUEUE + 1);
    assert!(
        matches!(told[told.len() - 2], Reply::Accepted(_)),
        "{told:?}"
    );
    assert_eq!(told.last(), Some(&Reply::ExitCode(0)));
    for c in &mut crowd {
        assert!(matches!(c.rx.drain().last(), Some(Reply::Accepted(_))));
    }
}

#[tokio::test(start_paused = true)]
async fn late_binding_queues_unbound_held_tasks_and_status_lists_them() {
    let mut a = agent(SchedConfig {
        binding: keling_sched::Binding::Late,
        ..two_gpus()
    });
    let (first, _c1) = a.running(8, None);
    let (second, _c2) = a.running(8, None);
    let first_gpu = a.task(first).gpu.expect("bound at once");
    let second_gpu = a.task(second).gpu.expect("bound at once");
    assert_ne!(first_gpu, second_gpu);
    // Both GPUs are held: two more wait unbound, held before exec.
    let (third, mut c3) = a.launch(8, None);
    let (fourth, mut c4) = a.launch(8, None);
    for (id, pid) in [(third, a.host.pid(third)), (fourth, a.host.pid(fourth))] {
        assert!(a.host.calls().contains(&Call::Start {
            id,
            pid,
            env_gpu: EnvGpu::AtPlacement
        }));
        assert!(
            !a.host
                .calls()
                .iter()
                .any(|c| matches!(c, Call::Release { id: r, .. } if *r == id)),
            "task {id} released while queued"
        );
    }
    match notices(&c3.rx.drain()).as_slice() {
        [
            Notice::Queued {
                position: 1,
                ahead: 0,
                ..
            },
        ] => {}
        other => panic!("{other:?}"),
    }
    match notices(&c4.rx.drain()).as_slice() {
        [
            Notice::Queued {
                position: 2,
                ahead: 1,
                ..
            },
        ] => {}
        other => panic!("{other:?}"),
    }
    // Status answers with the queue: unbound, pending, in order.
    let status = a.status();
    let queued: Vec<(TaskId, &str, Option<u32>, Option<usize>)> = status
        .tasks
        .iter()
        .map(|t| {
            (
                t.id,
                t.state.as_str(),
                t.gpu,
                t.queued.as_ref().map(|q| q.position),
            )
        })
        .collect();
    assert_eq!(
        queued,
        vec![
            (first, "RUNNING", Some(first_gpu), None),
            (second, "RUNNING", Some(second_gpu), None),
            (third, "PENDING", None, Some(1)),
            (fourth, "PENDING", None, Some(2)),
        ]
    );
    assert!(
        a.host.actuations().is_empty(),
        "nothing frozen: {:?}",
        a.host.actuations()
    );

    // The first GPU to free takes the oldest queued task, in the same step, its
    // GPU written in at the release.
    let before = a.host.calls().len();
    a.exit(first, 0);
    assert_eq!(
        a.host.calls()[before..],
        [
            Call::Release {
                id: third,
                gpu: Some(first_gpu)
            },
            Call::Forget(first),
        ]
    );
    a.daemon.woken(Wake::Exec(third, Ok(())));
    let told = c3.rx.drain();
    assert!(
        matches!(notices(&told)[..], [Notice::Placed { gpu, .. }] if *gpu == first_gpu),
        "{told:?}"
    );
    assert!(
        matches!(told.last(), Some(Reply::Accepted(acc)) if acc.gpu == Some(first_gpu)),
        "{told:?}"
    );

    // A queued task that is signalled is killed before it ran anything.
    let replies = a.request(Request::Signal(SignalRequest {
        task: fourth,
        signal: libc::SIGTERM,
    }));
    assert_eq!(replies, vec![Reply::Signalled(1)]);
    assert_eq!(a.host.calls().last(), Some(&Call::Cancel(fourth)));
    a.exit(fourth, 128 + libc::SIGKILL);
    match c4.rx.drain().as_slice() {
        [Reply::Error(why)] => {
            assert_eq!(why.kind, ErrorKind::NeverRan);
            assert!(why.message.contains("never ran"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !a.host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Release { id, .. } if *id == fourth))
    );
}

#[tokio::test(start_paused = true)]
async fn forwarded_signals_reach_the_launched_task_only() {
    let mut a = agent(two_gpus());
    let (id, client) = a.running(5, Some(0));
    let incoming = Incoming {
        request: Request::Forward(libc::SIGINT),
        fds: Vec::new(),
        peer: root(),
        reply: Replier::detached(),
        conn: client.conn,
    };
    a.daemon.handle(incoming, &mut |_| Ok(()));
    assert_eq!(
        a.host.calls().last(),
        Some(&Call::Signal {
            id,
            signal: libc::SIGINT
        })
    );
}

/// A launch pinned to a GPU the host does not have is refused with the list of
/// those it has, and nothing is started (it would never have been scheduled
/// against anyone: `--gpu 99` on a 2-GPU host bought immunity).
#[tokio::test(start_paused = true)]
async fn a_launch_on_a_gpu_the_host_does_not_have_is_refused_with_the_list() {
    let mut a = agent(two_gpus());
    for gpu in [2, 7, 99, u32::MAX] {
        let replies = a.request(Request::Launch(launch_request(5, Some(gpu))));
        match replies.as_slice() {
            [Reply::Error(e)] => {
                assert_eq!(e.kind, ErrorKind::Invalid, "{e:?}");
                assert!(
                    e.message.contains(&format!("GPU {gpu} does not exist"))
                        && e.message.contains("0, 1"),
                    "{}",
                    e.message
                );
            }
            other => panic!("--gpu {gpu} answered {other:?}"),
        }
    }
    assert!(a.host.calls().is_empty(), "{:?}", a.host.calls());
    let (id, _client) = a.running(5, Some(1));
    assert_eq!(a.task(id).gpu, Some(1));
}

/// 100 000 short tasks arrive and exit, 10 000 a second (a harsher burst than
/// issue 32's 25 000 `true` in a minute). Status stays small whatever happened:
/// the archive is capped by count, the reply lists the newest archived tasks and
/// counts the rest.
#[tokio::test(start_paused = true)]
async fn a_burst_of_short_tasks_leaves_a_bounded_archive_and_a_small_status() {
    const TASKS: u64 = 100_000;
    let mut a = agent(two_gpus());
    for id in 1..=TASKS {
        // Ids count up from 1 (no launch here fails).
        a.handle(
            Request::Launch(launch_request(8, None)),
            Replier::detached(),
        );
        a.daemon.woken(Wake::Exec(id, Ok(())));
        a.exit(id, if id % 10 == 0 { 1 } else { 0 });
        if id % 100 == 0 {
            tokio::time::advance(std::time::Duration::from_millis(10)).await;
            a.daemon.tick();
        }
    }
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    a.daemon.tick();
    let started = std::time::Instant::now();
    let status = a.status();
    let bytes = serde_json::to_vec(&Reply::Status(Box::new(status.clone())))
        .unwrap()
        .len();
    eprintln!(
        "status of {TASKS} tasks: {bytes} bytes, built and serialised in {:?}",
        started.elapsed()
    );
    assert!(
        bytes <= 128 << 10,
        "the status reply is {bytes} bytes after {TASKS} tasks"
    );
    // The archived tasks that finished last are listed, by id.
    let shown: Vec<TaskId> = status.tasks.iter().map(|t| t.id).collect();
    let newest = |n: usize, skip: usize| {
        let last = TASKS - skip as u64;
        (last + 1 - n as u64..=last).collect::<Vec<TaskId>>()
    };
    assert_eq!(shown, newest(STATUS_ARCHIVED_DEFAULT, 0));
    assert!(status.tasks.iter().all(|t| t.state == "ARCHIVED"));
    // Capped by count (the retention window is an hour), the rest counted.
    let max = crate::defaults::ARCHIVE_MAX;
    assert_eq!(
        status.archive,
        ArchiveSummary {
            kept: max,
            listed: STATUS_ARCHIVED_DEFAULT,
            skipped: 0,
            max_kept: max,
            retention_s: 3600,
            completed: TASKS - TASKS / 10,
            failed: TASKS / 10,
            forgotten: TASKS - max as u64,
        }
    );
    // More on request, a page at a time, never more than a reply's limit.
    let page = |a: &mut Agent, archived, skip| match &a
        .request(Request::StatusPage(StatusPage { archived, skip }))[..]
    {
        [Reply::Status(s)] => s.tasks.iter().map(|t| t.id).collect::<Vec<TaskId>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(page(&mut a, usize::MAX, 0).len(), STATUS_ARCHIVED_MAX);
    assert_eq!(page(&mut a, 1000, max - 3), newest(3, max - 3));
    assert_eq!(page(&mut a, 20, 100), newest(20, 100));
    assert!(page(&mut a, 10, usize::MAX).is_empty());
    // A forgotten task is not found, and the error says what is kept.
    match &a.request(Request::History(1))[..] {
        [Reply::Error(e)] => {
            assert_eq!(e.kind, ErrorKind::NotFound);
            assert!(e.message.contains(&format!("the last {max}")), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

/// Memory that processes in no task hold reaches the core at the next tick
/// (once per change), and `keling status` shows it per GPU beside what tasks
/// hold: a launch whose budget no longer fits beside it waits, for memory.
#[test]
fn memory_outside_tasks_reaches_the_core_and_status_per_gpu() {
    use keling_common::{EventHeader, EventKind, nvidia::escape};

    use crate::event::decode::{Event, GpuAllocEvent, MemKind};

    let gib = 1u64 << 30;
    let mut a = agent(one_gpu_shared_by_memory(8 * gib));
    let (first, _c1) = a.running(8, None);
    let outside = Event::GpuAlloc(GpuAllocEvent {
        header: EventHeader {
            kind: EventKind::GpuAlloc as u32,
            cpu: 0,
            ts_ns: a.host.now_ns(),
            pid: 4242,
            tid: 4242,
        },
        client: 1,
        parent: 2,
        handle: 3,
        class: 0x40,
        mem_kind: MemKind::Video,
        gpu: Some(0),
        escape: escape::ALLOC,
        via_xfer: false,
        bytes: 5 * gib,
    });
    a.daemon.on_event(&outside);
    assert_eq!(a.status().gpus[0].outside_bytes, 0, "told at the next tick");
    a.daemon.tick();
    let gpus = a.status().gpus;
    assert_eq!(gpus.len(), 1);
    assert_eq!(
        (
            gpus[0].capacity_bytes,
            gpus[0].tasks_bytes,
            gpus[0].outside_bytes,
            gpus[0].free_bytes
        ),
        (8 * gib, 0, 5 * gib, 3 * gib)
    );
    // 5 GiB outside and a first task: a 4 GiB budget does not fit beside it.
    let (reply, _rx) = Replier::for_test();
    a.handle(
        Request::Launch(LaunchRequest {
            mem_quota_bytes: Some(4 * gib),
            ..launch_request(8, None)
        }),
        reply,
    );
    let waiting = a
        .status()
        .tasks
        .into_iter()
        .find(|t| t.id != first)
        .expect("the second launch");
    assert_eq!(
        waiting.wait_reason,
        Some(keling_sched::WaitReason::Memory),
        "{waiting:?}"
    );
}

/// What the Slurm report judges memory pressure by: per GPU, what it holds,
/// the tasks placed on (or pinned to) it that wait for memory, and the
/// allocations of its tasks the driver refused for lack of memory.
#[test]
fn memory_pressure_counts_tasks_waiting_for_memory_and_refused_allocations() {
    use keling_common::{
        EventHeader, EventKind,
        nvidia::{escape, status},
    };

    use crate::event::decode::{Call, DeviceFile, Event, GpuIoctlEvent, IoctlOutcome};

    let gib = 1u64 << 30;
    let mut a = agent(one_gpu_shared_by_memory(8 * gib));
    let (first, _c1) = a.running(8, Some(0));
    let quiet = a.daemon.memory_pressure();
    assert_eq!((quiet.len(), quiet[0].waiting, quiet[0].refused), (1, 0, 0));
    // The first holds nothing: a 4 GiB budget fits beside it, then an 8 GiB one
    // pinned to the GPU does not and waits for memory.
    let (reply, _rx) = Replier::for_test();
    a.handle(
        Request::Launch(LaunchRequest {
            mem_quota_bytes: Some(4 * gib),
            ..launch_request(8, Some(0))
        }),
        reply,
    );
    let (reply, _rx1) = Replier::for_test();
    a.handle(
        Request::Launch(LaunchRequest {
            mem_quota_bytes: Some(8 * gib),
            ..launch_request(8, Some(0))
        }),
        reply,
    );
    let pid = a.task(first).pid;
    a.daemon.tick();
    let waiting = a.daemon.memory_pressure();
    let reasons: Vec<_> = a.status().tasks.iter().map(|t| t.wait_reason).collect();
    assert_eq!(waiting[0].waiting, 1, "{reasons:?}");
    assert_eq!(waiting[0].refused, 0);
    // The driver refuses the first task a GiB for lack of memory.
    a.daemon.on_event(&Event::GpuIoctl(GpuIoctlEvent {
        header: EventHeader {
            kind: EventKind::GpuIoctl as u32,
            cpu: 0,
            ts_ns: a.host.now_ns(),
            pid,
            tid: pid,
        },
        fd: 3,
        device: DeviceFile::Ctl,
        call: Call::Rm(escape::ALLOC),
        cmd: 0xC030_462B,
        control_cmd: None,
        class: 0x40,
        gpu: Some(0),
        status: status::NO_MEMORY,
        outcome: IoctlOutcome::Decoded,
        via_xfer: false,
        ret: 0,
        requested_bytes: gib,
    }));
    assert_eq!(a.daemon.memory_pressure()[0].refused, 1);
}

/// `request` on a fresh connection from `peer`; the connection.
fn handle_as(a: &mut Agent, request: Request, reply: Replier, peer: Peer) -> u64 {
    let conn = a.next_conn;
    a.next_conn += 1;
    let incoming = Incoming {
        request,
        fds: Vec::new(),
        peer,
        reply,
        conn,
    };
    a.daemon.handle(incoming, &mut |_| Ok(()));
    conn
}

fn user(uid: u32) -> Peer {
    Peer {
        creds: Credentials {
            uid,
            gid: uid,
            groups: Vec::new(),
        },
        pid: None,
    }
}

/// Issue 32, defect 7 (restart): a task an earlier agent launched is taken back
/// from its record with its owner, priority, GPU, quota and the memory the
/// kernel's books hold (marked unsure: the gap was not seen); a stale record is
/// dropped; only its owner may attach to it; new tasks get later ids; the core
/// schedules it (a higher priority freezes it); and its end, which this agent
/// cannot reap, reaches its client as an unknown status, not a made-up code.
#[tokio::test(start_paused = true)]
async fn a_task_taken_back_from_its_record_is_scheduled_and_only_its_owner_attaches() {
    use std::collections::BTreeMap;

    use keling_sched::TaskSpec;

    use crate::{
        control::AttachRequest,
        os::proc::ProcessFacts,
        sched::{
            host::fake::Process,
            records::{Found, TaskRecord, VERSION},
        },
    };
    let mut a = agent(two_gpus());
    a.host.add_process(
        4242,
        Process {
            facts: ProcessFacts::default(),
            uid: 1000,
            start_ticks: 77,
            started_ns: 0,
        },
    );
    let rec = TaskRecord {
        version: VERSION,
        spec: TaskSpec {
            id: 7,
            pid: 4242,
            name: "train".into(),
            priority: 9,
            gpu: Some(1),
            mem_quota_bytes: Some(1 << 30),
            max_duration_ms: Some(600_000),
            grace_ms: None,
            hard_kill: None,
            expected_runtime_ms: None,
        },
        start_ticks: 77,
        cgroup: "/fake/keling/task-99-7".into(),
        uid: 1000,
        slurm: Some(crate::control::SlurmRef {
            job: 12,
            step: 0,
            task: 3,
        }),
    };
    // The same pid started at another time: another process now.
    let mut stale = rec.clone();
    stale.spec.id = 5;
    stale.start_ticks = 78;
    let taken = a.daemon.take_back(
        Found {
            records: vec![stale, rec],
            refused: Vec::new(),
        },
        &|pids| {
            if pids.contains(&4242) {
                BTreeMap::from([(1, 128 << 20)])
            } else {
                BTreeMap::new()
            }
        },
        &mut |_, _| Ok(()),
    );
    assert_eq!(taken.tasks, vec![7]);
    assert_eq!(taken.dropped.len(), 1, "{:?}", taken.dropped);
    assert!(
        taken.dropped[0].1.contains("another process"),
        "{:?}",
        taken.dropped
    );
    let t = a.task(7);
    assert_eq!(
        (t.state.as_str(), t.gpu, t.uid, t.priority),
        ("RUNNING", Some(1), Some(1000), 9)
    );
    assert_eq!((t.mem_bytes, t.mem_unsure), (128 << 20, true));
    // Still the Slurm job's task: its memory is inside Slurm's jobs.
    assert_eq!(
        a.daemon.members.get(7).and_then(|m| m.slurm),
        Some(crate::control::SlurmRef {
            job: 12,
            step: 0,
            task: 3
        })
    );
    // Another user may not attach; its owner may, and hears `accepted` at once.
    let attach = || {
        Request::Attach(AttachRequest {
            task: 7,
            pid: 4242,
            notify_preempt: true,
        })
    };
    let (reply, mut rx) = Replier::for_test();
    handle_as(&mut a, attach(), reply, user(1001));
    match rx.drain().as_slice() {
        [Reply::Error(e)] => assert_eq!(e.kind, ErrorKind::NotPermitted, "{e}"),
        other => panic!("another user's attach answered {other:?}"),
    }
    let (reply, mut owner) = Replier::for_test();
    handle_as(&mut a, attach(), reply, user(1000));
    assert_eq!(
        owner.drain(),
        vec![Reply::Accepted(crate::control::Accepted {
            task: 7,
            gpu: Some(1),
            pid: 4242
        })]
    );
    // One client per task: a second attach is refused.
    let (reply, mut rx) = Replier::for_test();
    handle_as(&mut a, attach(), reply, user(1000));
    match rx.drain().as_slice() {
        [Reply::Error(e)] => assert_eq!(e.kind, ErrorKind::Refused, "{e}"),
        other => panic!("a second attach answered {other:?}"),
    }
    // New launches come after it; a higher priority on its GPU freezes it.
    let (high, _c) = a.running(0, Some(1));
    assert_eq!(high, 8);
    assert_eq!(a.host.submitted(7, ActionKind::Freeze).len(), 1);
    a.confirm(7, ActionKind::Freeze);
    assert!(matches!(
        notices(&owner.drain()).as_slice(),
        [Notice::Frozen { task: 7, .. }]
    ));
    a.exit(high, 0);
    a.confirm(7, ActionKind::Thaw);
    // It ends; not our child, and the trace did not say how: unknown.
    a.exit(7, 0);
    match owner.drain().as_slice() {
        [.., Reply::Error(e)] => assert_eq!(e.kind, ErrorKind::ExitUnknown, "{e}"),
        other => panic!("the end of a task taken back answered {other:?}"),
    }
    assert!(a.host.calls().contains(&Call::Forget(7)));
}
