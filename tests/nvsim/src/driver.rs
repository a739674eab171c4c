//! The simulated NVIDIA driver as a pure state machine: no FUSE, no syscalls.
//!
//! [`Driver::ioctl`] takes what the FUSE layer hands it (the command, the
//! caller's `arg` pointer, the bytes the kernel copied in, how many bytes the
//! kernel will copy out) and a [`UserMem`] that reads and writes the caller's
//! memory for pointers inside the params. It returns the bytes to copy out or
//! an errno. Everything the tests compare the tracer with (bytes per process
//! and GPU, peaks, counts) is kept here and rendered by [`Driver::state`].
//!
//! Status codes and their sources are in [`crate::abi::status`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::abi::le::{put_u16, put_u32, put_u64, u32_at, u64_at};
use crate::abi::{self, class, esc, size, status::*};

/// The caller's memory, for pointers inside ioctl params.
pub trait UserMem {
    /// `len` bytes at `addr`, or `None` if any of them cannot be read.
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>>;
    /// Writes all of `data` at `addr`; false if it could not.
    fn write(&self, addr: u64, data: &[u8]) -> bool;
}

/// Which device file an open file description (FUSE fh) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// `nvidiactl`.
    Ctl,
    /// `nvidiaN`.
    Gpu(u32),
    /// `nvidia-uvm`.
    Uvm,
}

/// Static configuration of the simulated machine.
#[derive(Clone, Debug)]
pub struct Config {
    pub gpus: u32,
    pub mem_per_gpu: u64,
    pub driver_version: String,
}

/// An errno (positive) returned by the ioctl itself.
pub type Errno = i32;

/// Handles the driver picks: `0xc1d00000 + counter`, unique across clients
/// and objects.
pub const HANDLE_BASE: u32 = 0xc1d0_0000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjKind {
    Device {
        gpu: u32,
    },
    Subdevice,
    /// Memory that holds bytes (video or host).
    Memory(Mem),
    /// Virtual memory classes: a memory object without bytes.
    VirtualMemory,
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mem {
    gpu: u32,
    bytes: u64,
    host: bool,
    /// tgid of the process whose ioctl allocated it.
    pid: u32,
}

#[derive(Debug)]
struct Object {
    class: u32,
    /// The parent handle; the client's handle for top-level objects.
    parent: u32,
    children: BTreeSet<u32>,
    kind: ObjKind,
}

#[derive(Debug)]
struct Client {
    fh: u64,
    creator_pid: u32,
    /// Top-level objects (parent == client).
    children: BTreeSet<u32>,
    objects: HashMap<u32, Object>,
}

#[derive(Default, Debug, Clone, Copy)]
struct GpuUse {
    used: u64,
    host: u64,
}

/// Per (pid, GPU) ground truth.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcGpu {
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

#[derive(Default, Debug)]
struct UvmFile {
    initialized: bool,
    /// base -> (length, mapped)
    ranges: BTreeMap<u64, (u64, bool)>,
}

/// The simulated driver.
#[derive(Debug)]
pub struct Driver {
    cfg: Config,
    major: u32,
    clients: BTreeMap<u32, Client>,
    next_handle: u32,
    next_range_group: u64,
    gpus: Vec<GpuUse>,
    procs: BTreeMap<u32, BTreeMap<u32, ProcGpu>>,
    uvm: HashMap<u64, UvmFile>,
    ioctl_total: u64,
    ioctl_failed: u64,
}

/// `nvsim-state.json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub driver_version: String,
    pub gpus: Vec<GpuState>,
    pub processes: Vec<ProcessState>,
    pub clients: Vec<ClientState>,
    pub ioctls: IoctlCounts,
    /// Extra (not in the brief's schema): UVM external ranges currently known.
    pub uvm_ranges: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub host_bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    pub pid: u32,
    pub gpus: Vec<ProcGpuState>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProcGpuState {
    pub gpu: u32,
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClientState {
    pub handle: u32,
    pub fh: u64,
    pub creator_pid: u32,
    pub objects: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IoctlCounts {
    pub total: u64,
    pub failed: u64,
}

/// What an allocation is about to create, computed before anything is
/// committed so that a fault on write-back leaves the state untouched.
struct NewObject {
    class: u32,
    kind: ObjKind,
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

fn is_client_class(c: u32) -> bool {
    matches!(
        c,
        class::NV01_ROOT | class::NV01_ROOT_NON_PRIV | class::NV01_ROOT_CLIENT
    )
}

/// Result of one escape: the RM status it wrote (None: it has no status field).
type EscResult = Result<Option<u32>, Errno>;

impl Driver {
    pub fn new(cfg: Config) -> Self {
        let major = abi::version_major(&cfg.driver_version).unwrap_or(u32::MAX);
        let gpus = vec![GpuUse::default(); cfg.gpus as usize];
        Driver {
            cfg,
            major,
            clients: BTreeMap::new(),
            next_handle: 0,
            next_range_group: 1,
            gpus,
            procs: BTreeMap::new(),
            uvm: HashMap::new(),
            ioctl_total: 0,
            ioctl_failed: 0,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// True for drivers before 535 (legacy NVOS21 / 40-byte NVOS64).
    pub fn legacy_layouts(&self) -> bool {
        self.major < abi::PARAMS_SIZE_SINCE
    }

    /// One ioctl on an open file.
    ///
    /// `in_data` is what the kernel copied in (`_IOC_SIZE` bytes when the
    /// command has the write direction bit, else empty); `out_size` is how many
    /// bytes it will copy back. For RM escapes whose direction bits do not make
    /// the kernel copy the params, they are read from / written to `arg` through
    /// `mem`, as the real driver ignores the direction bits.
    #[allow(clippy::too_many_arguments)]
    pub fn ioctl(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &dyn UserMem,
    ) -> Result<Vec<u8>, Errno> {
        self.ioctl_total += 1;
        let r = match file {
            FileKind::Uvm => self.uvm_ioctl(fh, cmd, arg, mem).map(|st| (st, Vec::new())),
            FileKind::Ctl | FileKind::Gpu(_) => {
                self.rm_ioctl(fh, file, pid, cmd, arg, in_data, out_size, mem)
            }
        };
        match r {
            Ok((st, out)) => {
                if st.is_some_and(|s| s != NV_OK) {
                    self.ioctl_failed += 1;
                }
                Ok(out)
            }
            Err(e) => {
                self.ioctl_failed += 1;
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rm_ioctl(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &dyn UserMem,
    ) -> Result<(Option<u32>, Vec<u8>), Errno> {
        let size = abi::ioc_size(cmd);
        let nr = abi::ioc_nr(cmd);
        let mut params = if in_data.len() == size {
            in_data.to_vec()
        } else {
            mem.read(arg, size).ok_or(libc::EFAULT)?
        };
        let st = self.escape(fh, file, pid, nr, &mut params, mem, false)?;
        if out_size == size {
            Ok((st, params))
        } else {
            if size > 0 && !mem.write(arg, &params) {
                return Err(libc::EFAULT);
            }
            Ok((st, Vec::new()))
        }
    }

    /// Dispatches one RM escape on its params (`p.len()` is the size from the
    /// command, or the XFER size).
    #[allow(clippy::too_many_arguments)]
    fn escape(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        nr: u8,
        p: &mut [u8],
        mem: &dyn UserMem,
        in_xfer: bool,
    ) -> EscResult {
        let ctl = file == FileKind::Ctl;
        let need = |ok: bool| if ok { Ok(()) } else { Err(libc::EINVAL) };
        match nr {
            esc::IOCTL_XFER_CMD => {
                need(!in_xfer && p.len() == size::XFER)?;
                let inner_cmd = u32_at(p, abi::xfer::CMD);
                let inner_size = u32_at(p, abi::xfer::SIZE) as usize;
                let ptr = u64_at(p, abi::xfer::PTR);
                need(inner_size <= abi::xfer::MAX_SIZE)?;
                let mut inner = mem.read(ptr, inner_size).ok_or(libc::EFAULT)?;
                need(inner_cmd <= 0xff && inner_cmd as u8 != esc::IOCTL_XFER_CMD)?;
                let st = self.escape(fh, file, pid, inner_cmd as u8, &mut inner, mem, true)?;
                if !mem.write(ptr, &inner) {
                    return Err(libc::EFAULT);
                }
                Ok(st)
            }
            esc::CARD_INFO => {
                need(ctl)?;
                self.card_info(p);
                Ok(None)
            }
            esc::CHECK_VERSION_STR => {
                need(p.len() == size::RM_API_VERSION)?;
                put_u32(
                    p,
                    abi::rm_api_version::REPLY,
                    abi::rm_api_version::REPLY_RECOGNIZED,
                );
                Ok(None)
            }
            esc::REGISTER_FD => {
                need(!ctl && p.len() == 4)?;
                Ok(None)
            }
            esc::ATTACH_GPUS_TO_FD => {
                need(ctl)?;
                Ok(None)
            }
            esc::ALLOC_OS_EVENT
            | esc::FREE_OS_EVENT
            | esc::STATUS_CODE
            | esc::QUERY_DEVICE_INTR
            | esc::SYS_PARAMS
            | esc::NUMA_INFO
            | esc::SET_NUMA_STATUS
            | esc::EXPORT_TO_DMABUF_FD
            | esc::WAIT_OPEN_COMPLETE => Ok(None),
            esc::RM_ALLOC_MEMORY => {
                let FileKind::Gpu(gpu) = file else {
                    return Err(libc::EINVAL);
                };
                need(p.len() == size::NVOS02_WITH_FD)?;
                Ok(Some(self.rm_alloc_memory(gpu, pid, p)))
            }
            esc::RM_FREE => {
                need(ctl && p.len() == size::NVOS00)?;
                let st = self.rm_free(fh, p);
                put_u32(p, abi::nvos00::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_ALLOC => {
                need(ctl)?;
                self.rm_alloc(fh, pid, p, mem)
            }
            esc::RM_CONTROL => {
                need(ctl && p.len() == size::NVOS54)?;
                let st = self.rm_control(fh, p);
                put_u32(p, abi::nvos54::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_VID_HEAP_CONTROL => {
                need(ctl && p.len() == size::NVOS32)?;
                let st = self.vid_heap(fh, pid, p);
                put_u32(p, abi::nvos32::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_MAP_MEMORY => {
                need(ctl && p.len() == size::NVOS33_WITH_FD)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos33::H_CLIENT),
                    u32_at(p, abi::nvos33::H_MEMORY),
                );
                put_u32(p, abi::nvos33::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_UNMAP_MEMORY => {
                need(ctl && p.len() == size::NVOS34)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos34::H_CLIENT),
                    u32_at(p, abi::nvos34::H_MEMORY),
                );
                put_u32(p, abi::nvos34::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_MAP_MEMORY_DMA => {
                need(ctl && p.len() == size::NVOS46)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos46::H_CLIENT),
                    u32_at(p, abi::nvos46::H_MEMORY),
                );
                put_u32(p, abi::nvos46::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_UNMAP_MEMORY_DMA => {
                need(ctl && p.len() == size::NVOS47)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos47::H_CLIENT),
                    u32_at(p, abi::nvos47::H_MEMORY),
                );
                put_u32(p, abi::nvos47::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_ALLOC_CONTEXT_DMA2 => {
                need(ctl && p.len() == size::NVOS39)?;
                put_u32(p, abi::nvos39::STATUS, NV_OK);
                Ok(Some(NV_OK))
            }
            esc::RM_DUP_OBJECT => {
                need(ctl && p.len() == size::NVOS55)?;
                put_u32(p, abi::nvos55::STATUS, NV_ERR_NOT_SUPPORTED);
                Ok(Some(NV_ERR_NOT_SUPPORTED))
            }
            esc::RM_SHARE => {
                need(ctl && p.len() == size::NVOS57)?;
                put_u32(p, abi::nvos57::STATUS, NV_ERR_NOT_SUPPORTED);
                Ok(Some(NV_ERR_NOT_SUPPORTED))
            }
            _ => Err(libc::EINVAL),
        }
    }

    fn card_info(&self, p: &mut [u8]) {
        use abi::card_info as ci;
        p.fill(0);
        let n = p.len() / size::CARD_INFO_ENTRY;
        for i in 0..n.min(self.cfg.gpus as usize) {
            let e = &mut p[i * size::CARD_INFO_ENTRY..(i + 1) * size::CARD_INFO_ENTRY];
            put_u32(e, ci::VALID, 1);
            e[ci::PCI_BUS] = 0x18 + i as u8;
            put_u16(e, ci::PCI_VENDOR_ID, 0x10de);
            put_u16(e, ci::PCI_DEVICE_ID, 0x2335);
            put_u32(e, ci::GPU_ID, (0x18 + i as u32) << 8);
            put_u64(e, ci::FB_SIZE, self.cfg.mem_per_gpu);
            put_u32(e, ci::MINOR_NUMBER, i as u32);
        }
    }

    // ----- handles and tree helpers -------------------------------------

    fn pick_handle(&mut self, client: Option<u32>) -> u32 {
        loop {
            let h = HANDLE_BASE.wrapping_add(self.next_handle);
            self.next_handle = self.next_handle.wrapping_add(1);
            if h == 0 || self.clients.contains_key(&h) {
                continue;
            }
            if let Some(c) = client.and_then(|c| self.clients.get(&c))
                && c.objects.contains_key(&h)
            {
                continue;
            }
            return h;
        }
    }

    /// The client `h` if it exists and was created through `fh`.
    fn owned_client(&self, fh: u64, h: u32) -> Result<&Client, u32> {
        match self.clients.get(&h) {
            Some(c) if c.fh == fh => Ok(c),
            _ => Err(NV_ERR_INVALID_CLIENT),
        }
    }

    /// GPU of the nearest device at or above `h` in client `c`.
    fn device_gpu(c: &Client, mut h: u32) -> Option<u32> {
        for _ in 0..64 {
            let o = c.objects.get(&h)?;
            if let ObjKind::Device { gpu } = o.kind {
                return Some(gpu);
            }
            h = o.parent;
        }
        None
    }

    fn account_alloc(&mut self, m: Mem) {
        let g = &mut self.gpus[m.gpu as usize];
        let pg = self
            .procs
            .entry(m.pid)
            .or_default()
            .entry(m.gpu)
            .or_default();
        if m.host {
            g.host += m.bytes;
            pg.host_bytes += m.bytes;
        } else {
            g.used += m.bytes;
            pg.bytes += m.bytes;
            pg.peak_bytes = pg.peak_bytes.max(pg.bytes);
        }
        pg.allocs += 1;
    }

    fn account_free(&mut self, m: Mem) {
        let g = &mut self.gpus[m.gpu as usize];
        let pg = self
            .procs
            .entry(m.pid)
            .or_default()
            .entry(m.gpu)
            .or_default();
        if m.host {
            g.host -= m.bytes;
            pg.host_bytes -= m.bytes;
        } else {
            g.used -= m.bytes;
            pg.bytes -= m.bytes;
        }
        pg.frees += 1;
    }

    fn insert_object(&mut self, client: u32, parent: u32, handle: u32, new: NewObject) {
        if let ObjKind::Memory(m) = new.kind {
            self.account_alloc(m);
        }
        let c = self.clients.get_mut(&client).expect("client checked");
        if parent == client {
            c.children.insert(handle);
        } else {
            c.objects
                .get_mut(&parent)
                .expect("parent checked")
                .children
                .insert(handle);
        }
        c.objects.insert(
            handle,
            Object {
                class: new.class,
                parent,
                children: BTreeSet::new(),
                kind: new.kind,
            },
        );
    }

    /// Frees `h` and everything under it (children first).
    fn free_subtree(&mut self, client: u32, h: u32) {
        let mut order = Vec::new();
        let mut stack = vec![h];
        {
            let c = &self.clients[&client];
            while let Some(x) = stack.pop() {
                if let Some(o) = c.objects.get(&x) {
                    order.push(x);
                    stack.extend(o.children.iter().copied());
                }
            }
        }
        let c = self.clients.get_mut(&client).expect("client exists");
        if let Some(parent) = c.objects.get(&h).map(|o| o.parent) {
            if parent == client {
                c.children.remove(&h);
            } else if let Some(po) = c.objects.get_mut(&parent) {
                po.children.remove(&h);
            }
        }
        let mut freed = Vec::new();
        for x in order.into_iter().rev() {
            if let Some(o) = c.objects.remove(&x)
                && let ObjKind::Memory(m) = o.kind
            {
                freed.push(m);
            }
        }
        for m in freed {
            self.account_free(m);
        }
    }

    fn free_client(&mut self, client: u32) {
        let tops: Vec<u32> = self.clients[&client].children.iter().copied().collect();
        for t in tops {
            self.free_subtree(client, t);
        }
        self.clients.remove(&client);
    }

    /// The last close of an open file: tears down every client created
    /// through it and forgets its UVM state.
    pub fn release(&mut self, fh: u64) {
        let mine: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| c.fh == fh)
            .map(|(h, _)| *h)
            .collect();
        for h in mine {
            self.free_client(h);
        }
        self.uvm.remove(&fh);
    }

    // ----- RM_ALLOC --------------------------------------------------------

    fn rm_alloc(&mut self, fh: u64, pid: u32, p: &mut [u8], mem: &dyn UserMem) -> EscResult {
        use abi::{nvos21, nvos64};
        let legacy = self.legacy_layouts();
        // (status offset, paramsSize if the layout has it, FINN flag)
        let (status_off, params_size, finn) = match (p.len(), legacy) {
            (size::NVOS21, false) => (nvos21::STATUS, Some(u32_at(p, nvos21::PARAMS_SIZE)), false),
            (size::NVOS21, true) => (nvos21::LEGACY_STATUS, None, false),
            (size::NVOS64, false) => (
                nvos64::STATUS,
                Some(u32_at(p, nvos64::PARAMS_SIZE)),
                u32_at(p, nvos64::FLAGS) & nvos64::FLAGS_FINN_SERIALIZED != 0,
            ),
            (size::NVOS64_LEGACY, true) => (
                nvos64::LEGACY_STATUS,
                None,
                u32_at(p, nvos64::LEGACY_FLAGS) & nvos64::FLAGS_FINN_SERIALIZED != 0,
            ),
            _ => return Err(libc::EINVAL),
        };
        let _ = params_size; // accepted as given; see the crate docs
        let h_root = u32_at(p, nvos21::H_ROOT);
        let h_parent = u32_at(p, nvos21::H_OBJECT_PARENT);
        let h_new = u32_at(p, nvos21::H_OBJECT_NEW);
        let h_class = u32_at(p, nvos21::H_CLASS);
        let p_params = u64_at(p, nvos21::P_ALLOC_PARMS);
        let st = match self.alloc_object(
            fh, pid, h_root, h_parent, h_new, h_class, p_params, finn, mem,
        )? {
            Ok(handle) => {
                put_u32(p, nvos21::H_OBJECT_NEW, handle);
                NV_OK
            }
            Err(st) => st,
        };
        put_u32(p, status_off, st);
        Ok(Some(st))
    }

    /// Allocates one object. Outer Err: errno (EFAULT); inner Err: RM status.
    #[allow(clippy::too_many_arguments)]
    fn alloc_object(
        &mut self,
        fh: u64,
        pid: u32,
        h_root: u32,
        h_parent: u32,
        h_new: u32,
        h_class: u32,
        p_params: u64,
        finn: bool,
        mem: &dyn UserMem,
    ) -> Result<Result<u32, u32>, Errno> {
        if is_client_class(h_class) {
            let handle = if h_new == 0 {
                self.pick_handle(None)
            } else if self.clients.contains_key(&h_new) {
                return Ok(Err(NV_ERR_INSERT_DUPLICATE_NAME));
            } else {
                h_new
            };
            self.clients.insert(
                handle,
                Client {
                    fh,
                    creator_pid: pid,
                    children: BTreeSet::new(),
                    objects: HashMap::new(),
                },
            );
            return Ok(Ok(handle));
        }
        let c = match self.owned_client(fh, h_root) {
            Ok(c) => c,
            Err(st) => return Ok(Err(st)),
        };
        let known = matches!(
            h_class,
            class::NV01_DEVICE_0
                | class::NV20_SUBDEVICE_0
                | class::NV01_MEMORY_LOCAL_USER
                | class::NV01_MEMORY_LOCAL_PHYSICAL
                | class::NV01_MEMORY_SYSTEM
                | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
                | class::NV01_MEMORY_VIRTUAL
                | class::NV50_MEMORY_VIRTUAL
                | class::NV_MEMORY_FABRIC
                | class::FERMI_VASPACE_A
                | class::KEPLER_CHANNEL_GROUP_A
                | class::FERMI_CONTEXT_SHARE_A
        ) || class::CHANNELS.contains(&h_class)
            || class::COMPUTE.contains(&h_class)
            || class::COPY.contains(&h_class);
        if !known {
            return Ok(Err(NV_ERR_INVALID_CLASS));
        }
        let parent_is_client = h_parent == h_root;
        let parent_kind = if parent_is_client {
            None
        } else {
            match c.objects.get(&h_parent) {
                Some(o) => Some(o.kind),
                None => return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT)),
            }
        };
        if h_new != 0 && (h_new == h_root || c.objects.contains_key(&h_new)) {
            return Ok(Err(NV_ERR_INSERT_DUPLICATE_NAME));
        }
        let dev_gpu = if parent_is_client {
            None
        } else {
            Self::device_gpu(c, h_parent)
        };
        let new = match h_class {
            class::NV01_DEVICE_0 => {
                if !parent_is_client {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                if p_params == 0 {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                let b = mem.read(p_params, size::NV0080_ALLOC).ok_or(libc::EFAULT)?;
                let gpu = u32_at(&b, abi::nv0080::DEVICE_ID);
                if gpu >= self.cfg.gpus {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                NewObject {
                    class: h_class,
                    kind: ObjKind::Device { gpu },
                }
            }
            class::NV20_SUBDEVICE_0 => {
                if !matches!(parent_kind, Some(ObjKind::Device { .. })) {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                if p_params != 0 {
                    mem.read(p_params, size::NV2080_ALLOC).ok_or(libc::EFAULT)?;
                }
                NewObject {
                    class: h_class,
                    kind: ObjKind::Subdevice,
                }
            }
            class::NV01_MEMORY_LOCAL_USER
            | class::NV01_MEMORY_LOCAL_PHYSICAL
            | class::NV01_MEMORY_SYSTEM => {
                let Some(gpu) = dev_gpu else {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                };
                if p_params == 0 {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                if finn {
                    return Ok(Err(NV_ERR_NOT_SUPPORTED));
                }
                let b = mem
                    .read(p_params, size::MEMORY_ALLOCATION_PARAMS)
                    .ok_or(libc::EFAULT)?;
                let host = h_class == class::NV01_MEMORY_SYSTEM;
                let req = u64_at(&b, abi::mem_alloc::SIZE);
                let gran = if host {
                    abi::HOSTMEM_ROUND
                } else {
                    abi::VIDMEM_ROUND
                };
                let Some(bytes) = round_up(req, gran).filter(|&b| b > 0) else {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                };
                if !host && self.gpus[gpu as usize].used + bytes > self.cfg.mem_per_gpu {
                    return Ok(Err(NV_ERR_NO_MEMORY));
                }
                // Write the real size back before committing anything.
                if !mem.write(p_params + abi::mem_alloc::SIZE as u64, &bytes.to_le_bytes()) {
                    return Err(libc::EFAULT);
                }
                NewObject {
                    class: h_class,
                    kind: ObjKind::Memory(Mem {
                        gpu,
                        bytes,
                        host,
                        pid,
                    }),
                }
            }
            class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
                let Some(gpu) = dev_gpu else {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                };
                if p_params == 0 {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                let b = mem
                    .read(p_params, size::OS_DESCRIPTOR_PARAMS)
                    .ok_or(libc::EFAULT)?;
                let limit = u64_at(&b, abi::os_descriptor::LIMIT);
                let Some(bytes) = limit
                    .checked_add(1)
                    .and_then(|s| round_up(s, abi::HOSTMEM_ROUND))
                else {
                    return Ok(Err(NV_ERR_INVALID_LIMIT));
                };
                NewObject {
                    class: h_class,
                    kind: ObjKind::Memory(Mem {
                        gpu,
                        bytes,
                        host: true,
                        pid,
                    }),
                }
            }
            class::NV01_MEMORY_VIRTUAL | class::NV50_MEMORY_VIRTUAL | class::NV_MEMORY_FABRIC => {
                if dev_gpu.is_none() {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                NewObject {
                    class: h_class,
                    kind: ObjKind::VirtualMemory,
                }
            }
            _ => {
                if dev_gpu.is_none() {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                NewObject {
                    class: h_class,
                    kind: ObjKind::Other,
                }
            }
        };
        let handle = if h_new == 0 {
            self.pick_handle(Some(h_root))
        } else {
            h_new
        };
        self.insert_object(h_root, h_parent, handle, new);
        Ok(Ok(handle))
    }

    // ----- RM_ALLOC_MEMORY (nvidiaN) --------------------------------------

    fn rm_alloc_memory(&mut self, gpu: u32, pid: u32, p: &mut [u8]) -> u32 {
        use abi::nvos02;
        let st = (|| {
            let h_root = u32_at(p, nvos02::H_ROOT);
            let h_parent = u32_at(p, nvos02::H_OBJECT_PARENT);
            let h_new = u32_at(p, nvos02::H_OBJECT_NEW);
            let h_class = u32_at(p, nvos02::H_CLASS);
            // The real driver validates the client against the nvidiactl file
            // registered with REGISTER_FD; a FUSE server cannot resolve that
            // fd, so any existing client is accepted here.
            let Some(c) = self.clients.get(&h_root) else {
                return Err(NV_ERR_INVALID_CLIENT);
            };
            if !matches!(
                h_class,
                class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
            ) {
                return Err(NV_ERR_INVALID_CLASS);
            }
            if h_parent != h_root && !c.objects.contains_key(&h_parent) {
                return Err(NV_ERR_INVALID_OBJECT_PARENT);
            }
            if h_new != 0 && (h_new == h_root || c.objects.contains_key(&h_new)) {
                return Err(NV_ERR_INSERT_DUPLICATE_NAME);
            }
            if gpu >= self.cfg.gpus {
                return Err(NV_ERR_INVALID_ARGUMENT);
            }
            let limit = u64_at(p, nvos02::LIMIT);
            let bytes = limit
                .checked_add(1)
                .and_then(|s| round_up(s, abi::HOSTMEM_ROUND))
                .ok_or(NV_ERR_INVALID_LIMIT)?;
            let handle = if h_new == 0 {
                self.pick_handle(Some(h_root))
            } else {
                h_new
            };
            self.insert_object(
                h_root,
                h_parent,
                handle,
                NewObject {
                    class: h_class,
                    kind: ObjKind::Memory(Mem {
                        gpu,
                        bytes,
                        host: true,
                        pid,
                    }),
                },
            );
            put_u32(p, nvos02::H_OBJECT_NEW, handle);
            put_u64(p, nvos02::LIMIT, bytes - 1);
            Ok(())
        })();
        let st = st.err().unwrap_or(NV_OK);
        put_u32(p, nvos02::STATUS, st);
        st
    }

    // ----- RM_FREE, RM_CONTROL, map/unmap ----------------------------------

    fn rm_free(&mut self, fh: u64, p: &[u8]) -> u32 {
        use abi::nvos00;
        let h_root = u32_at(p, nvos00::H_ROOT);
        let h_old = u32_at(p, nvos00::H_OBJECT_OLD);
        let c = match self.owned_client(fh, h_root) {
            Ok(c) => c,
            Err(st) => return st,
        };
        if h_old == h_root {
            self.free_client(h_root);
            NV_OK
        } else if c.objects.contains_key(&h_old) {
            self.free_subtree(h_root, h_old);
            NV_OK
        } else {
            NV_ERR_OBJECT_NOT_FOUND
        }
    }

    fn rm_control(&self, fh: u64, p: &[u8]) -> u32 {
        let h_client = u32_at(p, abi::nvos54::H_CLIENT);
        let h_object = u32_at(p, abi::nvos54::H_OBJECT);
        match self.owned_client(fh, h_client) {
            Err(st) => st,
            Ok(c) if h_object == h_client || c.objects.contains_key(&h_object) => NV_OK,
            Ok(_) => NV_ERR_INVALID_OBJECT_HANDLE,
        }
    }

    fn check_memory(&self, fh: u64, h_client: u32, h_memory: u32) -> u32 {
        match self.owned_client(fh, h_client) {
            Err(st) => st,
            Ok(c) => match c.objects.get(&h_memory).map(|o| o.kind) {
                Some(ObjKind::Memory(_)) | Some(ObjKind::VirtualMemory) => NV_OK,
                _ => NV_ERR_INVALID_OBJECT_HANDLE,
            },
        }
    }

    // ----- RM_VID_HEAP_CONTROL ----------------------------------------------

    fn vid_heap(&mut self, fh: u64, pid: u32, p: &mut [u8]) -> u32 {
        use abi::nvos32;
        let h_root = u32_at(p, nvos32::H_ROOT);
        let h_parent = u32_at(p, nvos32::H_OBJECT_PARENT);
        let function = u32_at(p, nvos32::FUNCTION);
        let h_memory = u32_at(p, nvos32::H_MEMORY);
        let c = match self.owned_client(fh, h_root) {
            Ok(c) => c,
            Err(st) => return st,
        };
        match function {
            nvos32::FUNCTION_ALLOC_SIZE => {
                let Some(gpu) = Self::device_gpu(c, h_parent) else {
                    return NV_ERR_INVALID_OBJECT_PARENT;
                };
                if h_memory != 0 && (h_memory == h_root || c.objects.contains_key(&h_memory)) {
                    return NV_ERR_INSERT_DUPLICATE_NAME;
                }
                let req = u64_at(p, nvos32::SIZE);
                let Some(bytes) = round_up(req, abi::VIDMEM_ROUND).filter(|&b| b > 0) else {
                    return NV_ERR_INVALID_ARGUMENT;
                };
                let used = self.gpus[gpu as usize].used;
                if used + bytes > self.cfg.mem_per_gpu {
                    return NV_ERR_NO_MEMORY;
                }
                let handle = if h_memory == 0 {
                    self.pick_handle(Some(h_root))
                } else {
                    h_memory
                };
                self.insert_object(
                    h_root,
                    h_parent,
                    handle,
                    NewObject {
                        class: class::NV01_MEMORY_LOCAL_USER,
                        kind: ObjKind::Memory(Mem {
                            gpu,
                            bytes,
                            host: false,
                            pid,
                        }),
                    },
                );
                put_u32(p, nvos32::H_MEMORY, handle);
                put_u64(p, nvos32::SIZE, bytes);
                put_u64(p, nvos32::TOTAL, self.cfg.mem_per_gpu);
                put_u64(
                    p,
                    nvos32::FREE,
                    self.cfg.mem_per_gpu - self.gpus[gpu as usize].used,
                );
                NV_OK
            }
            nvos32::FUNCTION_FREE => {
                if h_memory == h_root || !c.objects.contains_key(&h_memory) {
                    return NV_ERR_OBJECT_NOT_FOUND;
                }
                self.free_subtree(h_root, h_memory);
                NV_OK
            }
            _ => NV_ERR_NOT_SUPPORTED,
        }
    }

    // ----- nvidia-uvm -----------------------------------------------------

    fn uvm_ioctl(&mut self, fh: u64, cmd: u32, arg: u64, mem: &dyn UserMem) -> EscResult {
        use abi::uvm::*;
        // (params size to read, rmStatus offset) for the commands whose
        // layout is known.
        let layout: Option<(usize, usize)> = match cmd {
            INITIALIZE => Some((INITIALIZE_SIZE, INITIALIZE_RM_STATUS)),
            DEINITIALIZE => return Ok(None),
            CREATE_RANGE_GROUP => Some((CREATE_RANGE_GROUP_SIZE, CREATE_RANGE_GROUP_RM_STATUS)),
            DESTROY_RANGE_GROUP => Some((DESTROY_RANGE_GROUP_SIZE, DESTROY_RANGE_GROUP_RM_STATUS)),
            REGISTER_GPU_VASPACE => {
                Some((REGISTER_GPU_VASPACE_SIZE, REGISTER_GPU_VASPACE_RM_STATUS))
            }
            UNREGISTER_GPU_VASPACE | UNREGISTER_GPU => {
                Some((UUID_STATUS_SIZE, UUID_STATUS_RM_STATUS))
            }
            REGISTER_CHANNEL => Some((REGISTER_CHANNEL_SIZE, REGISTER_CHANNEL_RM_STATUS)),
            UNREGISTER_CHANNEL => Some((UNREGISTER_CHANNEL_SIZE, UNREGISTER_CHANNEL_RM_STATUS)),
            FREE | CREATE_EXTERNAL_RANGE | VALIDATE_VA_RANGE => {
                Some((BASE_LENGTH_STATUS_SIZE, BASE_LENGTH_STATUS_RM_STATUS))
            }
            REGISTER_GPU => Some((REGISTER_GPU_SIZE, REGISTER_GPU_RM_STATUS)),
            PAGEABLE_MEM_ACCESS => Some((PAGEABLE_MEM_ACCESS_SIZE, PAGEABLE_MEM_ACCESS_RM_STATUS)),
            UNMAP_EXTERNAL => Some((UNMAP_EXTERNAL_SIZE, UNMAP_EXTERNAL_RM_STATUS)),
            MM_INITIALIZE => Some((MM_INITIALIZE_SIZE, MM_INITIALIZE_RM_STATUS)),
            MAP_EXTERNAL_ALLOCATION => None,
            1..=MAX_PLAIN => return Ok(None),
            _ => return Err(libc::EINVAL),
        };
        let read_len = layout.map(|(s, _)| s).unwrap_or(16);
        let b = mem.read(arg, read_len).ok_or(libc::EFAULT)?;
        let base = u64_at(&b, BASE);
        let length = u64_at(&b, LENGTH);
        let file = self.uvm.entry(fh).or_default();
        let mut extra: Option<(usize, Vec<u8>)> = None;
        let st = match cmd {
            INITIALIZE => {
                file.initialized = true;
                NV_OK
            }
            CREATE_RANGE_GROUP => {
                let id = self.next_range_group;
                self.next_range_group += 1;
                extra = Some((CREATE_RANGE_GROUP_ID, id.to_le_bytes().to_vec()));
                NV_OK
            }
            CREATE_EXTERNAL_RANGE => {
                let end = base.saturating_add(length);
                let overlaps = file
                    .ranges
                    .range(..end)
                    .next_back()
                    .is_some_and(|(b, (l, _))| b.saturating_add(*l) > base);
                if length == 0 || overlaps {
                    // Overlaps: NV_ERR_UVM_ADDRESS_IN_USE, as uvm does.
                    if length == 0 {
                        NV_ERR_INVALID_ARGUMENT
                    } else {
                        NV_ERR_UVM_ADDRESS_IN_USE
                    }
                } else {
                    file.ranges.insert(base, (length, false));
                    NV_OK
                }
            }
            MAP_EXTERNAL_ALLOCATION => {
                if let Some(r) = file.ranges.get_mut(&base) {
                    r.1 = true;
                }
                NV_OK
            }
            UNMAP_EXTERNAL => {
                if let Some(r) = file.ranges.get_mut(&base) {
                    r.1 = false;
                }
                NV_OK
            }
            FREE => {
                if file.ranges.remove(&base).is_some() {
                    NV_OK
                } else {
                    NV_ERR_INVALID_ADDRESS
                }
            }
            _ => NV_OK,
        };
        let Some((_, status_off)) = layout else {
            return Ok(Some(st));
        };
        if let Some((off, bytes)) = extra
            && !mem.write(arg + off as u64, &bytes)
        {
            return Err(libc::EFAULT);
        }
        if !mem.write(arg + status_off as u64, &st.to_le_bytes()) {
            return Err(libc::EFAULT);
        }
        Ok(Some(st))
    }

    // ----- ground truth ----------------------------------------------------

    /// The ground truth, as serialized into `nvsim-state.json`.
    pub fn state(&self) -> State {
        State {
            driver_version: self.cfg.driver_version.clone(),
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| GpuState {
                    index: i as u32,
                    capacity_bytes: self.cfg.mem_per_gpu,
                    used_bytes: g.used,
                    host_bytes: g.host,
                })
                .collect(),
            processes: self
                .procs
                .iter()
                .map(|(pid, gpus)| ProcessState {
                    pid: *pid,
                    gpus: gpus
                        .iter()
                        .map(|(gpu, pg)| ProcGpuState {
                            gpu: *gpu,
                            bytes: pg.bytes,
                            peak_bytes: pg.peak_bytes,
                            host_bytes: pg.host_bytes,
                            allocs: pg.allocs,
                            frees: pg.frees,
                        })
                        .collect(),
                })
                .collect(),
            clients: self
                .clients
                .iter()
                .map(|(h, c)| ClientState {
                    handle: *h,
                    fh: c.fh,
                    creator_pid: c.creator_pid,
                    objects: c.objects.len() as u64,
                })
                .collect(),
            ioctls: IoctlCounts {
                total: self.ioctl_total,
                failed: self.ioctl_failed,
            },
            uvm_ranges: self.uvm.values().map(|u| u.ranges.len() as u64).sum(),
        }
    }

    /// `nvsim-state.json` text.
    pub fn state_json(&self) -> String {
        let mut s = serde_json::to_string(&self.state()).expect("state serializes");
        s.push('\n');
        s
    }

    /// Ground truth for one (pid, GPU), if that process ever allocated there.
    pub fn proc_gpu(&self, pid: u32, gpu: u32) -> Option<ProcGpu> {
        self.procs.get(&pid)?.get(&gpu).copied()
    }

    /// Video bytes in use on `gpu`.
    pub fn gpu_used(&self, gpu: u32) -> u64 {
        self.gpus[gpu as usize].used
    }

    /// Host bytes attributed to `gpu`.
    pub fn gpu_host(&self, gpu: u32) -> u64 {
        self.gpus[gpu as usize].host
    }

    /// Whether client `h` exists.
    pub fn has_client(&self, h: u32) -> bool {
        self.clients.contains_key(&h)
    }

    /// Number of objects (not counting the client) in client `h`.
    pub fn client_objects(&self, h: u32) -> Option<usize> {
        self.clients.get(&h).map(|c| c.objects.len())
    }

    /// Class of object `obj` in client `client`.
    pub fn object_class(&self, client: u32, obj: u32) -> Option<u32> {
        self.clients
            .get(&client)?
            .objects
            .get(&obj)
            .map(|o| o.class)
    }
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
