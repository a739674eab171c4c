//! The work programs: one per kind of deferred work, attached to nothing and
//! reached only by tail call through `WORK_PROG` (deferred.rs), at the slot
//! keling-common's `tail_call::work` gives their kind. Each takes the item at the
//! front of this CPU's queue, does one step of it with the module that owns that
//! work, puts it back if more steps are left, and tail-calls the next item's
//! program.
//!
//! | program | work | done by |
//! |---|---|---|
//! | `keling_release_file` | [`Work::ReleaseFile`] | accounting |
//! | `keling_teardown_shared` | [`Work::TeardownShared`] | accounting |
//! | `keling_teardown_contributors` | [`Work::TeardownContributors`] | accounting |
//! | `keling_close_range` | [`Work::CloseRange`] | files |
//! | `keling_orphan` | [`Work::Orphan`] | orphans |
//! | `keling_sweep` | [`Work::Sweep`] | orphans |
//!
//! Each exists twice, around one body: as a tracepoint-type program for
//! `WORK_PROG` and, with the suffix `_kprobe`, as a kprobe-type one for
//! `WORK_PROG_KPROBE` (the driver-entry backend's programs are kprobes, and the
//! kernel tail-calls only between programs of one type).
//!
//! The agent's loader names these programs (keling-agent's `bpf::programs`), and
//! a test there checks that each slot holds one of them.
use super::{
    accounting,
    deferred::{self, CloseRange, TailCalls, Work},
    files, orphans,
};

tail_called!(
    /// [`Work::ReleaseFile`].
    keling_release_file,
    keling_release_file_kprobe,
    release_file
);

fn release_file<C: TailCalls>(ctx: &C) {
    if let Some((pid, tid, Work::ReleaseFile { file_id })) = deferred::pop() {
        accounting::release_file(pid, tid, file_id);
    }
    deferred::run(ctx);
}

tail_called!(
    /// [`Work::TeardownShared`]: one handle of the client's shared list per run, the
    /// item updated in place; then the contributors' step.
    keling_teardown_shared,
    keling_teardown_shared_kprobe,
    teardown_shared
);

fn teardown_shared<C: TailCalls>(ctx: &C) {
    if let Some((pid, tid, w)) = deferred::front()
        && let Work::TeardownShared(t) = w
    {
        match accounting::teardown_shared(pid, tid, t) {
            Some(next) if next != 0 => t.next_handle = next,
            _ => w.start_contributors_step(),
        }
    }
    deferred::run(ctx);
}

tail_called!(
    /// [`Work::TeardownContributors`]: a few contributor slots per run.
    keling_teardown_contributors,
    keling_teardown_contributors_kprobe,
    teardown_contributors
);

fn teardown_contributors<C: TailCalls>(ctx: &C) {
    if let Some((pid, tid, w)) = deferred::front()
        && let Work::TeardownContributors(t) = w
    {
        if accounting::teardown_contributors(pid, tid, t) {
            t.next_contributor += accounting::CONTRIBUTORS_PER_RUN as u32;
        } else {
            let _ = deferred::pop();
        }
    }
    deferred::run(ctx);
}

tail_called!(
    /// [`Work::CloseRange`]: one slot per run.
    keling_close_range,
    keling_close_range_kprobe,
    close_range
);

fn close_range<C: TailCalls>(ctx: &C) {
    if let Some((pid, tid, Work::CloseRange(c))) = deferred::pop() {
        let next_slot = files::close_range_step(c.pid, tid, c.first_fd, c.last_fd, c.next_slot);
        if next_slot != u32::MAX {
            deferred::push_front(pid, tid, Work::CloseRange(CloseRange { next_slot, ..c }));
        }
    }
    deferred::run(ctx);
}

tail_called!(
    /// [`Work::Orphan`]: the file, whose fd the queue's process just dropped while
    /// other references remain, becomes an orphan unless that process still has
    /// another fd of it.
    keling_orphan,
    keling_orphan_kprobe,
    orphan
);

fn orphan<C: TailCalls>(ctx: &C) {
    if let Some((pid, _, Work::Orphan { file_id })) = deferred::pop() {
        orphans::add_orphan(pid, file_id);
    }
    deferred::run(ctx);
}

tail_called!(
    /// [`Work::Sweep`]: checks the next few orphan slots.
    keling_sweep,
    keling_sweep_kprobe,
    sweep
);

fn sweep<C: TailCalls>(ctx: &C) {
    let _ = deferred::pop();
    orphans::sweep();
    deferred::run(ctx);
}
