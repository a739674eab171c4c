//! The core's configuration: the GPUs it places on ([`GpuInfo`]) and the policy's
//! numbers ([`SchedConfig`]). The agent owns everything about *when* inputs come
//! (its tick period, its timeouts): none of it is configured here.

use serde::{Deserialize, Serialize};

/// A GPU automatic placement may choose, and how much memory it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The GPU's index (as in `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// Its memory; 0 counts as full.
    pub capacity_bytes: u64,
}

/// How long a running task may show no activity before it stops wanting the GPU.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300;
/// Session duration limit of tasks nobody gives one: 1 hour.
pub const DEFAULT_MAX_DURATION_MS: u64 = 3_600_000;
/// Warning window before the duration limit: 30 s.
pub const DEFAULT_GRACE_MS: u64 = 30_000;
/// Terminate with grace: SIGKILL this long after SIGTERM.
pub const DEFAULT_KILL_GRACE_MS: u64 = 5_000;

/// When a task that the core places (its spec names no GPU) is bound to a GPU:
/// "Binding" in the crate doc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    /// At arrival, by the placement weight (ties: the lowest index); the task is
    /// running as it is and is frozen there if it must wait. The protocol the
    /// agent's daemon speaks today, and the default.
    #[default]
    AtArrival,
    /// When it can run: it waits unbound, held before exec, in one host-level
    /// queue, and is bound (`Place`) to a GPU at the moment it can run there.
    Late,
}

impl Binding {
    /// `at-arrival`, `late`: the names `keling replay --binding` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            Binding::AtArrival => "at-arrival",
            Binding::Late => "late",
        }
    }
}

/// How the tasks placed on one GPU share it: "Sharing" in the crate doc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// At most `slots_per_gpu` tasks run at once on a GPU, whatever memory they
    /// hold (the first design article's time-slice model). The default of the
    /// core, so that configurations and input logs written before memory
    /// sharing existed replay exactly as recorded.
    #[default]
    Slots,
    /// Every task placed on a GPU whose memory fits runs at once (its budget,
    /// else what it holds and has peaked at, against the GPU's capacity less
    /// the memory held outside any task); `slots_per_gpu` is an optional cap
    /// on how many, 0 meaning none. The agent's default.
    Memory,
}

impl Sharing {
    /// `slots`, `memory`: the names the agent's `--sharing` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            Sharing::Slots => "slots",
            Sharing::Memory => "memory",
        }
    }
}

/// The first design article's overload rule (its section 4.3): a running
/// session is truncated when, at once, it has run for more than
/// `min_session_ms` since it arrived (queued time included), its GPU's memory
/// peak during the session is at least `mem_peak_pct` percent of the GPU's
/// capacity, and at least `min_waiting` tasks wait for that GPU. Off unless
/// [`SchedConfig::overload`] is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OverloadRule {
    /// The session must have run strictly longer than this. Article: 200 ms.
    pub min_session_ms: u64,
    /// The GPU's memory peak must be at least this percentage of its capacity.
    /// Article: 95.
    pub mem_peak_pct: u32,
    /// At least this many tasks must wait for the GPU. Article: 8.
    pub min_waiting: u32,
}

/// The article's session threshold: 200 ms.
pub const DEFAULT_OVERLOAD_SESSION_MS: u64 = 200;
/// The article's memory threshold: 95 % of capacity.
pub const DEFAULT_OVERLOAD_MEM_PEAK_PCT: u32 = 95;
/// The article's queue threshold: 8 waiting tasks.
pub const DEFAULT_OVERLOAD_MIN_WAITING: u32 = 8;

impl Default for OverloadRule {
    /// The article's thresholds.
    fn default() -> Self {
        OverloadRule {
            min_session_ms: DEFAULT_OVERLOAD_SESSION_MS,
            mem_peak_pct: DEFAULT_OVERLOAD_MEM_PEAK_PCT,
            min_waiting: DEFAULT_OVERLOAD_MIN_WAITING,
        }
    }
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The policy's numbers. [`Default`] gives the `DEFAULT_*` constants above, which
/// are also the agent's flag defaults (its `defaults` module names these), so a
/// configuration that leaves a field out means the same to the agent and to replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedConfig {
    /// The GPUs automatic placement chooses from. Default: none (tasks go to GPU 0).
    pub gpus: Vec<GpuInfo>,
    /// Tasks that may run at once on one GPU (0 is treated as 1). Default: 1.
    pub slots_per_gpu: u32,
    /// A running task without `Active` for this long stops wanting the GPU.
    /// Default: [`DEFAULT_IDLE_TIMEOUT_MS`].
    pub idle_timeout_ms: u64,
    /// Session duration limit of tasks whose spec sets none. Default: 1 hour.
    pub default_max_duration_ms: u64,
    /// Warning window before the limit, for specs that set none. Default: 30 s.
    pub default_grace_ms: u64,
    /// Kill at the limit (true) or terminate with grace, for specs that set
    /// neither. Default: true.
    pub default_hard_kill: bool,
    /// Terminate with grace: SIGTERM, then SIGKILL after this. Default: 5 s.
    pub kill_grace_ms: u64,
    /// When unpinned tasks are bound to a GPU. Default: [`Binding::AtArrival`].
    /// Left out of the serialized form when it is the default, so configs (and
    /// input-log headers) written before late binding existed read and write
    /// the same.
    #[serde(skip_serializing_if = "is_default")]
    pub binding: Binding,
    /// Late binding: the seed of the last tie-break between equally good free
    /// GPUs (equal weight, equal busy time). The core has no randomness but
    /// this: the choice is a hash of the seed, the task and the GPU. Default 0;
    /// left out of the serialized form when 0.
    #[serde(skip_serializing_if = "is_default")]
    pub placement_seed: u64,
    /// How the tasks on one GPU share it. Default: [`Sharing::Slots`] (what
    /// the core did before memory sharing); left out of the serialized form
    /// when it is the default.
    #[serde(skip_serializing_if = "is_default")]
    pub sharing: Sharing,
    /// The overload rule, when on. Default: off; left out of the serialized
    /// form when off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadRule>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            gpus: Vec::new(),
            slots_per_gpu: 1,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            default_max_duration_ms: DEFAULT_MAX_DURATION_MS,
            default_grace_ms: DEFAULT_GRACE_MS,
            default_hard_kill: true,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            binding: Binding::AtArrival,
            placement_seed: 0,
            sharing: Sharing::Slots,
            overload: None,
        }
    }
}

impl SchedConfig {
    /// `slots_per_gpu`, with 0 treated as 1.
    pub fn slots(&self) -> usize {
        usize::try_from(self.slots_per_gpu.max(1)).unwrap_or(usize::MAX)
    }

    /// How many tasks may run at once on one GPU: [`SchedConfig::slots`] when
    /// sharing by slots; under [`Sharing::Memory`], `slots_per_gpu` as a cap,
    /// none (`usize::MAX`) when it is 0.
    pub fn cap(&self) -> usize {
        match (self.sharing, self.slots_per_gpu) {
            (Sharing::Memory, 0) => usize::MAX,
            _ => self.slots(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_slots_count_as_one() {
        let slots = |slots_per_gpu| {
            SchedConfig {
                slots_per_gpu,
                ..SchedConfig::default()
            }
            .slots()
        };
        assert_eq!((slots(0), slots(1), slots(4)), (1, 1, 4));
    }

    #[test]
    fn memory_sharing_and_the_overload_rule_are_written_only_when_set() {
        let shared = SchedConfig {
            sharing: Sharing::Memory,
            slots_per_gpu: 0,
            overload: Some(OverloadRule::default()),
            ..SchedConfig::default()
        };
        let json = serde_json::to_string(&shared).unwrap();
        assert!(
            json.ends_with(r#""sharing":"memory","overload":{"min_session_ms":200,"mem_peak_pct":95,"min_waiting":8}}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<SchedConfig>(&json).unwrap(), shared);
        assert_eq!(shared.cap(), usize::MAX);
        let capped = SchedConfig {
            slots_per_gpu: 3,
            ..shared
        };
        assert_eq!(capped.cap(), 3);
        assert_eq!(SchedConfig::default().cap(), 1);
        assert_eq!(
            SchedConfig {
                slots_per_gpu: 0,
                ..SchedConfig::default()
            }
            .cap(),
            1,
            "0 slots count as 1 when sharing by slots"
        );
    }

    #[test]
    fn late_binding_and_its_seed_are_written_only_when_set() {
        let late = SchedConfig {
            binding: Binding::Late,
            placement_seed: 9,
            ..SchedConfig::default()
        };
        let json = serde_json::to_string(&late).unwrap();
        assert!(
            json.ends_with(r#""kill_grace_ms":5000,"binding":"late","placement_seed":9}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<SchedConfig>(&json).unwrap(), late);
        assert_eq!(Binding::Late.as_str(), "late");
        assert_eq!(Binding::default(), Binding::AtArrival);
    }

    #[test]
    fn serialized_config_is_as_before_less_tick_ms() {
        let json = r#"{"gpus":[],"slots_per_gpu":1,"idle_timeout_ms":300,"default_max_duration_ms":3600000,"default_grace_ms":30000,"default_hard_kill":true,"kill_grace_ms":5000}"#;
        assert_eq!(
            serde_json::to_string(&SchedConfig::default()).unwrap(),
            json
        );
        // What the core wrote when it still had `tick_ms` still reads.
        let old = r#"{"gpus":[{"index":0,"capacity_bytes":5}],"slots_per_gpu":2,"idle_timeout_ms":500,"default_max_duration_ms":3600000,"default_grace_ms":30000,"default_hard_kill":true,"kill_grace_ms":5000,"tick_ms":10}"#;
        assert_eq!(
            serde_json::from_str::<SchedConfig>(old).unwrap(),
            SchedConfig {
                gpus: vec![GpuInfo {
                    index: 0,
                    capacity_bytes: 5
                }],
                slots_per_gpu: 2,
                idle_timeout_ms: 500,
                ..SchedConfig::default()
            }
        );
        assert_eq!(
            serde_json::from_str::<SchedConfig>(r#"{"slots_per_gpu":3}"#).unwrap(),
            SchedConfig {
                slots_per_gpu: 3,
                ..SchedConfig::default()
            },
            "missing fields take the defaults"
        );
        assert_eq!(
            serde_json::to_string(&GpuInfo {
                index: 0,
                capacity_bytes: 5
            })
            .unwrap(),
            r#"{"index":0,"capacity_bytes":5}"#
        );
    }
}
