//! What a launch's client hears about its task, and in which order.
//!
//! Replies proper come in a fixed order: `accepted` once the exec succeeded (or
//! the error that says which step of the start failed, which ends the
//! conversation), then the exit code ([`Clients::settle`]). Notices come as
//! things happen: `queued` and `placed` (late binding), the duration-limit
//! warning and enforcement record, `ending` (why Keling is ending the task, with
//! which signal) and `ended`, and, when the client asked, `frozen` and `resumed`.
//!
//! Nothing here blocks: a [`Replier`] queues replies and drops the excess of
//! notices for a client that does not read (it hears how many later), so a
//! silent client delays neither the loop nor anybody's decisions. Nothing here
//! decides anything either: the scheduler core is only read.
use crate::os::spawn::StartError;
use std::collections::HashMap;

use keling_sched::{EnforcementRecord, Reason, Scheduler, TaskId, TaskState, Transition};

use super::history;
use crate::control::{Accepted, ErrorKind, Notice, Reply, ReplyError, TaskRef, server::Replier};

/// The refused allocation a step handles: whom an eviction it leads to is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The task whose allocation was refused.
    pub requester: TaskId,
    pub gpu: u32,
    /// How much it asked for.
    pub bytes: u64,
}

/// The client of a launch: what it has been told, and what it is owed.
struct Client {
    reply: Replier,
    accepted: Accepted,
    /// The exec's outcome, once known.
    exec: Option<Result<(), ReplyError>>,
    /// The task's exit code, once it ended.
    exit_code: Option<i32>,
    told_accepted: bool,
    /// Whether it asked for freeze and resume notices.
    notify_preempt: bool,
    /// The signals it was told Keling sent to end its task.
    told_ending: Vec<i32>,
    /// `placed`, kept until the exec succeeded: a start that fails gets only
    /// its error.
    placed: Option<Notice>,
}

/// The clients of launched tasks, by task, until each has heard its task's end.
#[derive(Default)]
pub struct Clients(HashMap<TaskId, Client>);

impl Clients {
    /// A launch's client, owed `accepted` (and then the exit code).
    pub fn add(&mut self, reply: Replier, accepted: Accepted, notify_preempt: bool) {
        self.0.insert(
            accepted.task,
            Client {
                reply,
                accepted,
                exec: None,
                exit_code: None,
                told_accepted: false,
                notify_preempt,
                told_ending: Vec::new(),
                placed: None,
            },
        );
    }

    /// A launch's client attached again to its task (taken back after a restart,
    /// running already): it hears `accepted` at once, then as any client.
    pub fn attach(&mut self, reply: Replier, accepted: Accepted, notify_preempt: bool) {
        let id = accepted.task;
        self.add(reply, accepted, notify_preempt);
        if let Some(c) = self.0.get_mut(&id) {
            c.exec = Some(Ok(()));
        }
        self.settle(id);
    }

    /// The task ended and its exit status cannot be known (`why`): its client
    /// hears that, instead of an exit code, and is forgotten.
    pub fn exit_unknown(&mut self, id: TaskId, why: String) {
        if let Some(c) = self.0.remove(&id) {
            c.reply
                .send(Reply::Error(ReplyError::new(ErrorKind::ExitUnknown, why)));
        }
    }

    /// Whether task `id` has a client still owed its end.
    pub fn has(&self, id: TaskId) -> bool {
        self.0.contains_key(&id)
    }

    /// The task was bound to `gpu` at its release (late binding): its `accepted`
    /// says so.
    pub fn bound(&mut self, id: TaskId, gpu: u32) {
        if let Some(c) = self.0.get_mut(&id) {
            c.accepted.gpu = Some(gpu);
        }
    }

    /// The exec's outcome: `Ok`, or which step of the start failed. Told at the
    /// next [`Clients::settle`].
    pub fn exec_outcome(&mut self, id: TaskId, outcome: Result<(), StartError>) {
        if let Some(c) = self.0.get_mut(&id) {
            c.exec = Some(outcome.map_err(|e| ReplyError::new(ErrorKind::StartFailed, e.message)));
        }
    }

    /// The task ended before its release: its command never ran (`why`). Told
    /// at the next [`Clients::settle`].
    pub fn never_ran(&mut self, id: TaskId, why: String) {
        if let Some(c) = self.0.get_mut(&id) {
            c.exec = Some(Err(ReplyError::new(ErrorKind::NeverRan, why)));
        }
    }

    /// The task ended with `exit_code`; when Keling ended it, the client hears why
    /// first (before the exit code it explains).
    pub fn exited(&mut self, id: TaskId, exit_code: i32, ending_reason: Option<Reason>) {
        let Some(c) = self.0.get_mut(&id) else {
            return;
        };
        c.exit_code = Some(exit_code);
        if let Some(reason) = ending_reason {
            c.reply.notify(Notice::Ended {
                task: id,
                reason,
                exit_code,
            });
        }
    }

    /// Tells a launch's client what it is owed, in order: accepted (or why its
    /// command could not start), then the exit code. A client told everything is
    /// forgotten.
    pub fn settle(&mut self, id: TaskId) {
        let Some(c) = self.0.get_mut(&id) else {
            return;
        };
        match &c.exec {
            None => return, // the exec's outcome first
            Some(Err(what)) => {
                c.reply.send(Reply::Error(what.clone()));
                self.0.remove(&id);
                return;
            }
            Some(Ok(())) if !c.told_accepted => {
                c.told_accepted = true;
                if let Some(placed) = c.placed.take() {
                    c.reply.notify(placed); // written before `accepted`
                }
                c.reply.send(Reply::Accepted(c.accepted.clone()));
            }
            Some(Ok(())) => {}
        }
        if let Some(code) = c.exit_code {
            c.reply.send(Reply::ExitCode(code));
            self.0.remove(&id);
        }
    }

    /// Late binding: the task waits unbound; where in the queue, and why.
    pub fn tell_queued(&self, id: TaskId, pid: u32, sched: &Scheduler) {
        let (Some(c), Some(q)) = (self.0.get(&id), sched.queued(id)) else {
            return;
        };
        c.reply.notify(Notice::Queued {
            task: id,
            pid,
            position: q.position,
            ahead: q.ahead,
            reason: q.reason,
        });
    }

    /// The core placed the task on `gpu`. Told once the exec succeeded (just
    /// before `accepted`), or at once if it did already; a start that fails is
    /// told only its error.
    pub fn tell_placed(&mut self, id: TaskId, pid: u32, gpu: u32, sched: &Scheduler) {
        if let (Some(c), Some(t)) = (self.0.get_mut(&id), sched.task(id)) {
            let notice = Notice::Placed {
                task: id,
                pid,
                gpu,
                priority: t.spec.priority,
            };
            match c.exec {
                Some(Ok(())) => c.reply.notify(notice),
                Some(Err(_)) => {}
                None => c.placed = Some(notice),
            }
        }
    }

    /// The task's session limit is `remaining_ms` away.
    pub fn tell_warning(&self, id: TaskId, remaining_ms: u64, sched: &Scheduler) {
        if let (Some(c), Some(t)) = (self.0.get(&id), sched.task(id)) {
            let config = sched.config();
            c.reply.notify(Notice::Warning {
                task: id,
                remaining_ms,
                allowed_ms: t
                    .spec
                    .max_duration_ms
                    .unwrap_or(config.default_max_duration_ms),
                hard_kill: t.spec.hard_kill.unwrap_or(config.default_hard_kill),
            });
        }
    }

    /// The limit was reached: the 4003 record.
    pub fn tell_enforcement(&self, id: TaskId, record: EnforcementRecord) {
        if let Some(c) = self.0.get(&id) {
            c.reply.notify(Notice::Enforcement { task: id, record });
        }
    }

    /// When its client asked: the task was frozen (and for whom) or resumed
    /// (after `was_for_ns` frozen).
    pub fn tell_transition(&self, t: &Transition, was_for_ns: u64, sched: &Scheduler) {
        let Some(c) = self.0.get(&t.task).filter(|c| c.notify_preempt) else {
            return;
        };
        match (t.from, t.to) {
            (_, TaskState::Preempted) => {
                let views = sched.tasks();
                let yielded_to = views
                    .iter()
                    .find(|v| v.spec.id == t.task)
                    .map(|me| history::slot_holders(&views, me))
                    .unwrap_or_default();
                c.reply.notify(Notice::Frozen {
                    task: t.task,
                    reason: t.reason,
                    yielded_to,
                });
            }
            (TaskState::Preempted, TaskState::Running) => c.reply.notify(Notice::Resumed {
                task: t.task,
                frozen_ms: was_for_ns / 1_000_000,
            }),
            _ => {}
        }
    }

    /// Tells a launch's client that Keling is ending its task, why, and with
    /// which signal (once per signal). `evicting_for`: the refused allocation the
    /// step handles, if any (an eviction names it).
    pub fn tell_ending(
        &mut self,
        id: TaskId,
        signal: i32,
        sched: &Scheduler,
        evicting_for: Option<Eviction>,
    ) {
        let Some(view) = sched.task(id) else {
            return;
        };
        let Some(reason) = view.ending_reason else {
            return;
        };
        let evicted_for = evicting_for.filter(|_| reason == Reason::EvictedForMemory);
        let requester = evicted_for.and_then(|e| sched.task(e.requester));
        let Some(c) = self.0.get_mut(&id) else {
            return;
        };
        if c.told_ending.contains(&signal) {
            return;
        }
        c.told_ending.push(signal);
        let held: u64 = view.mem_bytes.values().sum();
        let (bytes, gpu, quota_bytes) = match reason {
            Reason::EvictedForMemory => (
                evicted_for.map(|e| e.bytes),
                evicted_for.map(|e| e.gpu),
                None,
            ),
            Reason::OverQuota => (Some(held), None, view.spec.mem_quota_bytes),
            _ => (None, None, None),
        };
        c.reply.notify(Notice::Ending {
            task: id,
            reason,
            signal,
            evicted_for: requester.map(|r| TaskRef {
                task: r.spec.id,
                name: r.spec.name.clone(),
                priority: r.spec.priority,
            }),
            bytes,
            gpu,
            quota_bytes,
        });
    }
}
