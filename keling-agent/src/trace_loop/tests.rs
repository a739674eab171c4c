//! The trace loop with no root and no kernel: fakes of the kernel's maps and
//! the ring buffer, signals as a channel, the output captured as JSON lines.
//! Under tokio's paused clock where no process is involved; with a real child
//! (`sleep`, Keling's own) where its end is what is tested.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use keling_common::{EventHeader, EventKind};
use tokio::sync::mpsc;

use super::{Ask, Asks, Child, End, TraceKernel, Tracer};
use crate::{
    event::{
        decode::Event,
        fake::{FakeEvents, Ring},
    },
    gpu::stats::{CallCounts, GpuAccounting},
    output::{self, Format, capture::Capture},
    process_model::Model,
};

/// The kernel's maps: how many processes it tracks, as the test sets it.
#[derive(Clone, Default)]
struct FakeKernel {
    tracked: Arc<Mutex<usize>>,
    settled: Arc<Mutex<u32>>,
}

impl TraceKernel for FakeKernel {
    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting> {
        Ok(GpuAccounting::default())
    }

    fn drops_per_cpu(&self) -> anyhow::Result<Vec<u64>> {
        Ok(vec![0, 0])
    }

    fn tracked_processes(&self) -> anyhow::Result<usize> {
        Ok(*self.tracked.lock().unwrap())
    }

    async fn settle_orphans(&self, _: Duration) -> anyhow::Result<()> {
        *self.settled.lock().unwrap() += 1;
        Ok(())
    }

    fn call_counts(&self) -> anyhow::Result<CallCounts> {
        Ok(CallCounts::default())
    }

    fn ioctl_backend(&self) -> &'static str {
        "fake"
    }

    fn nvml_rule(&self) -> anyhow::Result<crate::gpu::nvml::RuleParts> {
        Ok(Default::default())
    }
}

struct FakeAsks(mpsc::UnboundedReceiver<Ask>);

impl Asks for FakeAsks {
    async fn next(&mut self) -> Ask {
        match self.0.recv().await {
            Some(a) => a,
            None => std::future::pending().await,
        }
    }
}

/// A trace over the fakes; the test's ends of them and the output.
struct Setup {
    kernel: FakeKernel,
    ring: Ring,
    asks: mpsc::UnboundedSender<Ask>,
    output: Arc<Mutex<Vec<u8>>>,
}

fn tracer(
    tracked: usize,
    child: Option<Child>,
    end: End,
) -> (Setup, Tracer<FakeKernel, FakeEvents>, FakeAsks) {
    let kernel = FakeKernel::default();
    *kernel.tracked.lock().unwrap() = tracked;
    let (ring, events) = FakeEvents::new();
    let (capture, output) = Capture::new();
    let sink = output::open(Format::Jsonl, Box::new(capture), 0, false);
    let (asks, asks_rx) = mpsc::unbounded_channel();
    let t = Tracer::new(
        kernel.clone(),
        events,
        Model::default(),
        sink,
        child,
        0,
        end,
        None,
    );
    let s = Setup {
        kernel,
        ring,
        asks,
        output,
    };
    (s, t, FakeAsks(asks_rx))
}

/// The `type` of each JSON line written so far.
fn written(output: &Mutex<Vec<u8>>) -> Vec<String> {
    String::from_utf8(output.lock().unwrap().clone())
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["type"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

fn fork(parent: u32, child: u32) -> Event {
    Event::Fork(keling_common::ForkEvent {
        header: EventHeader {
            kind: EventKind::Fork as u32,
            cpu: 0,
            ts_ns: 5,
            pid: parent,
            tid: parent,
        },
        child_pid: child,
        child_tid: child,
        tracked: 1,
        _reserved: 0,
        comm: [0; keling_common::COMM_LEN],
    })
}

const NO_END: End = End {
    wait_for_comms: false,
    duration: None,
};

/// Attached to running processes: events reach the output as they come (a
/// waking one at once, a detail one on the tick), and the trace ends once the
/// kernel tracks no process, after the orphans settled, with the summary last.
#[tokio::test(start_paused = true)]
async fn an_attached_trace_ends_when_the_kernel_tracks_nobody() {
    let (s, t, asks) = tracer(1, None, NO_END);
    let run = t.run(asks);
    let script = async {
        s.ring.event(fork(10, 11));
        s.ring.detail(fork(11, 12));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(written(&s.output), ["fork", "fork"], "no end while tracked");
        *s.kernel.tracked.lock().unwrap() = 0;
    };
    let (code, ()) = tokio::join!(run, script);
    assert_eq!(code.unwrap(), 0);
    assert_eq!(*s.kernel.settled.lock().unwrap(), 1);
    assert_eq!(written(&s.output), ["fork", "fork", "drops", "summary"]);
}

/// `--comm` waits for processes to exec into the name: nobody tracked is no end;
/// `--duration` is.
#[tokio::test(start_paused = true)]
async fn a_comm_trace_ends_at_its_duration_not_when_nobody_is_tracked() {
    let (s, t, asks) = tracer(
        0,
        None,
        End {
            wait_for_comms: true,
            duration: Some(Duration::from_secs(3)),
        },
    );
    let started = tokio::time::Instant::now();
    assert_eq!(t.run(asks).await.unwrap(), 0);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(*s.kernel.settled.lock().unwrap(), 0);
    assert_eq!(written(&s.output), ["drops", "summary"]);
}

/// Without a command Keling started, Ctrl-C ends the trace at once.
#[tokio::test(start_paused = true)]
async fn an_interrupt_ends_an_attached_trace() {
    let (s, t, asks) = tracer(1, None, NO_END);
    s.asks.send(Ask::Interrupt).unwrap();
    assert_eq!(t.run(asks).await.unwrap(), 0);
    assert_eq!(written(&s.output), ["drops", "summary"]);
}

/// The first SIGTERM goes to the command Keling started, and the trace goes on
/// until it ended: the exit code is the command's (128 + 15), not the 130 of a
/// trace stopped under a running command.
#[tokio::test]
async fn the_first_terminate_goes_to_the_command_whose_code_the_trace_returns() {
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("run sleep");
    let child = Child::new(sleeper.id()).unwrap();
    let (s, t, asks) = tracer(0, Some(child), NO_END);
    s.asks.send(Ask::Terminate).unwrap();
    let code = tokio::time::timeout(Duration::from_secs(20), t.run(asks))
        .await
        .expect("the trace ends once the command did");
    assert_eq!(code.unwrap(), 128 + libc::SIGTERM);
    // Reaped by the trace: nothing left to wait for.
    assert!(sleeper.try_wait().is_err());
    assert_eq!(written(&s.output), ["drops", "summary"]);
}
