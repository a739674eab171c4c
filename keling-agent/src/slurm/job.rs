//! What a Slurm job's owner is told, where they look: the notices `keling
//! launch` prints go to the task's standard error (passed by the plugin: the
//! job's output file), one line each, `keling: ...`; and when Keling ends the
//! task, Slurm hears why: the reason becomes the job's `AdminComment` (shown by
//! `scontrol show job`; users cannot overwrite it), and a job that asked for
//! `--requeue` is requeued (`scontrol requeue`).
//!
//! Nothing here runs on the event loop: the lines are written and Slurm's
//! commands run on tokio's blocking pool, each command with a deadline, so a
//! full pipe or a controller that is down delays only this job's notices.
//!
//! The reason must reach Slurm before the job ends: once it has, Slurm refuses
//! to update it ("Job has already finished"; a task ended by SIGTERM ends its
//! job within milliseconds). So the task's actuator is wrapped
//! ([`output`]): the SIGTERM or SIGKILL that ends it is sent here, after the
//! `AdminComment` was set (at most [`COMMENT_DEADLINE`] later, typically a few
//! ms), never by the loop directly.
use std::{
    io::Write,
    os::fd::OwnedFd,
    process::{Command, Stdio},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use crate::{
    control::{
        Notice, Reply, SlurmRef,
        server::{Replier, ReplyStream},
    },
    sched::actuator::{Actuator, Boosted, Watch},
};

/// How long one `scontrol` may take (the controller's own message timeout is
/// 10 s by default).
const SCONTROL_DEADLINE: Duration = Duration::from_secs(30);
/// How long the signal that ends a task waits for its `AdminComment` to be set.
pub const COMMENT_DEADLINE: Duration = Duration::from_secs(2);
/// The longest reason set as a job's `AdminComment`.
const COMMENT_MAX: usize = 200;

/// Turns a notice into words (the agent's command layer registers `keling
/// launch`'s wording: [`set_notice_text`]).
pub type NoticeText = fn(&Notice) -> String;

static TEXT: OnceLock<NoticeText> = OnceLock::new();

/// Registers how notices read (once, at the agent's start).
pub fn set_notice_text(text: NoticeText) {
    let _ = TEXT.set(text);
}

fn text(n: &Notice) -> String {
    match TEXT.get() {
        Some(f) => f(n),
        None => serde_json::to_string(n).unwrap_or_default(),
    }
}

/// A [`Replier`] whose notices go to `stderr`, the attached task's standard
/// error, and whose end of the task is told to Slurm (see the module doc); and
/// the actuator to act on the task with: `inner`'s, except that the signals
/// that end it wait for Slurm to be told why.
pub fn output(
    stderr: OwnedFd,
    job: SlurmRef,
    inner: Arc<dyn Actuator>,
) -> (Replier, Arc<dyn Actuator>) {
    let (replier, stream) = Replier::stream();
    let (ends, ends_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(write_notices(
        stream,
        std::fs::File::from(stderr),
        job,
        inner.clone(),
        ends_rx,
    ));
    (replier, Arc::new(TellsSlurmFirst { inner, ends }))
}

/// A signal that ends the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Terminate,
    Kill,
}

/// The task's actuator, its ending signals sent after Slurm was told why.
struct TellsSlurmFirst {
    inner: Arc<dyn Actuator>,
    ends: tokio::sync::mpsc::UnboundedSender<End>,
}

impl Actuator for TellsSlurmFirst {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        self.inner.set_frozen(frozen)
    }
    fn stop(&self) -> anyhow::Result<()> {
        self.inner.stop()
    }
    fn terminate(&self) {
        if self.ends.send(End::Terminate).is_err() {
            self.inner.terminate();
        }
    }
    fn kill(&self) -> anyhow::Result<()> {
        match self.ends.send(End::Kill) {
            Ok(()) => Ok(()),
            Err(_) => self.inner.kill(),
        }
    }
    fn signal(&self, signal: i32) -> usize {
        self.inner.signal(signal)
    }
    fn watch(&self, kind: keling_sched::ActionKind) -> Box<dyn Watch> {
        self.inner.watch(kind)
    }
    fn freeze_boosted(&self) -> anyhow::Result<Boosted> {
        self.inner.freeze_boosted()
    }
    fn unboost(&self) {
        self.inner.unboost()
    }
}

/// Whether the job's owner hears of it: not of where it was placed (Slurm
/// placed it), nor of a queue it is never in.
fn told(n: &Notice) -> bool {
    !matches!(n, Notice::Placed { .. } | Notice::Queued { .. })
}

async fn write_notices(
    mut stream: ReplyStream,
    file: std::fs::File,
    job: SlurmRef,
    inner: Arc<dyn Actuator>,
    mut ends: tokio::sync::mpsc::UnboundedReceiver<End>,
) {
    let file = Arc::new(file);
    let mut commented = false;
    loop {
        // Notices first: the `ending` notice is queued before its signal.
        let n = tokio::select! {
            biased;
            reply = stream.next() => match reply {
                Some(Reply::Notice(n)) => n,
                Some(_) => continue, // `accepted` and the exit code: Slurm's business
                None => break,
            },
            Some(end) = ends.recv() => {
                let inner = inner.clone();
                let _ = tokio::task::spawn_blocking(move || match end {
                    End::Terminate => inner.terminate(),
                    End::Kill => {
                        if let Err(e) = inner.kill() {
                            log::warn!("Slurm job {}: {e:#}", job.job);
                        }
                    }
                })
                .await;
                continue;
            }
        };
        if !told(&n) {
            continue;
        }
        let line = format!("keling: {}\n", text(&n));
        let out = file.clone();
        let _ = tokio::task::spawn_blocking(move || (&*out).write_all(line.as_bytes())).await;
        if let Notice::Ending { .. } = &n
            && !commented
        {
            commented = true;
            let reason = text(&n);
            // The comment before the signal (bounded); the requeue after it.
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            tokio::task::spawn_blocking(move || tell_slurm(job, &reason, done_tx));
            let _ = tokio::time::timeout(COMMENT_DEADLINE, done_rx).await;
        }
    }
    // The task is gone: whatever end is still queued has nothing left to act on.
}

/// The `AdminComment` for a task Keling ended: one line, at most
/// [`COMMENT_MAX`] bytes, no quote or newline.
pub fn admin_comment(job: SlurmRef, reason: &str) -> String {
    let mut s = format!(
        "keling: step {} task {}: {reason}",
        job.step_label(),
        job.task
    );
    s.retain(|c| !c.is_control() && c != '"' && c != '\'');
    if s.len() > COMMENT_MAX {
        let mut end = COMMENT_MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Sets the reason as the job's `AdminComment`, then requeues it if it asked
/// for `--requeue` (a batch job: an interactive one cannot be).
fn tell_slurm(job: SlurmRef, reason: &str, commented: tokio::sync::oneshot::Sender<()>) {
    let id = job.job.to_string();
    let comment = admin_comment(job, reason);
    if let Err(e) = scontrol(&[
        "update",
        &format!("JobId={id}"),
        &format!("AdminComment={comment}"),
    ]) {
        log::warn!("Slurm job {id}: cannot set its AdminComment ({e}); the reason was: {reason}");
    }
    let _ = commented.send(());
    let shown = match scontrol(&["show", "job", "-o", &id]) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("Slurm job {id}: cannot read it ({e}): not requeued");
            return;
        }
    };
    if requeue_asked(&shown) {
        match scontrol(&["requeue", &id]) {
            Ok(_) => log::info!("Slurm job {id}: requeued (it asked for --requeue)"),
            Err(e) => log::warn!("Slurm job {id}: requeue failed: {e}"),
        }
    }
}

/// Whether `scontrol show job -o` says the job may be requeued (`Requeue=1`)
/// and is a batch job (`BatchFlag=1`).
pub fn requeue_asked(shown: &str) -> bool {
    let mut words = shown.split_whitespace();
    let has = |w: &mut std::str::SplitWhitespace<'_>, kv: &str| w.any(|x| x == kv);
    has(&mut words.clone(), "Requeue=1") && has(&mut words, "BatchFlag=1")
}

/// Runs `scontrol ARGS` (found as Slurm's commands find the controller:
/// `SLURM_CONF` from our environment, else the default config), at most
/// [`SCONTROL_DEADLINE`]: its standard output, or why it failed.
pub fn scontrol(args: &[&str]) -> Result<String, String> {
    let mut child = Command::new("scontrol")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run scontrol: {e} (is slurm-client installed?)"))?;
    let deadline = Instant::now() + SCONTROL_DEADLINE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "scontrol {args:?} took over {} s: the controller is down or slow",
                    SCONTROL_DEADLINE.as_secs()
                ));
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "scontrol {args:?}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comment_is_one_bounded_line_without_quotes() {
        let job = SlurmRef {
            job: 12,
            step: SlurmRef::BATCH_STEP,
            task: 0,
        };
        let c = admin_comment(job, "over its \"quota\"\nnow");
        assert_eq!(c, "keling: step 12.batch task 0: over its quotanow");
        let long = admin_comment(job, &"é".repeat(300));
        assert!(long.len() <= COMMENT_MAX, "{}", long.len());
    }

    #[test]
    fn only_a_batch_job_that_asked_is_requeued() {
        assert!(requeue_asked(
            "JobId=3 Requeue=1 Restarts=0 BatchFlag=1 Reboot=0"
        ));
        assert!(!requeue_asked("JobId=3 Requeue=0 Restarts=0 BatchFlag=1"));
        assert!(!requeue_asked("JobId=3 Requeue=1 Restarts=0 BatchFlag=0"));
    }

    #[test]
    fn placement_is_not_told_to_a_slurm_job() {
        assert!(!told(&Notice::Placed {
            task: 1,
            pid: 2,
            gpu: 0,
            priority: 4
        }));
        assert!(told(&Notice::Resumed {
            task: 1,
            frozen_ms: 3
        }));
    }
}
