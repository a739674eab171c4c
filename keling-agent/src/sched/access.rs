//! Who may do what through the control socket: root, and the members of one group
//! (`[access] group`, default `keling`), may connect; anyone who may connect may
//! read status; a launch runs as its caller, with the priorities and memory the
//! config grants them (`[access]`, `[[grant]]`); acting on a task that is not one's
//! own needs root.
use crate::{defaults, os::users::Credentials};

/// What a user may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The highest priority (lowest number) they may use.
    pub min_priority: u8,
    /// Each task of theirs holds at most this much GPU memory.
    pub mem_quota_bytes: Option<u64>,
}

/// Whom a grant is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Uid(u32),
    /// Members of the group (primary or supplementary).
    Gid(u32),
}

/// The config's access rules, with names resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Besides root, members of this group (name, gid) may connect; `None`: only root.
    pub group: Option<(String, u32)>,
    /// For users no grant names.
    pub limits: Limits,
    /// In order; the first that matches wins.
    pub grants: Vec<(Who, Limits)>,
}

impl Default for AccessPolicy {
    /// Root only, real-time for root only (what an agent without a config and
    /// without a `keling` group gets).
    fn default() -> Self {
        Self {
            group: None,
            limits: Limits {
                min_priority: defaults::USER_MIN_PRIORITY,
                mem_quota_bytes: None,
            },
            grants: Vec::new(),
        }
    }
}

const ROOT_LIMITS: Limits = Limits {
    min_priority: 0,
    mem_quota_bytes: None,
};

impl AccessPolicy {
    /// Whether a peer with these credentials may use the control socket.
    pub fn may_connect(&self, c: &Credentials) -> bool {
        c.uid == 0 || self.group.as_ref().is_some_and(|(_, gid)| c.in_group(*gid))
    }

    /// What a caller may ask for.
    pub fn limits(&self, c: &Credentials) -> Limits {
        if c.uid == 0 {
            return ROOT_LIMITS;
        }
        self.grants
            .iter()
            .find(|(who, _)| match *who {
                Who::Uid(uid) => c.uid == uid,
                Who::Gid(gid) => c.in_group(gid),
            })
            .map_or(self.limits, |(_, l)| *l)
    }

    /// The priority and quota a launch gets: an explicit priority above the
    /// caller's limit is refused; one that comes from a config rule is lowered to
    /// it; the quota is the smaller of the asked and the allowed.
    pub fn launch_terms(
        &self,
        c: &Credentials,
        asked_priority: Option<u8>,
        rule_priority: Option<u8>,
        default_priority: u8,
        asked_quota: Option<u64>,
    ) -> Result<(u8, Option<u64>), String> {
        let l = self.limits(c);
        if let Some(p) = asked_priority
            && p < l.min_priority
        {
            return Err(format!(
                "priority {p} is not allowed for uid {}: the highest it may use is {} \
                 (the real-time class 0-2 needs a [[grant]] in the agent's config)",
                c.uid, l.min_priority
            ));
        }
        let priority = asked_priority
            .or(rule_priority)
            .unwrap_or(default_priority)
            .max(l.min_priority);
        let quota = match (asked_quota, l.mem_quota_bytes) {
            (Some(a), Some(m)) => Some(a.min(m)),
            (a, m) => a.or(m),
        };
        Ok((priority, quota))
    }

    /// Whether `c` may act on a task owned by `owner_uid`.
    pub fn may_act_on(&self, c: &Credentials, owner_uid: u32) -> bool {
        c.uid == 0 || c.uid == owner_uid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    fn policy() -> AccessPolicy {
        AccessPolicy {
            group: Some(("keling".into(), 500)),
            limits: Limits {
                min_priority: 3,
                mem_quota_bytes: Some(1000),
            },
            grants: vec![
                (
                    Who::Gid(600),
                    Limits {
                        min_priority: 0,
                        mem_quota_bytes: None,
                    },
                ),
                (
                    Who::Uid(1001),
                    Limits {
                        min_priority: 5,
                        mem_quota_bytes: Some(10),
                    },
                ),
            ],
        }
    }

    #[test]
    fn root_and_the_group_may_connect() {
        let p = policy();
        assert!(p.may_connect(&user(0, 0, &[])));
        assert!(p.may_connect(&user(1000, 500, &[])));
        assert!(p.may_connect(&user(1000, 100, &[7, 500])));
        assert!(!p.may_connect(&user(1000, 100, &[7])));
        assert!(!AccessPolicy::default().may_connect(&user(1000, 500, &[500])));
    }

    #[test]
    fn real_time_is_granted_not_given() {
        let p = policy();
        let plain = user(1000, 500, &[]);
        let err = p.launch_terms(&plain, Some(1), None, 8, None).unwrap_err();
        assert!(err.contains("priority 1 is not allowed"), "{err}");
        assert_eq!(
            p.launch_terms(&plain, Some(3), None, 8, None),
            Ok((3, Some(1000)))
        );
        // A rule's priority is lowered to what the user may have.
        assert_eq!(
            p.launch_terms(&plain, None, Some(0), 8, None),
            Ok((3, Some(1000)))
        );
        assert_eq!(
            p.launch_terms(&plain, None, None, 8, Some(5000)),
            Ok((8, Some(1000)))
        );
        let rt = user(1000, 500, &[600]);
        assert_eq!(
            p.launch_terms(&rt, Some(0), None, 8, Some(5)),
            Ok((0, Some(5)))
        );
        // First grant wins; uid grant applies to that uid.
        let capped = user(1001, 500, &[]);
        assert!(p.launch_terms(&capped, Some(4), None, 8, None).is_err());
        assert_eq!(
            p.launch_terms(&capped, None, None, 2, None),
            Ok((5, Some(10)))
        );
        assert_eq!(
            p.launch_terms(&user(0, 0, &[]), Some(0), None, 8, None),
            Ok((0, None))
        );
    }

    #[test]
    fn only_root_acts_on_others_tasks() {
        let p = policy();
        assert!(p.may_act_on(&user(1000, 500, &[]), 1000));
        assert!(!p.may_act_on(&user(1000, 500, &[]), 1001));
        assert!(p.may_act_on(&user(0, 0, &[]), 1001));
    }
}
