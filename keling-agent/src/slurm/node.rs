//! Telling Slurm what it cannot see (`keling run --slurm-report`): GPU memory
//! held by processes in no Slurm job (a stray process, a job from before Keling
//! started, a leak after a job ended), and a GPU under memory pressure. Slurm
//! counts shards, not bytes: a GPU whose memory is partly held outside its jobs
//! still looks free to it, and the next shard job placed there would not fit.
//!
//! The node is drained (`State=DRAIN Reason="keling: ..."`) while some GPU has
//! at least [`OUTSIDE_THRESHOLD_BYTES`] (one shard) held outside Slurm's jobs,
//! or is under memory pressure ([`PressureRule`]: a task placed on it waits
//! for memory, or the driver refused one of its tasks' video allocations for
//! lack of memory, in the last [`PRESSURE_HOLD`]), and resumed once neither
//! holds: new jobs go elsewhere meanwhile, running ones go on. One reason names
//! both causes when both hold.
//! Of what `scontrol update NodeName=` can change, only a drain keeps a job off
//! the node whatever it asks for: `Weight=` is a preference (a job that fits
//! only there still lands there), `Features=` only matter to jobs with a
//! `--constraint`, and Slurm 22.05 schedules nothing on `Extra=`; shard counts
//! cannot be changed at run time. A node someone else drained (a reason not
//! starting `keling:`) is never resumed.
//!
//! Never on the event loop: the loop computes the figures once a second and
//! hands the wanted state to a thread of its own ([`NodeReport::observe`] never
//! blocks); the thread runs `scontrol` (as Slurm's commands find the controller)
//! only when the wanted state changed (a drain whose reason only changed its
//! figures at most every [`REASON_EVERY`]), or to retry every [`RETRY`] after a
//! failure: a controller that is down or slow delays the report, nothing else.
use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
    time::{Duration, Instant},
};

use keling_common::gpu::{ALL_GPUS, Totals};

use crate::sched::sharing::MemoryPressure;

use super::job::scontrol;

/// Memory held outside Slurm's jobs on one GPU that drains the node: a shard.
pub const OUTSIDE_THRESHOLD_BYTES: u64 = super::gres::SHARD_BYTES;
/// How long after a failed `scontrol` the wanted state is sent again.
pub const RETRY: Duration = Duration::from_secs(10);
/// How long a GPU counts as under memory pressure after its last sign (a task
/// waiting for memory, a refused allocation): the drain's least hold, so that
/// a node is not drained and resumed at every Slurm scheduling pass.
pub const PRESSURE_HOLD: Duration = Duration::from_secs(30);
/// A drain whose reason changed only in its figures is told again at most
/// this often.
pub const REASON_EVERY: Duration = Duration::from_secs(10);
/// The reason's prefix: what marks a drain as Keling's own.
pub const REASON_PREFIX: &str = "keling:";

/// What the node should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Open to new jobs (resumed if Keling drained it).
    Open,
    /// Drained, with this reason.
    Drained(String),
}

/// Per GPU, the video bytes held by processes that belong to no Slurm task:
/// `totals` is the kernel's (pid, gpu) figures, `in_slurm` says whether a pid is
/// a process of a Slurm task. Pid 0 (the device's own) is left out.
pub fn outside_bytes(
    totals: &BTreeMap<(u32, u32), Totals>,
    in_slurm: impl Fn(u32) -> bool,
) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for (&(pid, gpu), t) in totals {
        if pid == 0 || gpu == ALL_GPUS || t.bytes == 0 || in_slurm(pid) {
            continue;
        }
        *out.entry(gpu).or_insert(0) += t.bytes;
    }
    out
}

/// Memory pressure per GPU, with a hold: a GPU is under pressure from a sign
/// of it (a task placed on it waits for memory now; the driver refused one of
/// its tasks' video allocations for lack of memory since the last look) until
/// [`PRESSURE_HOLD`] passed without one. Its reason keeps the figures of the
/// last sign.
#[derive(Debug, Default)]
pub struct PressureRule {
    gpus: BTreeMap<u32, GpuSigns>,
}

#[derive(Debug, Default)]
struct GpuSigns {
    /// The daemon's refusal count at the last look.
    refused_seen: u64,
    /// The last sign, and the reason it gave.
    last: Option<(Instant, String)>,
}

impl PressureRule {
    /// Takes this look's figures; returns the GPUs under pressure now, each
    /// with its reason (`GPU 0 7/8 GiB held, 1 task waits for memory`).
    pub fn update(&mut self, figures: &[MemoryPressure], now: Instant) -> BTreeMap<u32, String> {
        for f in figures {
            let g = self.gpus.entry(f.gpu).or_default();
            let refused = f.refused > g.refused_seen;
            g.refused_seen = f.refused;
            if f.waiting > 0 || refused {
                g.last = Some((now, describe(f, refused)));
            }
        }
        self.gpus
            .iter()
            .filter_map(|(&gpu, g)| {
                let (at, reason) = g.last.as_ref()?;
                (now.saturating_duration_since(*at) < PRESSURE_HOLD).then(|| (gpu, reason.clone()))
            })
            .collect()
    }
}

/// One GPU's pressure in words, its figures in whole GiB (the reason changes
/// only when a figure moves by a GiB).
fn describe(f: &MemoryPressure, refused: bool) -> String {
    let gib = super::gres::SHARD_BYTES;
    let mut s = format!(
        "GPU {} {}/{} GiB held",
        f.gpu,
        f.held_bytes / gib,
        f.capacity_bytes / gib
    );
    match f.waiting {
        0 => {}
        1 => s.push_str(", 1 task waits for memory"),
        n => s.push_str(&format!(", {n} tasks wait for memory")),
    }
    if refused {
        s.push_str(", allocations refused for lack of memory");
    }
    s
}

/// The rule: drained while some GPU holds at least [`OUTSIDE_THRESHOLD_BYTES`]
/// outside Slurm's jobs (the reason names each such GPU and its GiB, whole, so
/// that the reason changes only when a figure moves by a GiB), or while some
/// GPU is under memory pressure (`pressure`, from [`PressureRule::update`]);
/// both in one reason when both hold.
pub fn wanted(outside: &BTreeMap<u32, u64>, pressure: &BTreeMap<u32, String>) -> Wanted {
    let over: Vec<String> = outside
        .iter()
        .filter(|&(_, &b)| b >= OUTSIDE_THRESHOLD_BYTES)
        .map(|(g, b)| format!("GPU {g} {} GiB", b / super::gres::SHARD_BYTES))
        .collect();
    let mut causes = Vec::new();
    if !over.is_empty() {
        causes.push(format!(
            "GPU memory held outside Slurm jobs: {}",
            over.join(", ")
        ));
    }
    if !pressure.is_empty() {
        let gpus: Vec<&str> = pressure.values().map(String::as_str).collect();
        causes.push(format!("GPU memory pressure: {}", gpus.join(", ")));
    }
    if causes.is_empty() {
        Wanted::Open
    } else {
        Wanted::Drained(format!("{REASON_PREFIX} {}", causes.join("; ")))
    }
}

/// The reporter the event loop holds.
pub struct NodeReport {
    node: String,
    to_thread: SyncSender<Wanted>,
    /// What the thread last carried out.
    applied: Arc<Mutex<Option<Wanted>>>,
    sent: Option<(Wanted, Instant)>,
    pressure: PressureRule,
}

impl NodeReport {
    /// Starts the thread that tells Slurm about node `node`.
    pub fn start(node: String) -> std::io::Result<Self> {
        let (to_thread, rx) = sync_channel(1);
        let applied = Arc::new(Mutex::new(None));
        let (n, a) = (node.clone(), applied.clone());
        std::thread::Builder::new()
            .name("keling-slurm".into())
            .spawn(move || apply_loop(&n, &rx, &a))?;
        log::info!(
            "Slurm node {node}: drained while GPU memory is held outside its jobs or a GPU is under memory pressure"
        );
        Ok(Self {
            node,
            to_thread,
            applied,
            sent: None,
            pressure: PressureRule::default(),
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// [`Self::observe`] with the kernel's figures (or why there are none), each
    /// GPU's memory counted outside Slurm unless `in_slurm` says its process is
    /// a Slurm task's, and the daemon's memory-pressure figures.
    pub fn observe_kernel(
        &mut self,
        accounting: anyhow::Result<crate::gpu::stats::GpuAccounting>,
        in_slurm: impl Fn(u32) -> bool,
        pressure: &[MemoryPressure],
    ) {
        match accounting {
            Ok(acc) => self.observe(
                &outside_bytes(&acc.totals, in_slurm),
                pressure,
                Instant::now(),
            ),
            Err(e) => log::debug!("Slurm node {}: GPU figures unavailable: {e:#}", self.node),
        }
    }

    /// The figures now: hands the wanted state on when it is news (or a retry is
    /// due). Never blocks.
    pub fn observe(
        &mut self,
        outside: &BTreeMap<u32, u64>,
        pressure: &[MemoryPressure],
        now: Instant,
    ) {
        let under = self.pressure.update(pressure, now);
        let want = wanted(outside, &under);
        let applied = self.applied.lock().map(|a| a.clone()).unwrap_or(None);
        if applied.as_ref() == Some(&want) {
            return;
        }
        // Drained already, only the figures moved: not more often than
        // REASON_EVERY.
        if let (Some(Wanted::Drained(_)), Wanted::Drained(_), Some((Wanted::Drained(_), at))) =
            (&applied, &want, &self.sent)
            && now.saturating_duration_since(*at) < REASON_EVERY
        {
            return;
        }
        if let Some((sent, at)) = &self.sent
            && *sent == want
            && now.duration_since(*at) < RETRY
        {
            return; // on its way, or failed a moment ago
        }
        // At the start `applied` is None: an Open is sent too, so a drain of
        // Keling's left by an earlier agent is lifted.
        match self.to_thread.try_send(want.clone()) {
            Ok(()) => self.sent = Some((want, now)),
            Err(TrySendError::Full(_)) => {} // the thread is busy: next time
            Err(TrySendError::Disconnected(_)) => {
                log::warn!("Slurm node {}: the reporting thread is gone", self.node);
            }
        }
    }
}

/// The thread: carries out each wanted state it is handed.
fn apply_loop(node: &str, rx: &Receiver<Wanted>, applied: &Mutex<Option<Wanted>>) {
    while let Ok(want) = rx.recv() {
        match apply(node, &want) {
            Ok(()) => {
                if let Ok(mut a) = applied.lock() {
                    *a = Some(want);
                }
            }
            Err(e) => log::warn!(
                "Slurm node {node}: cannot tell the controller ({e}); trying again in {} s",
                RETRY.as_secs()
            ),
        }
    }
}

fn apply(node: &str, want: &Wanted) -> Result<(), String> {
    let shown = scontrol(&["show", "node", "-o", node])?;
    let (drained, ours) = drain_of(&shown);
    match want {
        Wanted::Drained(reason) => {
            if drained && !ours {
                return Ok(()); // someone else's drain: theirs to lift
            }
            scontrol(&[
                "update",
                &format!("NodeName={node}"),
                "State=DRAIN",
                &format!("Reason={reason}"),
            ])?;
            log::warn!("Slurm node {node} drained: {reason}");
        }
        Wanted::Open => {
            if drained && ours {
                scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"])?;
                log::info!(
                    "Slurm node {node} resumed: no GPU memory held outside its jobs, no memory pressure"
                );
            }
        }
    }
    Ok(())
}

/// From `scontrol show node -o`: whether the node is drained (or draining), and
/// whether by Keling (its reason starts with [`REASON_PREFIX`]).
pub fn drain_of(shown: &str) -> (bool, bool) {
    let state = field(shown, "State").unwrap_or_default();
    let drained = state.contains("DRAIN");
    let reason = field(shown, "Reason").unwrap_or_default();
    (drained, reason.starts_with(REASON_PREFIX))
}

/// A `Key=value` of a one-line `scontrol show` (the value runs to the next
/// ` Key=`: a reason has spaces).
fn field<'a>(shown: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    let start = shown
        .match_indices(&pat)
        .find(|(i, _)| *i == 0 || shown.as_bytes()[i - 1] == b' ')?
        .0
        + pat.len();
    let rest = &shown[start..];
    let end = rest
        .match_indices(' ')
        .find(|(i, _)| {
            let next = &rest[i + 1..];
            next.split_once('=')
                .is_some_and(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric()))
        })
        .map_or(rest.len(), |(i, _)| i);
    Some(rest[..end].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(entries: &[((u32, u32), u64)]) -> BTreeMap<(u32, u32), Totals> {
        entries
            .iter()
            .map(|&(k, bytes)| {
                (
                    k,
                    Totals {
                        bytes,
                        ..Totals::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn memory_of_processes_in_no_slurm_job_counts_per_gpu() {
        let t = totals(&[
            ((10, 0), 3 << 30),
            ((10, ALL_GPUS), 3 << 30),
            ((11, 0), 1 << 30),
            ((12, 1), 2 << 30),
            ((0, 0), 5 << 30),
        ]);
        let out = outside_bytes(&t, |pid| pid == 11);
        assert_eq!(out, BTreeMap::from([(0, 3 << 30), (1, 2 << 30)]));
    }

    #[test]
    fn drained_from_one_shard_outside_with_whole_gib_in_the_reason() {
        let none = BTreeMap::new();
        assert_eq!(
            wanted(&BTreeMap::from([(0, (1 << 30) - 1)]), &none),
            Wanted::Open
        );
        assert_eq!(
            wanted(&BTreeMap::from([(0, 7 << 30), (1, 100)]), &none),
            Wanted::Drained("keling: GPU memory held outside Slurm jobs: GPU 0 7 GiB".into())
        );
        // The same GiB: the same reason (nothing new to tell Slurm).
        assert_eq!(
            wanted(&BTreeMap::from([(0, (7 << 30) + 5)]), &none),
            wanted(&BTreeMap::from([(0, 7 << 30)]), &none)
        );
    }

    #[test]
    fn only_a_drain_of_keling_s_own_is_lifted() {
        let ours = "NodeName=n1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Reason=keling: GPU memory held outside Slurm jobs: GPU 0 7 GiB [root@2026-12-05T01:00:00] Comment=(null)";
        assert_eq!(drain_of(ours), (true, true));
        let theirs = "NodeName=n1 State=IDLE+DRAIN Reason=maintenance [admin@x]";
        assert_eq!(drain_of(theirs), (true, false));
        let open = "NodeName=n1 State=IDLE ThreadsPerCore=1";
        assert_eq!(drain_of(open), (false, false));
    }

    #[test]
    fn a_state_already_carried_out_is_not_sent_again() {
        let (mut r, rx) = report();
        let t0 = Instant::now();
        let busy = BTreeMap::from([(0, 7u64 << 30)]);
        r.observe(&busy, &[], t0);
        assert!(matches!(rx.try_recv(), Ok(Wanted::Drained(_))));
        // Not applied yet, not due for a retry: nothing more.
        r.observe(&busy, &[], t0 + Duration::from_secs(1));
        assert!(rx.try_recv().is_err());
        // Failed (never applied): sent again after RETRY.
        r.observe(&busy, &[], t0 + RETRY);
        assert!(rx.try_recv().is_ok());
        *r.applied.lock().unwrap() = Some(wanted(&busy, &BTreeMap::new()));
        r.observe(&busy, &[], t0 + RETRY * 3);
        assert!(rx.try_recv().is_err(), "idempotent: applied already");
        r.observe(&BTreeMap::new(), &[], t0 + RETRY * 3);
        assert_eq!(rx.try_recv().ok(), Some(Wanted::Open));
    }

    fn gpu0(held_gib: u64, waiting: usize, refused: u64) -> MemoryPressure {
        MemoryPressure {
            gpu: 0,
            capacity_bytes: 8 << 30,
            held_bytes: held_gib << 30,
            waiting,
            refused,
        }
    }

    fn report() -> (NodeReport, Receiver<Wanted>) {
        let (tx, rx) = sync_channel(1);
        let r = NodeReport {
            node: "n1".into(),
            to_thread: tx,
            applied: Arc::new(Mutex::new(None)),
            sent: None,
            pressure: PressureRule::default(),
        };
        (r, rx)
    }

    #[test]
    fn a_task_waiting_for_memory_is_pressure_held_after_it_ends() {
        let mut rule = PressureRule::default();
        let t0 = Instant::now();
        assert!(rule.update(&[gpu0(3, 0, 0)], t0).is_empty(), "no sign");
        let under = rule.update(&[gpu0(7, 1, 0)], t0 + Duration::from_secs(1));
        assert_eq!(
            under,
            BTreeMap::from([(0, "GPU 0 7/8 GiB held, 1 task waits for memory".to_string())])
        );
        // The wait ended: still under pressure, with the last sign's figures,
        // until PRESSURE_HOLD passed without a sign.
        let gone = t0 + Duration::from_secs(2);
        assert_eq!(rule.update(&[gpu0(4, 0, 0)], gone), under);
        assert_eq!(
            rule.update(
                &[gpu0(4, 0, 0)],
                t0 + Duration::from_secs(1) + PRESSURE_HOLD - Duration::from_millis(1)
            ),
            under
        );
        assert!(
            rule.update(
                &[gpu0(4, 0, 0)],
                t0 + Duration::from_secs(1) + PRESSURE_HOLD
            )
            .is_empty(),
            "over once the hold passed"
        );
    }

    #[test]
    fn a_refused_allocation_is_pressure_once_and_an_unchanged_count_is_none() {
        let mut rule = PressureRule::default();
        let t0 = Instant::now();
        // Refused before the first look (the count starts at 0): a sign.
        let under = rule.update(&[gpu0(8, 0, 2)], t0);
        assert_eq!(
            under[&0],
            "GPU 0 8/8 GiB held, allocations refused for lack of memory"
        );
        // The same count later: no new sign; the hold runs from t0.
        assert_eq!(rule.update(&[gpu0(8, 0, 2)], t0 + PRESSURE_HOLD / 2), under);
        assert!(rule.update(&[gpu0(8, 0, 2)], t0 + PRESSURE_HOLD).is_empty());
        // A new refusal, with tasks waiting: both in the reason.
        let later = t0 + PRESSURE_HOLD * 2;
        assert_eq!(
            rule.update(&[gpu0(8, 2, 3)], later)[&0],
            "GPU 0 8/8 GiB held, 2 tasks wait for memory, allocations refused for lack of memory"
        );
    }

    #[test]
    fn outside_memory_and_pressure_share_one_reason() {
        let pressure = BTreeMap::from([
            (0, "GPU 0 7/8 GiB held, 1 task waits for memory".to_string()),
            (
                1,
                "GPU 1 8/8 GiB held, allocations refused for lack of memory".to_string(),
            ),
        ]);
        assert_eq!(
            wanted(&BTreeMap::new(), &pressure),
            Wanted::Drained(
                "keling: GPU memory pressure: GPU 0 7/8 GiB held, 1 task waits for memory, \
                 GPU 1 8/8 GiB held, allocations refused for lack of memory"
                    .into()
            )
        );
        let both = wanted(&BTreeMap::from([(0, 2u64 << 30)]), &pressure);
        let Wanted::Drained(reason) = both else {
            panic!("drained")
        };
        assert!(
            reason.starts_with(
                "keling: GPU memory held outside Slurm jobs: GPU 0 2 GiB; GPU memory pressure: GPU 0 "
            ),
            "{reason}"
        );
    }

    #[test]
    fn pressure_drains_then_resumes_after_the_hold_and_figures_are_rate_limited() {
        let (mut r, rx) = report();
        let none = BTreeMap::new();
        let t0 = Instant::now();
        r.observe(&none, &[gpu0(7, 1, 0)], t0);
        let first = rx.try_recv().expect("drained at the first sign");
        assert!(matches!(&first, Wanted::Drained(s) if s.contains("1 task waits")));
        *r.applied.lock().unwrap() = Some(first.clone());
        // Another GiB held a second later: the same drain, figures moved; not
        // told before REASON_EVERY.
        r.observe(&none, &[gpu0(8, 1, 0)], t0 + Duration::from_secs(1));
        assert!(rx.try_recv().is_err(), "rate-limited");
        r.observe(&none, &[gpu0(8, 1, 0)], t0 + REASON_EVERY);
        let second = rx.try_recv().expect("the new figures, once due");
        assert!(matches!(&second, Wanted::Drained(s) if s.contains("8/8 GiB")));
        *r.applied.lock().unwrap() = Some(second);
        // The wait ends: drained on through the hold, then resumed.
        let end = t0 + REASON_EVERY + Duration::from_secs(1);
        r.observe(&none, &[gpu0(5, 0, 0)], end);
        assert!(rx.try_recv().is_err(), "held");
        r.observe(&none, &[gpu0(5, 0, 0)], t0 + REASON_EVERY + PRESSURE_HOLD);
        assert_eq!(rx.try_recv().ok(), Some(Wanted::Open));
    }
}
