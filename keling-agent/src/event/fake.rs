//! A ring buffer for tests: the test sends events, each waking the loop or not
//! (a detail event, which the kernel does not wake the agent for, is drained on
//! the next tick or drain).
use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::{EventSource, decode::Event};

/// The test's end: what it puts in the ring buffer.
#[derive(Clone)]
pub struct Ring(mpsc::UnboundedSender<(Event, bool)>);

impl Ring {
    /// An event that wakes the loop.
    pub fn event(&self, event: Event) {
        let _ = self.0.send((event, true));
    }

    /// An event that waits for the next drain.
    pub fn detail(&self, event: Event) {
        let _ = self.0.send((event, false));
    }
}

/// The loop's end.
pub struct FakeEvents {
    rx: mpsc::UnboundedReceiver<(Event, bool)>,
    waiting: VecDeque<Event>,
}

impl FakeEvents {
    pub fn new() -> (Ring, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Ring(tx),
            Self {
                rx,
                waiting: VecDeque::new(),
            },
        )
    }
}

impl EventSource for FakeEvents {
    async fn ready(&mut self) -> std::io::Result<()> {
        loop {
            match self.rx.recv().await {
                Some((event, wakes)) => {
                    self.waiting.push_back(event);
                    if wakes {
                        return Ok(());
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    fn drain(&mut self, mut on_event: impl FnMut(&Event)) {
        while let Ok((event, _)) = self.rx.try_recv() {
            self.waiting.push_back(event);
        }
        while let Some(event) = self.waiting.pop_front() {
            on_event(&event);
        }
    }

    fn decode_errors(&self) -> u64 {
        0
    }
}
