//! Launches: `keling launch` requests turned into tasks, and the held children
//! of launched tasks until they exec.
//!
//! A launch is checked against the access rules (who may use which priority, how
//! much memory), the config's rules fill in what it leaves out ([`terms`]), and
//! its command is started in a cgroup of its own, as its caller, held before exec
//! until the probes track it ([`start`], on the [`Host`]). It arrives in the core at once (its GPU
//! calls are attributed from the first); the client hears `accepted` once the
//! exec succeeded, or the step that failed, and then its exit code.
//!
//! The held child execs when the core places it (`Place`, [`Launches::release`]),
//! with `CUDA_VISIBLE_DEVICES` of that GPU written in at its release, and without
//! waiting for the exec: a command whose start blocks (a working directory on a
//! hung mount, a slow exec) blocks only itself. At arrival (the default binding)
//! that is the same step as its arrival. Under late binding an unpinned task the
//! core cannot run yet stays held, unbound, in the core's host-level queue: it
//! runs nothing, holds nothing and is never frozen; its client hears `queued`
//! (position, why) and later `placed`. A queued task that is signalled, or that
//! Keling ends, is killed before it ran anything ([`Launches::cancel`]).
use crate::os::spawn::StartError;
use std::{collections::HashMap, os::fd::OwnedFd};

use keling_sched::{Binding, Scheduler, TaskId, TaskSpec};

use super::{
    config::{Config, Settings},
    host::{EnvGpu, Host, Launch},
    members::TaskRuntime,
    notify::Clients,
};
use crate::{
    control::{Accepted, ErrorKind, LaunchRequest, ReplyError},
    event::decode::ExitStatus,
    os::{proc::ProcessFacts, users::Credentials},
};

/// The lowest priority (the highest number) a launch may ask for.
pub const MAX_PRIORITY: u8 = 15;

/// Every entry of a launch's environment is `KEY=VALUE`, with a key, and no NUL
/// (which no environment can carry): the first that is not is named.
fn check_env(entries: &[String]) -> Result<(), String> {
    for e in entries {
        let shown = e.escape_debug().to_string();
        let shown = if shown.chars().count() > 80 {
            format!("{}...", shown.chars().take(80).collect::<String>())
        } else {
            shown
        };
        if e.contains('\0') {
            return Err(format!(
                "environment entry \"{shown}\" contains a NUL byte, which no environment can \
                 carry: remove it"
            ));
        }
        match e.split_once('=') {
            Some((k, _)) if !k.is_empty() => {}
            Some(_) => {
                return Err(format!(
                    "environment entry \"{shown}\" has no name before its `=`: entries are KEY=VALUE"
                ));
            }
            None => {
                return Err(format!(
                    "environment entry \"{shown}\" has no `=`: entries are KEY=VALUE"
                ));
            }
        }
    }
    Ok(())
}

/// What a launch request comes to once checked against the access rules and
/// completed by the config's.
pub struct Terms {
    pub priority: u8,
    pub mem_quota_bytes: Option<u64>,
    /// The GPU it is bound to at arrival; `None` under late binding (the core
    /// binds it) or with no GPU list known.
    pub gpu: Option<u32>,
    pub env_gpu: EnvGpu,
    /// What the config's rule for the command says.
    rule: Settings,
}

/// Checks a launch against the access rules and fills in what it leaves out from
/// the config's rules: its priority, quota and GPU. `now_ns`: when the GPUs'
/// placement weights are read.
pub fn terms(
    req: &LaunchRequest,
    creds: &Credentials,
    config: &Config,
    default_priority: u8,
    sched: &Scheduler,
    now_ns: u64,
) -> Result<Terms, ReplyError> {
    let argv0 = req.argv.first().map(String::as_str).unwrap_or_default();
    if argv0.is_empty() {
        return Err(ReplyError::new(ErrorKind::Invalid, "no command given"));
    }
    if let Some(p) = req.priority
        && p > MAX_PRIORITY
    {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            format!("priority {p} is out of range: priorities are 0 (highest) to {MAX_PRIORITY}"),
        ));
    }
    if let Some(env) = &req.env {
        check_env(env).map_err(|why| ReplyError::new(ErrorKind::Invalid, why))?;
    }
    let facts = ProcessFacts {
        comm: argv0
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .chars()
            .take(15)
            .collect(),
        uid: Some(creds.uid),
        cgroup: None,
        exe: argv0.starts_with('/').then(|| argv0.to_owned()),
        gid: Some(creds.gid),
        groups: creds.groups.clone(),
    };
    let (rule, _) = config.settings_for(&facts);
    let (priority, mem_quota_bytes) = config
        .access_policy
        .launch_terms(
            creds,
            req.priority,
            rule.priority,
            default_priority,
            req.mem_quota_bytes.or(rule.mem_quota_bytes),
        )
        .map_err(|why| ReplyError::new(ErrorKind::Refused, why))?;
    // The host's session limit (the rule's for this command, else the
    // agent's) is a limit: a shorter one is anyone's to ask, a longer one
    // root's only.
    let limit_ms = rule
        .max_duration_ms
        .unwrap_or(sched.config().default_max_duration_ms);
    if let Some(asked) = req.max_duration_ms
        && asked > limit_ms
        && creds.uid != 0
    {
        return Err(ReplyError::new(
            ErrorKind::Refused,
            format!(
                "a session limit of {asked} ms is over this host's {limit_ms} ms for this \
                 command: ask for {limit_ms} ms or less (or none), or ask its administrator"
            ),
        ));
    }
    let late = sched.config().binding == Binding::Late;
    if let Some(g) = req.gpu.or(rule.gpu) {
        check_gpu_exists(g, sched)?;
    }
    let gpu = match req.gpu.or(rule.gpu) {
        Some(g) => Some(g),
        // Late binding: the core binds it when a GPU can run it.
        None if late => None,
        None => sched
            .placement_weights(now_ns)
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|&(g, _)| g),
    };
    let env_gpu = if late && gpu.is_none() {
        EnvGpu::AtPlacement
    } else {
        EnvGpu::Chosen(gpu)
    };
    Ok(Terms {
        priority,
        mem_quota_bytes,
        gpu,
        env_gpu,
        rule,
    })
}

/// A GPU a launch names must be one of the host's (when Keling knows them): a
/// pin to a GPU that does not exist would never be scheduled against anyone.
pub(super) fn check_gpu_exists(gpu: u32, sched: &Scheduler) -> Result<(), ReplyError> {
    let known: Vec<u32> = sched.config().gpus.iter().map(|g| g.index).collect();
    if known.is_empty() || known.contains(&gpu) {
        return Ok(());
    }
    let list = known
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Err(ReplyError::new(
        ErrorKind::Invalid,
        format!("GPU {gpu} does not exist on this host: its GPUs are {list}"),
    ))
}

impl Terms {
    /// The task's spec for the core.
    pub fn spec(&self, req: &LaunchRequest, id: TaskId, pid: u32) -> TaskSpec {
        let argv0 = req.argv.first().map(String::as_str).unwrap_or_default();
        TaskSpec {
            id,
            pid,
            name: super::task_name(argv0.rsplit('/').next().unwrap_or_default()),
            priority: self.priority,
            gpu: self.gpu,
            mem_quota_bytes: self.mem_quota_bytes,
            max_duration_ms: req.max_duration_ms.or(self.rule.max_duration_ms),
            grace_ms: req.grace_ms.or(self.rule.grace_ms),
            hard_kill: req.hard_kill.or(self.rule.hard_kill),
            expected_runtime_ms: req.expected_runtime_ms,
        }
    }

    /// Where the log says it went.
    pub fn placement(&self) -> String {
        match (self.gpu, self.env_gpu) {
            (Some(g), _) => format!("on GPU {g}"),
            (None, EnvGpu::AtPlacement) => "unbound (late binding)".into(),
            (None, EnvGpu::Chosen(_)) => {
                "on GPU 0 (no GPU list known: CUDA_VISIBLE_DEVICES left as given)".into()
            }
        }
    }
}

/// A launch started: the task's record and what its client is owed.
pub struct Started {
    pub task: TaskRuntime,
    /// What its client hears once the exec succeeded.
    pub accepted: Accepted,
}

/// Starts launched task `id` under `terms` on the host ([`Host::start`]): in a
/// cgroup of its own, as its caller, held before exec, tracked by the probes
/// (`track`). Hold it with [`Launches::hold`].
#[expect(clippy::too_many_arguments, reason = "each is one fact of the launch")]
pub fn start(
    id: TaskId,
    req: &LaunchRequest,
    stdio: &[OwnedFd],
    creds: &Credentials,
    caller_pid: Option<u32>,
    conn: u64,
    terms: &Terms,
    host: &mut dyn Host,
    track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
) -> Result<Started, ReplyError> {
    let launch = Launch {
        request: req,
        stdio,
        creds,
        caller_pid,
        env_gpu: terms.env_gpu,
    };
    let started = host
        .start(id, &launch, track)
        .map_err(|e| ReplyError::new(ErrorKind::StartFailed, format!("{e:#}")))?;
    Ok(Started {
        task: TaskRuntime {
            pid: started.pid,
            actuator: started.actuator,
            cgroup: Some(started.cgroup),
            uid: creds.uid,
            our_child: true,
            conn: Some(conn),
            last_active_ns: 0,
            exit_seen: None,
            exited_ns: None,
            slurm: None,
        },
        accepted: Accepted {
            task: id,
            gpu: terms.gpu,
            pid: started.pid,
        },
    })
}

/// The launched tasks not yet released to exec: queued (late binding), or
/// between their fork and their `Place`; where each one's
/// `CUDA_VISIBLE_DEVICES` comes from. (The children themselves are the host's.)
#[derive(Default)]
pub struct Launches(HashMap<TaskId, EnvGpu>);

impl Launches {
    pub fn hold(&mut self, id: TaskId, env_gpu: EnvGpu) {
        self.0.insert(id, env_gpu);
    }

    pub fn is_held(&self, id: TaskId) -> bool {
        self.0.contains_key(&id)
    }

    /// Lets a held task exec on `gpu` (where the core placed it); the exec's
    /// outcome comes back as [`Wake::Exec`](super::host::Wake::Exec). A task
    /// released already (a pinned task placed again) is left alone.
    pub fn release(&mut self, id: TaskId, gpu: u32, clients: &mut Clients, host: &mut dyn Host) {
        let Some(env_gpu) = self.0.remove(&id) else {
            return;
        };
        let at = match env_gpu {
            EnvGpu::Chosen(_) => None, // in its environment since the fork
            EnvGpu::AtPlacement => Some(gpu),
        };
        if let Some(g) = at {
            clients.bound(id, g);
        }
        if let Err(e) = host.release(id, at) {
            // The child was reaped; its end comes back as usual.
            log::warn!("task {id}: {e:#}");
            clients.exec_outcome(id, Err(StartError::other(format!("{e:#}"))));
        }
    }

    /// Ends a task that is still held (it never ran its command) and says so to
    /// its client.
    pub fn cancel(&mut self, id: TaskId, why: &str, clients: &mut Clients, host: &mut dyn Host) {
        if self.0.remove(&id).is_none() {
            return;
        }
        log::info!("task {id}: {why} while queued; its command never ran");
        // Killed unreaped: its end comes back, which ends the task.
        host.cancel(id);
        clients.never_ran(
            id,
            format!("task {id} was {why} while queued: its command never ran"),
        );
    }

    /// A signal for a task still held before exec: one whose default action
    /// ends a process ends it (it never runs); the others have nothing to act
    /// on. The number of processes signalled.
    pub fn signal(
        &mut self,
        id: TaskId,
        signal: i32,
        clients: &mut Clients,
        host: &mut dyn Host,
    ) -> usize {
        const HARMLESS: [i32; 8] = [
            libc::SIGCHLD,
            libc::SIGCONT,
            libc::SIGSTOP,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGURG,
            libc::SIGWINCH,
        ];
        if HARMLESS.contains(&signal) {
            return 0;
        }
        self.cancel(id, &format!("sent signal {signal}"), clients, host);
        1
    }

    /// The task ended while held by something other than Keling (its pid was
    /// killed): it never ran, and no exec outcome will come.
    pub fn ended(&mut self, id: TaskId, status: ExitStatus, clients: &mut Clients) {
        if self.0.remove(&id).is_some() {
            clients.never_ran(
                id,
                format!("task {id} ended while queued ({status:?}): its command never ran"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use keling_sched::{SchedConfig, Scheduler};

    use super::*;

    fn request(priority: Option<u8>, env: Option<Vec<&str>>) -> LaunchRequest {
        LaunchRequest {
            argv: vec!["/usr/bin/work".into()],
            cwd: "/".into(),
            priority,
            gpu: None,
            max_duration_ms: None,
            grace_ms: None,
            mem_quota_bytes: None,
            hard_kill: None,
            expected_runtime_ms: None,
            env: env.map(|e| e.into_iter().map(String::from).collect()),
            notify_preempt: false,
        }
    }

    fn terms_of(req: &LaunchRequest) -> Result<Terms, ReplyError> {
        let root = Credentials {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        };
        let sched = Scheduler::new(SchedConfig::default());
        terms(req, &root, &Config::parse("").unwrap(), 8, &sched, 0)
    }

    /// Issue 32: priority 16 or 255 over the socket was clamped to 15 without a
    /// word (the CLI refuses 16).
    #[test]
    fn a_priority_out_of_range_is_refused_with_the_range() {
        for p in [16, 255] {
            let Err(e) = terms_of(&request(Some(p), None)) else {
                panic!("priority {p} accepted");
            };
            assert_eq!(e.kind, ErrorKind::Invalid);
            assert!(
                e.message.contains(&format!("priority {p} is out of range"))
                    && e.message.contains("0 (highest) to 15"),
                "{}",
                e.message
            );
        }
        for p in [0, 15] {
            assert_eq!(terms_of(&request(Some(p), None)).ok().unwrap().priority, p);
        }
    }

    /// Issue 32: env entries with a NUL or without `=` were dropped silently.
    #[test]
    fn a_bad_environment_entry_is_refused_by_name() {
        for (entry, why) in [
            ("FOO", "has no `=`"),
            ("=x", "has no name"),
            ("A=b\0c", "contains a NUL byte"),
        ] {
            let Err(e) = terms_of(&request(None, Some(vec!["PATH=/bin", entry]))) else {
                panic!("{entry:?} accepted");
            };
            assert_eq!(e.kind, ErrorKind::Invalid);
            let shown = entry.escape_debug().to_string();
            assert!(
                e.message.contains(&format!("\"{shown}\"")) && e.message.contains(why),
                "{}",
                e.message
            );
        }
        let ok = request(None, Some(vec!["PATH=/bin", "EMPTY=", "X==y"]));
        assert!(terms_of(&ok).is_ok());
    }

    /// The host's session limit binds a launch: a user asking for a longer
    /// one than the rule for the command gives (else `[defaults]`, else the
    /// agent's) is refused with both figures; a shorter one, or none, is
    /// theirs; root may ask for more. Before, `--max-duration-ms` bought any
    /// session length on a host whose administrator fixed it at an hour.
    #[test]
    fn a_session_limit_over_the_hosts_is_refused_to_users() {
        let config = Config::parse(
            "[defaults]\nmax_duration_ms = 60000\n\
             [[rule]]\nname = \"train\"\nexe = \"/usr/bin/train\"\nmax_duration_ms = 7200000\n",
        )
        .unwrap();
        let sched = Scheduler::new(SchedConfig::default());
        let who = |uid| Credentials {
            uid,
            gid: uid,
            groups: Vec::new(),
        };
        let ask = |argv0: &str, ms: Option<u64>, uid: u32| {
            let mut req = request(None, None);
            req.argv = vec![argv0.into()];
            req.max_duration_ms = ms;
            terms(&req, &who(uid), &config, 8, &sched, 0)
        };
        let Err(e) = ask("/usr/bin/work", Some(120_000), 1000) else {
            panic!("a session limit over the host's was accepted");
        };
        assert_eq!(e.kind, ErrorKind::Refused);
        assert!(
            e.message.contains("120000 ms") && e.message.contains("60000 ms"),
            "{}",
            e.message
        );
        assert!(ask("/usr/bin/work", Some(60_000), 1000).is_ok());
        assert!(ask("/usr/bin/work", Some(1_000), 1000).is_ok());
        assert!(ask("/usr/bin/work", None, 1000).is_ok());
        assert!(
            ask("/usr/bin/train", Some(120_000), 1000).is_ok(),
            "the rule's limit"
        );
        assert!(ask("/usr/bin/train", Some(7_200_001), 1000).is_err());
        assert!(
            ask("/usr/bin/work", Some(120_000), 0).is_ok(),
            "root's to ask"
        );
    }
}
