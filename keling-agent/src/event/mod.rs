//! Kernel events into the agent: the ring buffer, decoded into typed events
//! ([`decode`]); the picture of processes and threads built from them is
//! [`crate::process_model`]'s. Both `keling trace` and `keling run` read the kernel through
//! [`EventStream`], the one place that drains the ring buffer.
use std::future::Future;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

pub mod decode;
#[cfg(test)]
pub mod fake;

use decode::Event;

/// The kernel's event ring buffer, registered with tokio.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Events decoded so far.
    pub events: u64,
    /// Records that did not decode (a kernel object newer than this agent, or a bug).
    pub decode_errors: u64,
}

impl EventStream {
    pub fn new(ring: RingBuf<MapData>) -> anyhow::Result<Self> {
        Ok(Self {
            ring: crate::os::async_fd(ring)?,
            events: 0,
            decode_errors: 0,
        })
    }

    /// Waits until the kernel wakes the agent (events it must not wait for are
    /// waiting). Detail events do not wake it: drain on a timer too.
    pub async fn ready(&mut self) -> std::io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        // Cleared before draining: whatever arrives after the drain wakes us again.
        guard.clear_ready();
        Ok(())
    }

    /// Decodes every event waiting, in order, handing each to `on_event`.
    pub fn drain(&mut self, mut on_event: impl FnMut(&Event)) {
        while let Some(item) = self.ring.get_mut().next() {
            match decode::decode(&item) {
                Ok(event) => {
                    self.events += 1;
                    on_event(&event);
                }
                Err(e) => {
                    if self.decode_errors == 0 {
                        log::warn!("undecodable event from the kernel: {e}");
                    }
                    self.decode_errors += 1;
                }
            }
        }
    }
}

/// The kernel's decoded events.
pub trait EventSource {
    /// Waits until events the loop must not wait for are there (others are
    /// drained on the tick).
    fn ready(&mut self) -> impl Future<Output = std::io::Result<()>>;
    /// Hands every event waiting to `on_event`, in order.
    fn drain(&mut self, on_event: impl FnMut(&Event));
    /// Records that did not decode so far.
    fn decode_errors(&self) -> u64;
}

impl EventSource for EventStream {
    fn ready(&mut self) -> impl Future<Output = std::io::Result<()>> {
        EventStream::ready(self)
    }

    fn drain(&mut self, on_event: impl FnMut(&Event)) {
        EventStream::drain(self, on_event);
    }

    fn decode_errors(&self) -> u64 {
        self.decode_errors
    }
}
