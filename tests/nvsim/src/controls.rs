//! TEMPORARY stub (the lead's): replaced by the real module.
use crate::driver::{Config, UserMem};
pub const NV_ERR_INVALID_PARAM_STRUCT: u32 = 0x3c;
pub enum Target {
    Client,
    Device { gpu: u32 },
    Subdevice { gpu: u32 },
    Other { class: u32, gpu: Option<u32> },
}
pub trait View {
    fn config(&self) -> &Config;
    fn pids_with_class(&self, gpu: u32, class: u32) -> Vec<u32>;
    fn video_bytes_of(&self, pid: u32, gpu: u32) -> u64;
    fn free_bytes(&self, gpu: u32) -> u64;
}
pub fn params_size(_cmd: u32) -> Option<usize> {
    None
}
pub fn answer(
    _v: &dyn View,
    _t: Target,
    _cmd: u32,
    _p: &mut [u8],
    _m: &dyn UserMem,
) -> Result<u32, i32> {
    Ok(0x56)
}
