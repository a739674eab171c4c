//! `keling status`: what the running agent is doing; `keling status TASK`: one
//! task's history.
//!
//! The tables are rendered by pure functions of the agent's reply
//! ([`render_status`], [`render_history`]), so a test can feed them a constructed
//! state and compare the text exactly.
use std::path::PathBuf;

use anyhow::bail;

use super::human;
use crate::control::{
    ExportFormat, Reply, Request, STATUS_ARCHIVED_DEFAULT, STATUS_ARCHIVED_MAX, StatusPage,
    StatusReply, TaskHistory, TaskRef, TaskStatus, Waiting, client::Connection,
};

#[derive(Debug, clap::Args)]
#[command(after_help = JSON_FIELDS)]
pub struct StatusArgs {
    /// Show this task's history instead: its transitions with their reasons and
    /// times, and its decisions with their latencies.
    #[arg(value_name = "TASK")]
    pub task: Option<u64>,
    /// Print the agent's reply as JSON (fields below).
    #[arg(long)]
    pub json: bool,
    /// Print the decision-latency histograms instead, in this format.
    #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "task")]
    pub export: Option<ExportFormat>,
    /// List the N archived (finished) tasks that finished last, at most 1000
    /// (default 50; every live task is always listed; all by id).
    #[arg(long, value_name = "N", conflicts_with_all = ["task", "export"])]
    pub archived: Option<usize>,
    /// Skip this many of the archived tasks that finished last (the next page).
    #[arg(long, value_name = "N", conflicts_with_all = ["task", "export"])]
    pub skip: Option<usize>,
    /// List as many archived tasks as one reply holds (the last 1000 to finish).
    #[arg(long, conflicts_with_all = ["archived", "task", "export"])]
    pub all: bool,
    /// The agent's control socket (default: the instance's, `/run/keling/keling.sock`
    /// or `/run/keling/NAME/keling.sock` with `--instance NAME`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Wait up to this long for an agent that is starting to answer (scripts that
    /// start `keling run` and then use it), s; 0: ask once.
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub wait: u64,
}

/// `--help`'s list of the JSON fields (docs/scheduler.md, "`keling status`", points here).
const JSON_FIELDS: &str = "\
--json fields (bytes, ms and ns are plain integers):
  caller_uid                the uid asking (SO_PEERCRED)
  tasks[]: id, pid, name, uid, mine (the caller's), priority, class, state
    (PENDING, RUNNING, PREEMPTED, COMPLETED, FAILED, ARCHIVED), state_for_ms, gpu,
    mem_bytes, mem_bytes_per_gpu, mem_unsure (only when true), elapsed_ms, on_gpu_ms, wants_gpu, yielded, in_flight
    (Freeze, Thaw, Stop or null), cgroup, ending_reason, exit_code,
    waiting (PREEMPTED only): {reason, behind: [{task, name, priority}], for_ms}
    queued (late binding; unbound tasks only, state PENDING): {id, position (1:
    bound next), ahead, reason (slots_held, memory, higher_priority, ending)}
    wait_reason (tasks that wait, queued or bound: memory, slots_held = a cap,
    higher_priority, ending), pinned_gpu (the GPU a launch or rule pinned it to)
  latency: timeout_ms, model, late, decisions, stages, by_action, late_by_action
  stages_by_action, placement: {weights: [[gpu, weight]], load_balance_error}
  gpus[]: {gpu, capacity_bytes, tasks_bytes (held by live tasks, frozen ones
    included), outside_bytes (held by processes in no task), free_bytes}
  archive: {kept, listed, skipped, max_kept, retention_s, completed, failed,
    forgotten} (tasks[] lists every live task, then the `listed` archived tasks
    that finished last after `skipped`; the counts are since the agent started)
With TASK: {task: (as above), arrived_ns, transitions: [{event_id, task, name, pid,
  gpu, priority, from, to, reason, timestamp_ns, exit_code}], decisions: [{action,
  decided_ns, delivery_ns, decision_ns, actuation_ns, confirmation_ns,
  end_to_end_ns, timeout_ns, late}], transitions_dropped, decisions_dropped}";

pub fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let socket = (args.socket.clone()).unwrap_or_else(|| crate::instance::current().socket());
    let archived = if args.all {
        Some(STATUS_ARCHIVED_MAX)
    } else {
        args.archived
    };
    if archived.is_some_and(|n| n > STATUS_ARCHIVED_MAX) {
        bail!("--archived lists at most {STATUS_ARCHIVED_MAX} tasks: use --skip for the next ones");
    }
    let request = match (args.export, args.task) {
        (Some(f), _) => Request::Export(f),
        (None, Some(id)) => Request::History(id),
        // Plain `{"status": true}` when no page is asked for (an older agent reads it).
        (None, None) if archived.is_none() && args.skip.is_none() => Request::Status(true),
        (None, None) => Request::StatusPage(StatusPage {
            archived: archived.unwrap_or(STATUS_ARCHIVED_DEFAULT),
            skip: args.skip.unwrap_or(0),
        }),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(args.wait);
    let reply = loop {
        match Connection::request(&socket, &request, &[]) {
            Ok(c) => break c.one()?,
            // Not listening yet (no socket, or one nobody accepts on).
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    };
    let text = match reply {
        Reply::Export(text) => text,
        Reply::Status(s) if args.json => serde_json::to_string_pretty(&s)? + "\n",
        Reply::Status(s) => render_status(&s, &crate::os::users::name_of_uid),
        Reply::History(h) if args.json => serde_json::to_string_pretty(&h)? + "\n",
        Reply::History(h) => render_history(&h, &crate::os::users::name_of_uid),
        other => bail!("unexpected reply from the agent: {other:?}"),
    };
    print!("{text}");
    Ok(0)
}

/// `task 5 (infer, priority 1)`.
fn task_ref(t: &TaskRef) -> String {
    format!("task {} ({}, priority {})", t.task, t.name, t.priority)
}

/// The user column: a name when `user_name` knows one, else the uid.
fn user(uid: Option<u32>, user_name: &dyn Fn(u32) -> Option<String>) -> String {
    match uid {
        Some(u) => user_name(u).unwrap_or_else(|| u.to_string()),
        None => "-".into(),
    }
}

/// Why a preempted task waits: `preempted by a higher priority; behind task 5
/// (infer, priority 1)`.
fn waiting_text(w: &Waiting) -> String {
    let behind = match w.behind.as_slice() {
        [] => String::new(),
        [one] => format!("; behind {}", task_ref(one)),
        [first, rest @ ..] => format!("; behind {} and {} more", task_ref(first), rest.len()),
    };
    format!("{}{behind}", human::reason(w.reason))
}

/// The NOTE column: why a task waits, what is in flight, why it is ending, how it
/// ended.
fn note(t: &TaskStatus) -> String {
    let mut parts = Vec::new();
    if let Some(q) = &t.queued {
        parts.push(format!(
            "queued unbound, position {} (behind {}): {}",
            q.position,
            human::jobs(q.ahead),
            human::wait_reason(q.reason)
        ));
    }
    if let Some(w) = &t.waiting {
        parts.push(waiting_text(w));
    }
    if t.queued.is_none()
        && let Some(r) = t.wait_reason
    {
        parts.push(format!(
            "waits for {}{}",
            human::waits_for(r),
            t.pinned_gpu
                .map_or(String::new(), |g| format!(" on its pinned GPU {g}"))
        ));
    }
    if t.yielded {
        parts.push("idle: yielded its slot, not frozen".into());
    }
    if t.mem_unsure {
        parts.push("GPU memory figure unsure (a kernel table was full): quota not enforced".into());
    }
    match t.in_flight {
        Some(keling_sched::ActionKind::Freeze | keling_sched::ActionKind::Stop) => {
            parts.push("being frozen".into())
        }
        Some(keling_sched::ActionKind::Thaw) => parts.push("being resumed".into()),
        _ => {}
    }
    if let Some(r) = t.ending_reason {
        parts.push(format!("ended by Keling: {}", human::reason(r)));
    }
    if let Some(code) = t.exit_code {
        parts.push(human::exit_code(code));
    }
    parts.join("; ")
}

/// `keling status` as text: one aligned row per task (`*` marks the caller's),
/// then the decision latency and placement. Pure: the same reply gives the same
/// text (`user_name` resolves uids).
pub fn render_status(s: &StatusReply, user_name: &dyn Fn(u32) -> Option<String>) -> String {
    let rows: Vec<Vec<String>> = s
        .tasks
        .iter()
        .map(|t| {
            vec![
                if t.mine { "*" } else { "" }.to_string(),
                t.id.to_string(),
                t.pid.to_string(),
                user(t.uid, user_name),
                t.name.clone(),
                if t.queued.is_some() {
                    "QUEUED".into()
                } else {
                    t.state.clone()
                },
                human::duration_ms(t.state_for_ms),
                t.priority.to_string(),
                t.gpu.map_or("-".into(), |g| g.to_string()),
                human::bytes(t.mem_bytes),
                human::duration_ms(t.elapsed_ms),
                human::duration_ms(t.on_gpu_ms),
                note(t),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no tasks\n".to_string()
    } else {
        human::table(
            &[
                "", "TASK", "PID", "USER", "NAME", "STATE", "FOR", "PRIO", "GPU", "GPU MEM",
                "TIME", "ON GPU", "NOTE",
            ],
            &[
                false, true, true, false, false, false, true, true, true, true, true, true, false,
            ],
            &rows,
        )
    };
    if s.tasks.iter().any(|t| t.mine) {
        out.push_str("* your tasks\n");
    }
    let a = &s.archive;
    if a.kept > a.listed || a.skipped > 0 || a.forgotten > 0 {
        out.push_str(&format!(
            "finished tasks: {} kept (the last {} for {}), {} of them listed{}; since the \
             agent started {} completed, {} failed, {} forgotten\n\
             (--archived N and --skip M list others, --all the last {STATUS_ARCHIVED_MAX})\n",
            a.kept,
            a.max_kept,
            human::duration_ms(a.retention_s.saturating_mul(1000)),
            a.listed,
            if a.skipped > 0 {
                format!(" after the last {} skipped", a.skipped)
            } else {
                String::new()
            },
            a.completed,
            a.failed,
            a.forgotten,
        ));
    }
    let l = &s.latency;
    out.push_str(&format!(
        "\ndecision timeout {} ({} model); {} late of {} decisions\n",
        human::latency_ns((l.timeout_ms * 1e6).round() as u64),
        l.model,
        l.late,
        l.decisions
    ));
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| human::latency_ns((v * 1e6).round() as u64));
    let latency_rows: Vec<Vec<String>> = l
        .by_action
        .iter()
        .filter(|(_, p)| p.count > 0)
        .map(|(action, p)| {
            vec![
                action.clone(),
                p.count.to_string(),
                ms(p.p50_ms),
                ms(p.p90_ms),
                ms(p.p99_ms),
                ms(p.max_ms),
                l.late_by_action
                    .get(action)
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
            ]
        })
        .collect();
    if !latency_rows.is_empty() {
        out.push_str(&human::table(
            &["ACTION", "COUNT", "P50", "P90", "P99", "MAX", "LATE"],
            &[false, true, true, true, true, true, true],
            &latency_rows,
        ));
    }
    if !s.placement.weights.is_empty() {
        let weights: Vec<String> = s
            .placement
            .weights
            .iter()
            .map(|(g, w)| format!("GPU {g} {w:.3}"))
            .collect();
        out.push_str(&format!(
            "placement weights (higher is better): {}; load-balance error {:.3}\n",
            weights.join(", "),
            s.placement.load_balance_error
        ));
    }
    out.push_str(&gpu_memory_table(&s.gpus));
    out
}

/// Per GPU: capacity, memory held by tasks, held outside any task, free.
fn gpu_memory_table(gpus: &[crate::control::GpuMemoryStatus]) -> String {
    if gpus.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            vec![
                g.gpu.to_string(),
                human::bytes(g.capacity_bytes),
                human::bytes(g.tasks_bytes),
                human::bytes(g.outside_bytes),
                human::bytes(g.free_bytes),
            ]
        })
        .collect();
    format!(
        "\n{}",
        human::table(
            &["GPU", "CAPACITY", "TASKS", "OUTSIDE TASKS", "FREE"],
            &[true, true, true, true, true],
            &rows,
        )
    )
}

/// `+1.50 s` from the task's arrival.
fn since(ts_ns: u64, arrived_ns: u64) -> String {
    format!(
        "+{}",
        human::duration_ms(ts_ns.saturating_sub(arrived_ns) / 1_000_000)
    )
}

/// `keling status TASK` as text: the task now, its transitions (times from its
/// arrival) and its decisions with their latency by stage. Pure.
pub fn render_history(h: &TaskHistory, user_name: &dyn Fn(u32) -> Option<String>) -> String {
    let t = &h.task;
    let mut out = format!(
        "task {} {} (pid {}, user {}{}), priority {}, GPU {}\n",
        t.id,
        t.name,
        t.pid,
        user(t.uid, user_name),
        if t.mine { ", yours" } else { "" },
        t.priority,
        t.gpu.map_or("-".into(), |g| g.to_string()),
    );
    out.push_str(&format!(
        "{} for {}; ran {}, {} of it on the GPU; GPU memory {}\n",
        t.state,
        human::duration_ms(t.state_for_ms),
        human::duration_ms(t.elapsed_ms),
        human::duration_ms(t.on_gpu_ms),
        human::bytes(t.mem_bytes),
    ));
    let n = note(t);
    if !n.is_empty() {
        out.push_str(&format!("{n}\n"));
    }
    out.push_str("\ntransitions\n");
    if h.transitions_dropped > 0 {
        out.push_str(&format!("({} earlier not kept)\n", h.transitions_dropped));
    }
    let rows: Vec<Vec<String>> = h
        .transitions
        .iter()
        .map(|tr| {
            vec![
                since(tr.timestamp_ns, h.arrived_ns),
                tr.state_transition(),
                tr.reason.as_str().to_owned(),
                tr.exit_code.map_or(String::new(), |c| c.to_string()),
            ]
        })
        .collect();
    out.push_str(&human::table(
        &["AT", "TRANSITION", "REASON", "EXIT"],
        &[true, false, false, true],
        &rows,
    ));
    out.push_str("\ndecisions (latency from the kernel event that caused each)\n");
    if h.decisions_dropped > 0 {
        out.push_str(&format!("({} earlier not kept)\n", h.decisions_dropped));
    }
    let rows: Vec<Vec<String>> = h
        .decisions
        .iter()
        .map(|d| {
            vec![
                since(d.decided_ns, h.arrived_ns),
                d.action.clone(),
                human::latency_ns(d.end_to_end_ns),
                human::latency_ns(d.delivery_ns),
                human::latency_ns(d.decision_ns),
                human::latency_ns(d.actuation_ns),
                d.confirmation_ns.map_or("-".into(), human::latency_ns),
                if d.late {
                    format!("late (timeout {})", human::latency_ns(d.timeout_ns))
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    out.push_str(&human::table(
        &[
            "AT",
            "ACTION",
            "END TO END",
            "DELIVERY",
            "DECISION",
            "ACTUATION",
            "CONFIRMED",
            "",
        ],
        &[true, false, true, true, true, true, true, false],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use keling_sched::{Reason, TaskState, Transition};

    use super::*;
    use crate::{
        control::{ArchiveSummary, DecisionRecord, PlacementStatus},
        latency::{LatencyStatus, MsPercentiles},
    };

    fn names(uid: u32) -> Option<String> {
        (uid == 1000).then(|| "alice".to_string())
    }

    fn task(id: u64, name: &str, state: &str, priority: u8) -> TaskStatus {
        TaskStatus {
            id,
            pid: 4000 + id as u32,
            name: name.into(),
            priority,
            class: keling_sched::class_of(priority),
            state: state.into(),
            gpu: Some(0),
            mem_bytes: 0,
            mem_bytes_per_gpu: BTreeMap::new(),
            mem_unsure: false,
            on_gpu_ms: 0,
            elapsed_ms: 0,
            wants_gpu: true,
            yielded: false,
            in_flight: None,
            cgroup: None,
            uid: Some(0),
            slurm: None,
            mem_quota_bytes: None,
            mine: false,
            state_for_ms: 0,
            waiting: None,
            queued: None,
            wait_reason: None,
            pinned_gpu: None,
            ending_reason: None,
            exit_code: None,
        }
    }

    /// Three tasks on one GPU: a training job preempted by an inference job of
    /// the caller's, and one that Keling ended at its session limit.
    fn known_state() -> StatusReply {
        let mut train = task(1, "train", "PREEMPTED", 8);
        train.mem_bytes = 3 << 30;
        train.elapsed_ms = 125_000;
        train.on_gpu_ms = 118_400;
        train.state_for_ms = 1_250;
        train.waiting = Some(Waiting {
            reason: Reason::PreemptedByHigherPriority,
            behind: vec![TaskRef {
                task: 2,
                name: "infer".into(),
                priority: 3,
            }],
            for_ms: 1_250,
        });
        let mut infer = task(2, "infer", "RUNNING", 3);
        infer.uid = Some(1000);
        infer.mine = true;
        infer.mem_bytes = 512 << 20;
        infer.elapsed_ms = 1_300;
        infer.on_gpu_ms = 1_250;
        infer.state_for_ms = 1_250;
        let mut capped = task(3, "render", "FAILED", 10);
        capped.uid = Some(1000);
        capped.mine = true;
        capped.elapsed_ms = 1_502;
        capped.on_gpu_ms = 1_502;
        capped.state_for_ms = 40;
        capped.ending_reason = Some(Reason::DurationLimit);
        capped.exit_code = Some(137);
        let freeze = MsPercentiles {
            p50_ms: Some(0.412),
            p90_ms: Some(0.9),
            p99_ms: Some(2.31),
            max_ms: Some(2.31),
            count: 12,
        };
        StatusReply {
            caller_uid: Some(1000),
            tasks: vec![train, infer, capped],
            latency: LatencyStatus {
                timeout_ms: 23.8,
                model: "adaptive".into(),
                late: 1,
                decisions: 30,
                stages: BTreeMap::new(),
                by_action: [
                    ("freeze".to_string(), freeze),
                    (
                        "thaw".to_string(),
                        MsPercentiles {
                            p50_ms: None,
                            p90_ms: None,
                            p99_ms: None,
                            max_ms: None,
                            count: 0,
                        },
                    ),
                ]
                .into(),
                late_by_action: [("freeze".to_string(), 1)].into(),
            },
            stages_by_action: BTreeMap::new(),
            placement: PlacementStatus {
                weights: vec![(0, 0.8125)],
                load_balance_error: 0.0,
            },
            archive: ArchiveSummary::default(),
            gpus: vec![crate::control::GpuMemoryStatus {
                gpu: 0,
                capacity_bytes: 8 << 30,
                tasks_bytes: (3 << 30) + (512 << 20),
                outside_bytes: 1 << 30,
                free_bytes: (3 << 30) + (512 << 20),
            }],
        }
    }

    /// The golden status: the text for a known state, exactly.
    #[test]
    fn status_renders_a_known_state_exactly() {
        let golden = [
            "   TASK   PID  USER   NAME    STATE         FOR  PRIO  GPU   GPU MEM    TIME  ON GPU  NOTE",
            "      1  4001  0      train   PREEMPTED  1.25 s     8    0  3.00 GiB  2m 05s  1m 58s  preempted by a higher priority; behind task 2 (infer, priority 3)",
            "*     2  4002  alice  infer   RUNNING    1.25 s     3    0   512 MiB  1.30 s  1.25 s",
            "*     3  4003  alice  render  FAILED      40 ms    10    0       0 B  1.50 s  1.50 s  ended by Keling: session duration limit; killed by SIGKILL (exit code 137)",
            "* your tasks",
            "",
            "decision timeout 23.8 ms (adaptive model); 1 late of 30 decisions",
            "ACTION  COUNT     P50     P90      P99      MAX  LATE",
            "freeze     12  412 µs  900 µs  2.31 ms  2.31 ms     1",
            "placement weights (higher is better): GPU 0 0.812; load-balance error 0.000",
            "",
            "GPU  CAPACITY     TASKS  OUTSIDE TASKS      FREE",
            "  0  8.00 GiB  3.50 GiB       1.00 GiB  3.50 GiB",
            "",
        ]
        .join("\n");
        assert_eq!(render_status(&known_state(), &names), golden);
    }

    /// A task that waits bound to its GPU says what for, and whether it is pinned.
    #[test]
    fn a_waiting_task_says_what_it_waits_for() {
        let mut t = task(1, "train", "PREEMPTED", 8);
        t.wait_reason = Some(keling_sched::WaitReason::Memory);
        assert_eq!(note(&t), "waits for memory");
        t.wait_reason = Some(keling_sched::WaitReason::HigherPriority);
        t.pinned_gpu = Some(2);
        assert_eq!(
            note(&t),
            "waits for a higher priority to finish on its pinned GPU 2"
        );
        t.wait_reason = Some(keling_sched::WaitReason::SlotsHeld);
        t.pinned_gpu = None;
        assert_eq!(note(&t), "waits for a place under the cap (--slots)");
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["wait_reason"], "slots_held");
    }

    /// A task queued unbound (late binding) reads as QUEUED with its place and why.
    #[test]
    fn a_queued_task_shows_its_place_and_why() {
        let mut s = known_state();
        let mut waiting = task(4, "encode", "PENDING", 8);
        waiting.gpu = None;
        waiting.queued = Some(keling_sched::QueuedView {
            id: 4,
            position: 2,
            ahead: 1,
            reason: keling_sched::WaitReason::SlotsHeld,
        });
        s.tasks = vec![waiting];
        let text = render_status(&s, &names);
        let row = text.lines().nth(1).unwrap();
        assert!(row.contains(" QUEUED "), "{text}");
        assert!(
            row.ends_with(
                "queued unbound, position 2 (behind 1 job): every GPU it may use is taken"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&s.tasks[0]).unwrap();
        assert_eq!(json["state"], "PENDING");
        assert_eq!(json["queued"]["reason"], "slots_held");
    }

    #[test]
    fn status_without_tasks_says_so() {
        let mut s = known_state();
        s.tasks.clear();
        assert!(render_status(&s, &names).starts_with("no tasks\n\ndecision timeout"));
    }

    /// Archived tasks not listed are counted, and the way to list them is told.
    #[test]
    fn status_counts_the_archived_tasks_it_does_not_list() {
        let mut s = known_state();
        s.tasks.truncate(1);
        s.archive = ArchiveSummary {
            kept: 2000,
            listed: 50,
            skipped: 100,
            max_kept: 2000,
            retention_s: 600,
            completed: 90_000,
            failed: 10_000,
            forgotten: 98_000,
        };
        let text = render_status(&s, &names);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2..4],
            [
                "finished tasks: 2000 kept (the last 2000 for 10m 00s), 50 of them listed after \
                 the last 100 skipped; since the agent started 90000 completed, 10000 failed, \
                 98000 forgotten",
                "(--archived N and --skip M list others, --all the last 1000)",
            ],
            "{text}"
        );
    }

    /// The golden history of the training task: preempted and resumed once.
    #[test]
    fn history_renders_transitions_and_decisions_exactly() {
        let mut t = known_state().tasks[0].clone();
        t.state = "RUNNING".into();
        t.waiting = None;
        let arrived = 1_000_000_000;
        let tr = |ms: u64, from, to, reason| Transition {
            event_id: 1,
            task: 1,
            name: "train".into(),
            pid: 4001,
            gpu: Some(0),
            priority: 8,
            from,
            to,
            reason,
            timestamp_ns: arrived + ms * 1_000_000,
            exit_code: None,
        };
        let d = |ms: u64, action: &str, confirmation_ns, late| DecisionRecord {
            action: action.into(),
            decided_ns: arrived + ms * 1_000_000,
            delivery_ns: 41_000,
            decision_ns: 9_000,
            actuation_ns: 120_000,
            confirmation_ns,
            end_to_end_ns: 170_000 + confirmation_ns.unwrap_or(0),
            timeout_ns: 23_800_000,
            late,
        };
        let h = TaskHistory {
            task: t,
            arrived_ns: arrived,
            transitions: vec![
                tr(0, TaskState::Pending, TaskState::Running, Reason::Placed),
                tr(
                    123_750,
                    TaskState::Running,
                    TaskState::Preempted,
                    Reason::PreemptedByHigherPriority,
                ),
                tr(
                    125_000,
                    TaskState::Preempted,
                    TaskState::Running,
                    Reason::Resumed,
                ),
            ],
            decisions: vec![
                d(0, "place", None, false),
                d(123_749, "freeze", Some(290_000), false),
                d(124_999, "thaw", Some(30_000_000), true),
            ],
            transitions_dropped: 0,
            decisions_dropped: 2,
        };
        let golden = [
            "task 1 train (pid 4001, user 0), priority 8, GPU 0",
            "RUNNING for 1.25 s; ran 2m 05s, 1m 58s of it on the GPU; GPU memory 3.00 GiB",
            "",
            "transitions",
            "     AT  TRANSITION         REASON                        EXIT",
            "  +0 ms  PENDING→RUNNING    placed",
            "+2m 03s  RUNNING→PREEMPTED  preempted_by_higher_priority",
            "+2m 05s  PREEMPTED→RUNNING  resumed",
            "",
            "decisions (latency from the kernel event that caused each)",
            "(2 earlier not kept)",
            "     AT  ACTION  END TO END  DELIVERY  DECISION  ACTUATION  CONFIRMED",
            "  +0 ms  place       170 µs   41.0 µs   9.00 µs     120 µs          -",
            "+2m 03s  freeze      460 µs   41.0 µs   9.00 µs     120 µs     290 µs",
            "+2m 04s  thaw       30.2 ms   41.0 µs   9.00 µs     120 µs    30.0 ms  late (timeout 23.8 ms)",
            "",
        ]
        .join("\n");
        assert_eq!(render_history(&h, &names), golden);
        // The JSON form reads back as the same history.
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<TaskHistory>(&json).unwrap(), h);
    }
}
