//! The control requests the daemon serves, one method each: status (a page of
//! it, a task's history) and latency exports are read from its state through
//! [`StatusView`](super::status_view::StatusView); a launch starts a task and
//! makes it arrive in the core; a signal (from anyone allowed, or forwarded by a
//! launch's client) reaches a task's processes.
use std::os::fd::OwnedFd;

use keling_sched::Input;

use super::{Daemon, launch};
use crate::control::{
    ErrorKind, ExportFormat, FORWARDED_SIGNALS, LaunchRequest, Reply, ReplyError, Request,
    SignalRequest,
    server::{Incoming, Peer, Replier},
};

impl Daemon {
    /// Answers one control request. `track` makes the probes follow a process.
    pub fn handle(&mut self, incoming: Incoming, track: &mut dyn FnMut(u32) -> anyhow::Result<()>) {
        let Incoming {
            request,
            fds,
            reply,
            peer,
            conn,
        } = incoming;
        match request {
            Request::Status(_) => reply.send(Reply::Status(Box::new(
                self.view().status_for(Some(peer.creds.uid)),
            ))),
            Request::StatusPage(page) => reply.send(Reply::Status(Box::new(
                self.view().status_page(Some(peer.creds.uid), page),
            ))),
            Request::History(id) => reply.send(match self.view().history(id, peer.creds.uid) {
                Some(h) => Reply::History(Box::new(h)),
                None => Reply::Error(ReplyError::new(
                    ErrorKind::NotFound,
                    format!(
                        "no task {id} (finished tasks are kept for {} s, the last {} of them)",
                        self.settings.archive_retention_ns / 1_000_000_000,
                        self.settings.archive_max
                    ),
                )),
            }),
            Request::Export(ExportFormat::Tune) => {
                // Up to the window's decisions through every model: off the
                // loop (on a runtime; inline where there is none, in tests).
                let series = self.latency_series();
                let answer = move || {
                    let text = crate::latency::tune_report(&series).to_string();
                    reply.send(Reply::Export(text));
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(rt.spawn_blocking(answer)),
                    Err(_) => answer(),
                }
            }
            Request::Export(format) => reply.send(match self.export(format) {
                Ok(text) => Reply::Export(text),
                Err(e) => Reply::Error(ReplyError::new(ErrorKind::Internal, format!("{e:#}"))),
            }),
            Request::Launch(req) => {
                if let Err(e) = self.launch(&req, &fds, &peer, conn, &reply, track) {
                    log::info!("launch by uid {} refused: {e}", peer.creds.uid);
                    reply.send(Reply::Error(e));
                }
            }
            Request::Signal(s) => reply.send(self.signal_request(&s, &peer)),
            Request::Attach(req) => {
                if let Err(e) = self.attach(&req, &peer, conn, &reply) {
                    log::info!("attach by uid {} refused: {e}", peer.creds.uid);
                    reply.send(Reply::Error(e));
                }
            }
            Request::Forward(signal) => self.forward(conn, signal),
            Request::Gpus(_) => reply.send(Reply::Gpus(self.sched.config().gpus.clone())),
            Request::SlurmAttach(req) => {
                if let Err(e) = self.slurm_attach(&req, fds, &peer, &reply, track) {
                    log::info!("attach of pid {} refused: {e}", req.pid);
                    reply.send(Reply::Error(e));
                }
            }
        }
    }

    /// `{"signal": ...}`: the task's owner or root may signal it.
    fn signal_request(&mut self, s: &SignalRequest, peer: &Peer) -> Reply {
        let Some(t) = self.members.get(s.task) else {
            return Reply::Error(ReplyError::new(
                ErrorKind::NotFound,
                format!("no running task {}", s.task),
            ));
        };
        if !self.config.access_policy.may_act_on(&peer.creds, t.uid) {
            return Reply::Error(ReplyError::new(
                ErrorKind::NotPermitted,
                format!(
                    "task {} belongs to uid {}: only its owner or root may signal it",
                    s.task, t.uid
                ),
            ));
        }
        if !(1..=64).contains(&s.signal) {
            return Reply::Error(ReplyError::new(
                ErrorKind::Invalid,
                format!("{} is not a signal", s.signal),
            ));
        }
        if self.launches.is_held(s.task) {
            let n = self
                .launches
                .signal(s.task, s.signal, &mut self.clients, &mut *self.host);
            return Reply::Signalled(n);
        }
        Reply::Signalled(t.actuator.signal(s.signal))
    }

    /// A signal forwarded by a launch's client to its own task.
    fn forward(&mut self, conn: u64, signal: i32) {
        if !FORWARDED_SIGNALS.contains(&signal) {
            log::warn!("connection {conn}: signal {signal} is not one that is forwarded");
            return;
        }
        let Some(&id) = self.conn_task.get(&conn) else {
            return;
        };
        if self.launches.is_held(id) {
            self.launches
                .signal(id, signal, &mut self.clients, &mut *self.host);
            return;
        }
        if let Some(t) = self.members.get(id) {
            let n = t.actuator.signal(signal);
            log::debug!(
                "forwarded signal {signal} to {n} process(es) of pid {}",
                t.pid
            );
        }
    }

    /// Starts a launched task (see [`super::launch`]): it arrives in the core at
    /// once, held until the core places it.
    fn launch(
        &mut self,
        req: &LaunchRequest,
        stdio: &[OwnedFd],
        peer: &Peer,
        conn: u64,
        reply: &Replier,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> Result<(), ReplyError> {
        let creds = &peer.creds;
        let terms = launch::terms(
            req,
            creds,
            &self.config,
            self.settings.default_priority,
            &self.sched,
            self.host.now_ns(),
        )?;
        let id = self.next_id;
        self.next_id += 1;
        let caller = peer
            .pid
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0);
        let started = launch::start(
            id,
            req,
            stdio,
            creds,
            caller,
            conn,
            &terms,
            &mut *self.host,
            track,
        )?;
        let pid = started.task.pid;
        self.members.insert(id, started.task, None);
        self.launches.hold(id, terms.env_gpu);
        self.conn_task.insert(conn, id);
        self.clients
            .add(reply.clone(), started.accepted, req.notify_preempt);
        self.histories.owner(id, creds.uid);
        log::info!(
            "task {id}: pid {pid} {:?} for uid {} {}",
            req.argv,
            creds.uid,
            terms.placement()
        );
        self.step_now(&Input::Arrive {
            spec: terms.spec(req, id, pid),
            ts_ns: self.host.now_ns(),
        });
        if let Some(q) = self.sched.queued(id) {
            log::info!(
                "task {id}: queued unbound at position {} ({})",
                q.position,
                q.reason.as_str()
            );
            self.clients.tell_queued(id, pid, &self.sched);
        }
        Ok(())
    }
}
