//! The agent's configuration file (TOML): rules that give GPU processes a priority,
//! a GPU, a memory quota and a duration limit, and the defaults for the rest.
//!
//! ```toml
//! [defaults]               # processes no rule matches
//! priority = 8
//! max_duration_ms = 3600000
//! grace_ms = 30000
//! hard_kill = true
//! manage_unmatched = false # schedule GPU processes Keling did not launch and no rule names
//!
//! [overload]               # the overload rule (off without this section or `keling run --overload`)
//! session_ms = 200         # a running session past this long (since it arrived)
//! mem_peak_pct = 95        # on a GPU whose memory in use peaked at this % of capacity
//! min_waiting = 8          # while at least this many tasks wait for it: truncated (4004)
//!
//! [[gpu]]                  # capacities when neither NVML nor the simulator tells
//! index = 0
//! capacity_bytes = 85899345920
//!
//! [access]                 # who may use the control socket, and how
//! group = "keling"         # besides root, members of this group may launch and read status
//!                          # (default "keling"; if that group does not exist, root only)
//! min_priority = 3         # the highest priority (lowest number) a user may ask for:
//!                          # 3 by default, so the real-time class 0-2 is root's
//! mem_quota_bytes = 8589934592 # each task of a user holds at most this much GPU memory
//!
//! [[grant]]                # users or groups with other limits; the first that matches wins
//! user = "alice"           # or uid = 1000, or group = "realtime" (one of them)
//! min_priority = 0
//! mem_quota_bytes = 17179869184
//!
//! [[rule]]
//! name = "inference"       # every matcher given must match
//! comm = "python3"         # /proc/PID/comm
//! uid = 1000               # real uid
//! cgroup = "/user.slice"   # cgroup v2 path prefix
//! exe = "/usr/bin/python3.11"
//! priority = 3
//! gpu = 0
//! mem_quota_bytes = 17179869184
//! max_duration_ms = 7200000
//! ```
//!
//! The agent refuses to start on an invalid file; every error names the file,
//! the line and what is wrong. User and group names are resolved when the file is
//! read (at start): a name that does not exist is an error.
//!
//! Root may always use every priority, and its tasks have no quota but their own.
//! A user's quota applies to each task of theirs (the core enforces quotas per
//! task); a task asking for a larger one gets the user's.
use std::{ops::Range, path::Path};

use serde::Deserialize;
use toml::Spanned;

use keling_sched::GpuInfo;

use super::access::{AccessPolicy, Limits, Who};
pub use crate::os::proc::ProcessFacts;
use crate::{
    defaults,
    os::users::{gid_of_group, uid_of_user},
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub defaults: Defaults,
    #[serde(default, rename = "rule")]
    pub rules: Vec<Spanned<Rule>>,
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<GpuInfo>,
    #[serde(default)]
    pub access: AccessSection,
    #[serde(default, rename = "grant")]
    pub grants: Vec<Spanned<GrantSection>>,
    /// `[overload]`: the overload rule on, with these thresholds (the
    /// article's where left out).
    pub overload: Option<Spanned<OverloadSection>>,
    /// `access` and `grants`, resolved (names to ids) and checked.
    #[serde(skip)]
    pub access_policy: AccessPolicy,
}

/// `[access]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSection {
    pub group: Option<Spanned<String>>,
    pub min_priority: Option<Spanned<u8>>,
    pub mem_quota_bytes: Option<u64>,
}

/// `[overload]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverloadSection {
    pub session_ms: Option<u64>,
    pub mem_peak_pct: Option<u32>,
    pub min_waiting: Option<u32>,
}

impl Config {
    /// The overload rule `[overload]` asks for, if any.
    pub fn overload_rule(&self) -> Option<keling_sched::OverloadRule> {
        let o = self.overload.as_ref()?.get_ref();
        let article = keling_sched::OverloadRule::default();
        Some(keling_sched::OverloadRule {
            min_session_ms: o.session_ms.unwrap_or(article.min_session_ms),
            mem_peak_pct: o.mem_peak_pct.unwrap_or(article.mem_peak_pct),
            min_waiting: o.min_waiting.unwrap_or(article.min_waiting),
        })
    }
}

/// One `[[grant]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantSection {
    pub user: Option<String>,
    pub uid: Option<u32>,
    pub group: Option<String>,
    pub min_priority: Option<Spanned<u8>>,
    pub mem_quota_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub priority: Option<Spanned<u8>>,
    pub max_duration_ms: Option<u64>,
    pub grace_ms: Option<u64>,
    pub hard_kill: Option<bool>,
    pub mem_quota_bytes: Option<u64>,
    #[serde(default)]
    pub manage_unmatched: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    pub comm: Option<String>,
    pub uid: Option<u32>,
    pub cgroup: Option<String>,
    pub exe: Option<String>,
    pub priority: Option<Spanned<u8>>,
    pub gpu: Option<u32>,
    pub mem_quota_bytes: Option<u64>,
    pub max_duration_ms: Option<u64>,
    pub grace_ms: Option<u64>,
    pub hard_kill: Option<bool>,
}

/// What a rule (or the defaults) says about a task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub rule: Option<String>,
    pub priority: Option<u8>,
    /// Whether what matched is the process owner's to choose: no rule, or a
    /// rule that names neither a uid nor a cgroup (a `comm` or an `exe` any
    /// user can take). Such a priority is capped by the owner's `[access]`.
    pub owner_chosen: bool,
    pub gpu: Option<u32>,
    pub mem_quota_bytes: Option<u64>,
    pub max_duration_ms: Option<u64>,
    pub grace_ms: Option<u64>,
    pub hard_kill: Option<bool>,
}

fn line_of(text: &str, span: Range<usize>) -> usize {
    text[..span.start.min(text.len())].matches('\n').count() + 1
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text)
            .map_err(|(line, what)| anyhow::anyhow!("{}:{line}: {what}", path.display()))
    }

    /// Parses and checks a config; errors are (line, what is wrong).
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s));
            (line, e.message().to_owned())
        })?;
        let check_priority = |p: &Option<Spanned<u8>>| -> Result<(), (usize, String)> {
            match p {
                Some(p) if *p.get_ref() > 15 => Err((
                    line_of(text, p.span()),
                    format!(
                        "priority {} is out of range 0-15 (0 is highest)",
                        p.get_ref()
                    ),
                )),
                _ => Ok(()),
            }
        };
        check_priority(&config.defaults.priority)?;
        if let Some(o) = &config.overload
            && o.get_ref()
                .mem_peak_pct
                .is_some_and(|pct| !(1..=100).contains(&pct))
        {
            return Err((
                line_of(text, o.span()),
                "overload: mem_peak_pct must be a percentage of capacity, 1-100".to_owned(),
            ));
        }
        for rule in &config.rules {
            let line = line_of(text, rule.span());
            let r = rule.get_ref();
            check_priority(&r.priority)?;
            if r.comm.is_none() && r.uid.is_none() && r.cgroup.is_none() && r.exe.is_none() {
                return Err((
                    line,
                    format!(
                        "rule {:?} matches nothing: give comm, uid, cgroup or exe",
                        r.name
                    ),
                ));
            }
            if let (Some(max), Some(grace)) = (r.max_duration_ms, r.grace_ms)
                && grace >= max
            {
                return Err((
                    line,
                    format!(
                        "rule {:?}: grace_ms {grace} must be below max_duration_ms {max}",
                        r.name
                    ),
                ));
            }
        }
        for p in config
            .grants
            .iter()
            .filter_map(|g| g.get_ref().min_priority.as_ref())
            .chain(config.access.min_priority.as_ref())
        {
            check_priority(&Some(p.clone()))?;
        }
        config.access_policy = config.resolve_access(text)?;
        Ok(config)
    }

    /// `[access]` and `[[grant]]` with names resolved to ids.
    fn resolve_access(&self, text: &str) -> Result<AccessPolicy, (usize, String)> {
        let a = &self.access;
        let group = match &a.group {
            Some(g) => {
                let name = g.get_ref();
                let gid = gid_of_group(name).ok_or_else(|| {
                    (
                        line_of(text, g.span()),
                        format!("[access] group {name:?} does not exist"),
                    )
                })?;
                Some((name.clone(), gid))
            }
            // The default group is optional: without it, only root may connect.
            None => gid_of_group(defaults::SOCKET_GROUP)
                .map(|gid| (defaults::SOCKET_GROUP.to_owned(), gid)),
        };
        let limits = Limits {
            min_priority: a
                .min_priority
                .as_ref()
                .map_or(defaults::USER_MIN_PRIORITY, |p| *p.get_ref()),
            mem_quota_bytes: a.mem_quota_bytes,
        };
        let mut grants = Vec::new();
        for g in &self.grants {
            let line = line_of(text, g.span());
            let r = g.get_ref();
            let who = match (&r.user, r.uid, &r.group) {
                (Some(name), None, None) => Who::Uid(
                    uid_of_user(name)
                        .ok_or_else(|| (line, format!("grant: user {name:?} does not exist")))?,
                ),
                (None, Some(uid), None) => Who::Uid(uid),
                (None, None, Some(name)) => Who::Gid(
                    gid_of_group(name)
                        .ok_or_else(|| (line, format!("grant: group {name:?} does not exist")))?,
                ),
                _ => {
                    return Err((
                        line,
                        "a grant names exactly one of user, uid or group".to_owned(),
                    ));
                }
            };
            grants.push((
                who,
                Limits {
                    min_priority: r
                        .min_priority
                        .as_ref()
                        .map_or(limits.min_priority, |p| *p.get_ref()),
                    mem_quota_bytes: r.mem_quota_bytes.or(limits.mem_quota_bytes),
                },
            ));
        }
        Ok(AccessPolicy {
            group,
            limits,
            grants,
        })
    }

    /// The first rule every given matcher of which matches `p`, as settings; else
    /// the defaults (`rule` None). The bool says whether anything matched or the
    /// defaults ask to manage unmatched processes.
    pub fn settings_for(&self, p: &ProcessFacts) -> (Settings, bool) {
        for rule in &self.rules {
            let r = rule.get_ref();
            let ok = r.comm.as_ref().is_none_or(|c| *c == p.comm)
                && r.uid.is_none_or(|u| Some(u) == p.uid)
                && r.cgroup.as_ref().is_none_or(|c| {
                    p.cgroup
                        .as_ref()
                        .is_some_and(|pc| pc.starts_with(c.as_str()))
                })
                && r.exe.as_ref().is_none_or(|e| p.exe.as_ref() == Some(e));
            if ok {
                let settings = Settings {
                    rule: Some(r.name.clone()),
                    owner_chosen: r.uid.is_none() && r.cgroup.is_none(),
                    priority: r
                        .priority
                        .as_ref()
                        .map(|p| *p.get_ref())
                        .or(self.default_priority()),
                    gpu: r.gpu,
                    mem_quota_bytes: r.mem_quota_bytes.or(self.defaults.mem_quota_bytes),
                    max_duration_ms: r.max_duration_ms.or(self.defaults.max_duration_ms),
                    grace_ms: r.grace_ms.or(self.defaults.grace_ms),
                    hard_kill: r.hard_kill.or(self.defaults.hard_kill),
                };
                return (settings, true);
            }
        }
        let d = &self.defaults;
        let settings = Settings {
            rule: None,
            owner_chosen: true,
            priority: self.default_priority(),
            gpu: None,
            mem_quota_bytes: d.mem_quota_bytes,
            max_duration_ms: d.max_duration_ms,
            grace_ms: d.grace_ms,
            hard_kill: d.hard_kill,
        };
        (settings, d.manage_unmatched)
    }

    fn default_priority(&self) -> Option<u8> {
        self.defaults.priority.as_ref().map(|p| *p.get_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[defaults]
priority = 9
max_duration_ms = 1000000

[[gpu]]
index = 0
capacity_bytes = 1024

[[rule]]
name = "infer"
comm = "python3"
uid = 1000
priority = 3
gpu = 1

[[rule]]
name = "batch"
cgroup = "/batch"
priority = 12
"#;

    fn facts(comm: &str, uid: u32, cgroup: &str) -> ProcessFacts {
        ProcessFacts {
            comm: comm.into(),
            uid: Some(uid),
            cgroup: Some(cgroup.into()),
            ..ProcessFacts::default()
        }
    }

    #[test]
    fn rules_match_in_order_and_fill_from_defaults() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(
            c.gpus,
            vec![GpuInfo {
                index: 0,
                capacity_bytes: 1024
            }]
        );
        let (s, managed) = c.settings_for(&facts("python3", 1000, "/user.slice/x"));
        assert!(managed);
        assert_eq!(s.rule.as_deref(), Some("infer"));
        assert_eq!(
            (s.priority, s.gpu, s.max_duration_ms),
            (Some(3), Some(1), Some(1_000_000))
        );
        // uid differs: the first rule does not match; the second needs /batch.
        let (s, managed) = c.settings_for(&facts("python3", 0, "/batch/job1"));
        assert_eq!(
            (s.rule.as_deref(), s.priority, managed),
            (Some("batch"), Some(12), true)
        );
        let (s, managed) = c.settings_for(&facts("bash", 0, "/"));
        assert_eq!((s.rule, s.priority, managed), (None, Some(9), false));
    }

    #[test]
    fn an_overload_section_turns_the_rule_on_with_the_article_thresholds_by_default() {
        assert_eq!(Config::parse("").unwrap().overload_rule(), None);
        let c = Config::parse("[overload]\nmin_waiting = 3\n").unwrap();
        assert_eq!(
            c.overload_rule(),
            Some(keling_sched::OverloadRule {
                min_session_ms: 200,
                mem_peak_pct: 95,
                min_waiting: 3,
            })
        );
        let (line, what) = Config::parse("\n[overload]\nmem_peak_pct = 150\n").unwrap_err();
        assert_eq!(line, 2, "{what}");
        assert!(what.contains("1-100"), "{what}");
        let (_, what) = Config::parse("[overload]\nsession = 1\n").unwrap_err();
        assert!(what.contains("session"), "{what}");
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let bad_priority =
            "[defaults]\npriority = 3\n\n[[rule]]\nname = \"x\"\ncomm = \"a\"\npriority = 20\n";
        let (line, what) = Config::parse(bad_priority).unwrap_err();
        assert_eq!(line, 7);
        assert!(what.contains("out of range"), "{what}");

        let unknown = "[defaults]\npriority = 3\nspeed = 9\n";
        let (line, what) = Config::parse(unknown).unwrap_err();
        assert_eq!(line, 3);
        assert!(what.contains("speed"), "{what}");

        let no_matcher = "\n[[rule]]\nname = \"empty\"\npriority = 2\n";
        let (line, what) = Config::parse(no_matcher).unwrap_err();
        assert_eq!(line, 2);
        assert!(what.contains("matches nothing"), "{what}");

        let grace = "[[rule]]\nname = \"g\"\ncomm = \"a\"\nmax_duration_ms = 10\ngrace_ms = 10\n";
        assert!(Config::parse(grace).unwrap_err().1.contains("grace_ms"));

        let syntax = "[defaults\n";
        assert_eq!(Config::parse(syntax).unwrap_err().0, 1);
    }

    #[test]
    fn access_resolves_names_and_checks_grants() {
        let c = Config::parse(
            "[access]\ngroup = \"root\"\nmin_priority = 4\nmem_quota_bytes = 100\n\n\
             [[grant]]\nuser = \"root\"\nmin_priority = 0\n\n[[grant]]\nuid = 4242\nmem_quota_bytes = 7\n",
        )
        .unwrap();
        let a = &c.access_policy;
        assert_eq!(a.group, Some(("root".to_owned(), 0)));
        assert_eq!(
            a.limits,
            Limits {
                min_priority: 4,
                mem_quota_bytes: Some(100)
            }
        );
        assert_eq!(
            a.grants,
            vec![
                (
                    Who::Uid(0),
                    Limits {
                        min_priority: 0,
                        mem_quota_bytes: Some(100)
                    }
                ),
                (
                    Who::Uid(4242),
                    Limits {
                        min_priority: 4,
                        mem_quota_bytes: Some(7)
                    }
                )
            ]
        );
        let (line, what) = Config::parse(
            "[access]\nmin_priority = 2\n\n[[grant]]\ngroup = \"no-such-group-kl\"\n",
        )
        .unwrap_err();
        assert_eq!(line, 4);
        assert!(what.contains("no-such-group-kl"), "{what}");
        let (line, what) = Config::parse("[[grant]]\nuid = 1\ngroup = \"root\"\n").unwrap_err();
        assert_eq!(line, 1);
        assert!(what.contains("exactly one"), "{what}");
        let (line, _) = Config::parse("\n[access]\ngroup = \"no-such-group-kl\"\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(
            Config::parse("[access]\nmin_priority = 16\n")
                .unwrap_err()
                .1
                .contains("out of range")
        );
        // Defaults: real-time is root's.
        let d = Config::parse("").unwrap();
        assert_eq!(d.access_policy.limits.min_priority, 3);
    }

    #[test]
    fn load_prefixes_the_file_name() {
        let dir = std::env::temp_dir().join(format!("keling-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keling.toml");
        std::fs::write(&path, "[defaults]\npriority = 99\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}:2: priority 99", path.display())),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
