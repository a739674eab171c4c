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
        }
    }
}

impl SchedConfig {
    /// `slots_per_gpu`, with 0 treated as 1.
    pub fn slots(&self) -> usize {
        usize::try_from(self.slots_per_gpu.max(1)).unwrap_or(usize::MAX)
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
