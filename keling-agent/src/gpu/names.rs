//! Human names for NVIDIA ABI numbers, for the trace outputs.
use keling_common::{
    device_file, nvidia::ObjectKind, nvidia::escape, nvidia::uvm, teardown, undecoded,
};

pub fn device(d: u32) -> String {
    match d {
        device_file::CTL => "nvidiactl".into(),
        device_file::UVM => "nvidia-uvm".into(),
        n if n < device_file::CTL => format!("nvidia{n}"),
        _ => "?".into(),
    }
}

pub fn kind(k: u32) -> &'static str {
    match ObjectKind::from_u32(k) {
        ObjectKind::Other => "other",
        ObjectKind::Client => "client",
        ObjectKind::Device => "device",
        ObjectKind::Subdevice => "subdevice",
        ObjectKind::VaSpace => "vaspace",
        ObjectKind::ChannelGroup => "channel_group",
        ObjectKind::ContextShare => "context_share",
        ObjectKind::Channel => "channel",
        ObjectKind::Compute => "compute",
        ObjectKind::Copy => "copy",
        ObjectKind::VideoMemory => "video_memory",
        ObjectKind::HostMemory => "host_memory",
        ObjectKind::VirtualMemory => "virtual_memory",
    }
}

/// Name of an RM escape (nvidiactl / nvidiaN) or a UVM command (nvidia-uvm).
pub fn call(device: u32, esc: u32) -> String {
    if device == device_file::UVM {
        let name = match esc {
            uvm::INITIALIZE => "UVM_INITIALIZE",
            uvm::DEINITIALIZE => "UVM_DEINITIALIZE",
            uvm::CREATE_RANGE_GROUP => "UVM_CREATE_RANGE_GROUP",
            uvm::REGISTER_GPU_VASPACE => "UVM_REGISTER_GPU_VASPACE",
            uvm::REGISTER_CHANNEL => "UVM_REGISTER_CHANNEL",
            uvm::MAP_EXTERNAL_ALLOCATION => "UVM_MAP_EXTERNAL_ALLOCATION",
            uvm::FREE => "UVM_FREE",
            uvm::REGISTER_GPU => "UVM_REGISTER_GPU",
            uvm::PAGEABLE_MEM_ACCESS => "UVM_PAGEABLE_MEM_ACCESS",
            uvm::MIGRATE => "UVM_MIGRATE",
            uvm::UNMAP_EXTERNAL => "UVM_UNMAP_EXTERNAL",
            uvm::ALLOC_SEMAPHORE_POOL => "UVM_ALLOC_SEMAPHORE_POOL",
            uvm::CREATE_EXTERNAL_RANGE => "UVM_CREATE_EXTERNAL_RANGE",
            uvm::MM_INITIALIZE => "UVM_MM_INITIALIZE",
            other => return format!("UVM_{other:#x}"),
        };
        return name.into();
    }
    let name = match esc {
        escape::ALLOC_MEMORY => "RM_ALLOC_MEMORY",
        escape::FREE => "RM_FREE",
        escape::CONTROL => "RM_CONTROL",
        escape::ALLOC => "RM_ALLOC",
        escape::DUP_OBJECT => "RM_DUP_OBJECT",
        escape::SHARE => "RM_SHARE",
        escape::VID_HEAP_CONTROL => "RM_VID_HEAP_CONTROL",
        escape::MAP_MEMORY => "RM_MAP_MEMORY",
        escape::UNMAP_MEMORY => "RM_UNMAP_MEMORY",
        escape::ALLOC_CONTEXT_DMA2 => "RM_ALLOC_CONTEXT_DMA2",
        escape::MAP_MEMORY_DMA => "RM_MAP_MEMORY_DMA",
        escape::UNMAP_MEMORY_DMA => "RM_UNMAP_MEMORY_DMA",
        escape::CARD_INFO => "CARD_INFO",
        escape::REGISTER_FD => "REGISTER_FD",
        escape::CHECK_VERSION_STR => "CHECK_VERSION_STR",
        escape::XFER_CMD => "XFER_CMD",
        escape::ATTACH_GPUS_TO_FD => "ATTACH_GPUS_TO_FD",
        other => return format!("RM_{other:#x}"),
    };
    name.into()
}

pub fn undecoded_reason(r: u32) -> &'static str {
    undecoded::NAMES
        .get(r as usize)
        .copied()
        .unwrap_or("unknown")
}

pub fn teardown_reason(r: u32) -> &'static str {
    match r {
        teardown::CLIENT_FREED => "client_freed",
        teardown::FILE_RELEASED => "file_released",
        teardown::DEVICE_FREED => "device_freed",
        _ => "unknown",
    }
}

pub fn gpu(g: u32) -> Option<u32> {
    (g < keling_common::NO_GPU).then_some(g)
}
