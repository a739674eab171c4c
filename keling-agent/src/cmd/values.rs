//! Command-line values more than one subcommand takes, as clap value parsers
//! with typed errors (clap prints them after the flag's name).
use keling_sched::{GpuInfo, Sharing};

/// `--sharing` (`run`, `replay`): how the tasks on one GPU share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SharingArg {
    /// Every task whose memory fits runs at once (`--slots` an optional cap).
    Memory,
    /// At most `--slots` tasks run at once, whatever memory they hold.
    Slots,
}

impl From<SharingArg> for Sharing {
    fn from(s: SharingArg) -> Sharing {
        match s {
            SharingArg::Memory => Sharing::Memory,
            SharingArg::Slots => Sharing::Slots,
        }
    }
}

impl From<Sharing> for SharingArg {
    fn from(s: Sharing) -> SharingArg {
        match s {
            Sharing::Memory => SharingArg::Memory,
            Sharing::Slots => SharingArg::Slots,
        }
    }
}

/// Why a `--gpu-capacity` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapacityError {
    #[error("{0:?}: expected INDEX=BYTES, e.g. 0=85899345920 or 0=80GiB")]
    Shape(String),
    #[error("GPU index {0:?}: not a number from 0 to 4294967295")]
    Index(String),
    #[error("capacity {0:?}: expected bytes, or a number with KiB, MiB, GiB or TiB")]
    Bytes(String),
    #[error("capacity {0:?}: more than 2^64 bytes")]
    TooLarge(String),
}

/// `--gpu-capacity INDEX=BYTES` (`run`, `replay`, `report`): BYTES plain, or
/// with a binary unit (`80GiB`; `K`, `M`, `G`, `T` alone mean the same).
pub fn gpu_capacity(s: &str) -> Result<GpuInfo, CapacityError> {
    let (index, bytes) = s
        .split_once('=')
        .ok_or_else(|| CapacityError::Shape(s.to_owned()))?;
    let index = index.trim();
    Ok(GpuInfo {
        index: index
            .parse()
            .map_err(|_| CapacityError::Index(index.to_owned()))?,
        capacity_bytes: bytes_with_unit(bytes.trim())?,
    })
}

fn bytes_with_unit(s: &str) -> Result<u64, CapacityError> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return Err(CapacityError::Bytes(s.to_owned())),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| CapacityError::Bytes(s.to_owned()))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| CapacityError::TooLarge(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_parse_plain_and_with_units() {
        let g = |s| gpu_capacity(s).map(|g| (g.index, g.capacity_bytes));
        assert_eq!(g("0=85899345920"), Ok((0, 85_899_345_920)));
        assert_eq!(g(" 3 = 80GiB"), Ok((3, 80 << 30)));
        assert_eq!(g("1=512M"), Ok((1, 512 << 20)));
        assert_eq!(g("2=1TiB"), Ok((2, 1 << 40)));
        assert_eq!(g("0=7 KiB"), Ok((0, 7 << 10)));
    }

    #[test]
    fn bad_capacities_say_what_is_wrong() {
        assert_eq!(
            gpu_capacity("80GiB"),
            Err(CapacityError::Shape("80GiB".into()))
        );
        assert_eq!(gpu_capacity("x=1"), Err(CapacityError::Index("x".into())));
        assert_eq!(
            gpu_capacity("0=80GB"),
            Err(CapacityError::Bytes("80GB".into()))
        );
        assert_eq!(gpu_capacity("0=-1"), Err(CapacityError::Bytes("-1".into())));
        assert_eq!(
            gpu_capacity("0=99999999TiB"),
            Err(CapacityError::TooLarge("99999999TiB".into()))
        );
    }
}
