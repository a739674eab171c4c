//! An actor: a thread of work on one client.
use super::*;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Alloc {
    pub(crate) handle: u32,
    /// Video memory (VID_HEAP FREE is used for some of these).
    pub(crate) video: bool,
    /// The GPU of the memory (RM_ALLOC_MEMORY: the nvidiaN file's).
    pub(crate) gpu: u32,
    /// UVM external range base, if mapped through nvidia-uvm.
    pub(crate) uvm_base: Option<u64>,
}

/// Object handles a caller chooses: `base + n`, distinct per actor.
pub(crate) struct Handles {
    pub(crate) base: u32,
    pub(crate) n: u32,
}

impl Handles {
    pub(crate) fn pick(&mut self, rng: &mut Rng) -> u32 {
        if rng.chance(50) {
            0
        } else {
            self.n += 1;
            self.base + self.n
        }
    }
}

pub(crate) struct Actor<'e> {
    pub(crate) env: &'e Env,
    pub(crate) rng: Rng,
    pub(crate) ctl: RawFd,
    pub(crate) client: u32,
    pub(crate) device: u32,
    pub(crate) subdevice: u32,
    pub(crate) gpu: u32,
    pub(crate) handles: Handles,
    pub(crate) live: Vec<Alloc>,
    /// nvidia-uvm fd and the next fake VA for external ranges.
    pub(crate) uvm: Option<RawFd>,
    pub(crate) next_va: u64,
    /// nvidiaN fds for RM_ALLOC_MEMORY, opened on demand.
    pub(crate) gpu_fds: Vec<Option<RawFd>>,
}

impl<'e> Actor<'e> {
    pub(crate) fn new(env: &'e Env, rng: Rng, ctl: RawFd, handle_base: u32) -> Self {
        Actor {
            env,
            rng,
            ctl,
            client: 0,
            device: 0,
            subdevice: 0,
            gpu: 0,
            handles: Handles {
                base: handle_base,
                n: 0,
            },
            live: Vec::new(),
            uvm: None,
            next_va: 0x7e00_0000_0000 + ((handle_base as u64) << 20),
            gpu_fds: vec![None; env.gpus as usize],
        }
    }

    /// Joins an existing client/device (threads, forked and exec'd children).
    pub(crate) fn join(mut self, client: u32, device: u32, gpu: u32) -> Self {
        self.client = client;
        self.device = device;
        self.gpu = gpu;
        self
    }

    pub(crate) fn new_client(&mut self) -> u32 {
        let chosen = if self.rng.chance(50) {
            0x6000_0000 | ((std::process::id() & 0xf_ffff) << 8) | (self.rng.below(256) as u32)
        } else {
            0
        };
        let (mut st, mut h) = ok_or_die(
            "client",
            self.env.alloc(
                self.ctl,
                false,
                false,
                0,
                0,
                chosen,
                class::NV01_ROOT_CLIENT,
                None,
            ),
        );
        if st == status::NV_ERR_INSERT_DUPLICATE_NAME && chosen != 0 {
            (st, h) = ok_or_die(
                "client",
                self.env.alloc(
                    self.ctl,
                    false,
                    false,
                    0,
                    0,
                    0,
                    class::NV01_ROOT_CLIENT,
                    None,
                ),
            );
        }
        expect_ok("client alloc", st);
        h
    }

    pub(crate) fn obj(&mut self, parent: u32, cls: u32, params: Option<&mut [u8]>) -> u32 {
        let new = self.handles.pick(&mut self.rng);
        let nvos64 = self.rng.chance(30);
        let (st, h) = ok_or_die(
            "RM_ALLOC",
            self.env.alloc(
                self.ctl,
                nvos64,
                false,
                self.client,
                parent,
                new,
                cls,
                params,
            ),
        );
        expect_ok(&format!("alloc class {cls:#x}"), st);
        if new != 0 && h != new {
            die("a chosen handle was not kept");
        }
        h
    }

    /// A new client on this actor's file and the device of `gpu` under it (None:
    /// a GPU drawn from the actor's rng, after the client's draws).
    pub(crate) fn client_and_device(&mut self, gpu: Option<u32>) {
        self.client = self.new_client();
        self.gpu = match gpu {
            Some(g) => g,
            None => self.rng.below(self.env.gpus as u64) as u32,
        };
        let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
        put_u32(&mut dp, 0, self.gpu);
        self.device = self.obj(self.client, class::NV01_DEVICE_0, Some(&mut dp));
    }

    /// Client, device on a random GPU, subdevice, VA space, TSG, context
    /// share, Hopper channel and compute object.
    pub(crate) fn setup_objects(&mut self) {
        self.client_and_device(None);
        let mut sp = vec![0u8; abi::size::NV2080_ALLOC];
        self.subdevice = self.obj(self.device, class::NV20_SUBDEVICE_0, Some(&mut sp));
        let vas = self.obj(self.device, class::FERMI_VASPACE_A, None);
        let mut tp = vec![0u8; abi::size::TSG_ALLOC];
        put_u32(&mut tp, 8, vas);
        put_u32(&mut tp, 12, 1);
        let tsg = self.obj(self.device, class::KEPLER_CHANNEL_GROUP_A, Some(&mut tp));
        let ctx = self.obj(tsg, class::FERMI_CONTEXT_SHARE_A, None);
        let mut cp = vec![0u8; abi::size::CHANNEL_ALLOC];
        put_u64(&mut cp, 16, 1024);
        put_u32(&mut cp, 24, ctx);
        put_u32(&mut cp, 28, vas);
        put_u32(&mut cp, 128, 1);
        let ch = self.obj(tsg, class::HOPPER_CHANNEL_GPFIFO_A, Some(&mut cp));
        self.obj(ch, class::HOPPER_COMPUTE_A, None);
        if self.rng.chance(50) {
            self.obj(ch, class::HOPPER_DMA_COPY_A, None);
        }
        if let Some(u) = self.uvm {
            let mut p = vec![0u8; uvm::REGISTER_GPU_SIZE];
            put_u32(&mut p, 24, self.ctl as u32);
            put_u32(&mut p, 28, self.client);
            expect_ok(
                "UVM_REGISTER_GPU",
                self.env.uvm(
                    u,
                    uvm::REGISTER_GPU,
                    &mut p,
                    Some(uvm::REGISTER_GPU_RM_STATUS),
                ),
            );
            let mut p = vec![0u8; uvm::REGISTER_GPU_VASPACE_SIZE];
            put_u32(&mut p, 16, self.ctl as u32);
            put_u32(&mut p, 20, self.client);
            put_u32(&mut p, 24, vas);
            expect_ok(
                "UVM_REGISTER_GPU_VASPACE",
                self.env.uvm(
                    u,
                    uvm::REGISTER_GPU_VASPACE,
                    &mut p,
                    Some(uvm::REGISTER_GPU_VASPACE_RM_STATUS),
                ),
            );
            let mut p = vec![0u8; uvm::REGISTER_CHANNEL_SIZE];
            put_u32(&mut p, 16, self.ctl as u32);
            put_u32(&mut p, 20, self.client);
            put_u32(&mut p, 24, ch);
            expect_ok(
                "UVM_REGISTER_CHANNEL",
                self.env.uvm(
                    u,
                    uvm::REGISTER_CHANNEL,
                    &mut p,
                    Some(uvm::REGISTER_CHANNEL_RM_STATUS),
                ),
            );
        }
    }

    /// One video allocation; None on NV_ERR_NO_MEMORY.
    pub(crate) fn alloc_video(&mut self, size: u64, via: Via) -> Option<Alloc> {
        let new = self.handles.pick(&mut self.rng);
        let parent = if self.rng.chance(20) && self.subdevice != 0 {
            self.subdevice
        } else {
            self.device
        };
        let (st, h, real) = match via {
            Via::VidHeap => {
                let mut b = vec![0u8; abi::size::NVOS32];
                put_u32(&mut b, 0, self.client);
                put_u32(&mut b, 4, self.device);
                put_u32(&mut b, 8, abi::nvos32::FUNCTION_ALLOC_SIZE);
                put_u32(&mut b, 44, new);
                put_u64(&mut b, 88, size);
                ok_or_die(
                    "VID_HEAP ALLOC_SIZE",
                    self.env
                        .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
                );
                (u32_at(&b, 20), u32_at(&b, 44), u64_at(&b, 88))
            }
            _ => {
                let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
                put_u64(&mut p, 64, size);
                let nvos64 = matches!(via, Via::Nvos64 | Via::Xfer64);
                let xfer = matches!(via, Via::Xfer21 | Via::Xfer64);
                // The 0-byte classes (0xC2, 0xF8, ...) have their own step
                // (`zero_byte_classes`).
                let cls = class::NV01_MEMORY_LOCAL_USER;
                let (st, h) = ok_or_die(
                    "RM_ALLOC memory",
                    self.env.alloc(
                        self.ctl,
                        nvos64,
                        xfer,
                        self.client,
                        parent,
                        new,
                        cls,
                        Some(&mut p),
                    ),
                );
                (st, h, u64_at(&p, 64))
            }
        };
        if st == status::NV_ERR_NO_MEMORY {
            return None;
        }
        expect_ok(&format!("video alloc {size} via {via:?}"), st);
        if real < size {
            die(&format!("driver wrote back {real} < requested {size}"));
        }
        let mut a = Alloc {
            handle: h,
            video: true,
            gpu: self.gpu,
            uvm_base: None,
        };
        if let Some(u) = self.uvm
            && self.rng.chance(40)
        {
            let base = self.next_va;
            self.next_va += real.next_multiple_of(1 << 30);
            let mut p = vec![0u8; uvm::BASE_LENGTH_STATUS_SIZE];
            put_u64(&mut p, 0, base);
            put_u64(&mut p, 8, real);
            expect_ok(
                "UVM_CREATE_EXTERNAL_RANGE",
                self.env.uvm(
                    u,
                    uvm::CREATE_EXTERNAL_RANGE,
                    &mut p,
                    Some(uvm::BASE_LENGTH_STATUS_RM_STATUS),
                ),
            );
            // UVM_MAP_EXTERNAL_ALLOCATION: base@0, length@8, the rest is
            // version-dependent; a buffer as large as the 256-GPU layout.
            let mut p = vec![0u8; 9264];
            put_u64(&mut p, 0, base);
            put_u64(&mut p, 8, real);
            self.env.uvm(u, uvm::MAP_EXTERNAL_ALLOCATION, &mut p, None);
            a.uvm_base = Some(base);
        }
        self.live.push(a);
        Some(a)
    }

    pub(crate) fn alloc_random_video(&mut self) {
        let size = random_size(&mut self.rng);
        let via = VIAS[self.rng.below(VIAS.len() as u64) as usize];
        self.alloc_video(size, via);
    }

    /// Host memory: RM_ALLOC_MEMORY on nvidiaN, or RM_ALLOC class 0x3E.
    pub(crate) fn alloc_host(&mut self) {
        let size = 4096 + self.rng.below(64 * MIB);
        let new = self.handles.pick(&mut self.rng);
        if self.rng.chance(60) {
            let g = self.rng.below(self.env.gpus as u64) as usize;
            let fd = self.gpu_fd(g);
            let mut b = vec![0u8; abi::size::NVOS02_WITH_FD];
            put_u32(&mut b, 0, self.client);
            put_u32(&mut b, 4, self.device);
            put_u32(&mut b, 8, new);
            let cls = if self.rng.chance(50) {
                class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
            } else {
                class::NV01_MEMORY_SYSTEM
            };
            put_u32(&mut b, 12, cls);
            put_u64(&mut b, 24, 0x7d00_0000_0000);
            put_u64(&mut b, 32, size - 1);
            put_u32(&mut b, 48, u32::MAX);
            ok_or_die(
                "RM_ALLOC_MEMORY",
                self.env.rm(fd, esc::RM_ALLOC_MEMORY, &mut b, false),
            );
            expect_ok("RM_ALLOC_MEMORY", u32_at(&b, 40));
            self.live.push(Alloc {
                handle: u32_at(&b, 8),
                video: false,
                gpu: g as u32,
                uvm_base: None,
            });
        } else {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, size);
            let xfer = self.rng.chance(30);
            let (st, h) = ok_or_die(
                "RM_ALLOC 0x3E",
                self.env.alloc(
                    self.ctl,
                    false,
                    xfer,
                    self.client,
                    self.device,
                    new,
                    class::NV01_MEMORY_SYSTEM,
                    Some(&mut p),
                ),
            );
            expect_ok("host alloc", st);
            self.live.push(Alloc {
                handle: h,
                video: false,
                gpu: self.gpu,
                uvm_base: None,
            });
        }
    }

    /// The nvidiaN fd of this actor (opened and registered on first use).
    pub(crate) fn gpu_fd(&mut self, g: usize) -> RawFd {
        if let Some(fd) = self.gpu_fds[g] {
            return fd;
        }
        let fd = self.env.open(&format!("nvidia{g}"), false);
        let mut r = [0u8; 4];
        put_u32(&mut r, 0, self.ctl as u32);
        ok_or_die(
            "REGISTER_FD",
            self.env.rm(fd, esc::REGISTER_FD, &mut r, false),
        );
        self.gpu_fds[g] = Some(fd);
        fd
    }

    pub(crate) fn free_alloc(&mut self, a: Alloc) {
        if let (Some(u), Some(base)) = (self.uvm, a.uvm_base) {
            let mut p = vec![0u8; uvm::BASE_LENGTH_STATUS_SIZE];
            put_u64(&mut p, 0, base);
            expect_ok(
                "UVM_FREE",
                self.env.uvm(
                    u,
                    uvm::FREE,
                    &mut p,
                    Some(uvm::BASE_LENGTH_STATUS_RM_STATUS),
                ),
            );
        }
        let st = if a.video && self.rng.chance(30) {
            let mut b = vec![0u8; abi::size::NVOS32];
            put_u32(&mut b, 0, self.client);
            put_u32(&mut b, 4, self.device);
            put_u32(&mut b, 8, abi::nvos32::FUNCTION_FREE);
            put_u32(&mut b, 44, a.handle);
            ok_or_die(
                "VID_HEAP FREE",
                self.env
                    .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
            );
            u32_at(&b, 20)
        } else {
            self.env.free(self.ctl, self.client, self.device, a.handle)
        };
        expect_ok("free", st);
    }

    pub(crate) fn free_random(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let i = self.rng.below(self.live.len() as u64) as usize;
        let a = self.live.swap_remove(i);
        self.free_alloc(a);
    }

    pub(crate) fn map_unmap(&mut self) {
        let Some(&a) = self
            .live
            .get(self.rng.below(self.live.len().max(1) as u64) as usize)
        else {
            return;
        };
        let mut m = vec![0u8; abi::size::NVOS33_WITH_FD];
        put_u32(&mut m, 0, self.client);
        put_u32(&mut m, 4, self.device);
        put_u32(&mut m, 8, a.handle);
        put_u64(&mut m, 24, 4096);
        put_u32(&mut m, 48, self.ctl as u32);
        ok_or_die(
            "RM_MAP_MEMORY",
            self.env.rm(self.ctl, esc::RM_MAP_MEMORY, &mut m, false),
        );
        expect_ok("RM_MAP_MEMORY", u32_at(&m, 40));
        let mut u = vec![0u8; abi::size::NVOS34];
        put_u32(&mut u, 0, self.client);
        put_u32(&mut u, 4, self.device);
        put_u32(&mut u, 8, a.handle);
        put_u64(&mut u, 16, u64_at(&m, 32));
        ok_or_die(
            "RM_UNMAP_MEMORY",
            self.env.rm(self.ctl, esc::RM_UNMAP_MEMORY, &mut u, false),
        );
        expect_ok("RM_UNMAP_MEMORY", u32_at(&u, 24));
    }

    pub(crate) fn control(&mut self) {
        let obj = match self.rng.below(3) {
            0 => self.client,
            1 => self.device,
            _ => self.subdevice,
        };
        let cmd = 0x2080_0100 | self.rng.below(0x100) as u32;
        let st = if self.rng.chance(50) {
            self.env.control(self.ctl, self.client, obj, cmd, None)
        } else {
            let mut p = vec![0u8; 8 + self.rng.below(256) as usize];
            self.env
                .control(self.ctl, self.client, obj, cmd, Some(&mut p))
        };
        // Random commands and sizes: the driver answers, refuses the command
        // (NV_ERR_NOT_SUPPORTED), the params' size (INVALID_PARAM_STRUCT) or
        // their contents; none of it changes what anyone holds, which is what
        // the tracer is checked on. The status is not the point.
        let _ = st;
    }

    /// NVOS32 with hRoot, hObjectParent (the device) and the function.
    pub(crate) fn nvos32(&self, function: u32) -> Vec<u8> {
        let mut b = vec![0u8; abi::size::NVOS32];
        put_u32(&mut b, 0, self.client);
        put_u32(&mut b, 4, self.device);
        put_u32(&mut b, 8, function);
        b
    }

    /// Video memory size of GPU `g`, from CARD_INFO (fb_size@48 of each
    /// 72-byte entry).
    pub(crate) fn fb_size(&self, g: u32) -> u64 {
        let mut ci = vec![0u8; abi::size::CARD_INFO_ENTRY * self.env.gpus as usize];
        ok_or_die(
            "CARD_INFO",
            self.env.rm(self.ctl, esc::CARD_INFO, &mut ci, false),
        );
        u64_at(&ci, g as usize * abi::size::CARD_INFO_ENTRY + 48)
    }

    /// The escapes every CUDA process sends at start; none allocates.
    pub(crate) fn startup_escapes(&mut self) {
        use abi::os_event;
        let gfd = self.gpu_fd(self.gpu as usize);
        let mut ev = vec![0u8; abi::size::OS_EVENT];
        put_u32(&mut ev, os_event::H_CLIENT, self.client);
        put_u32(&mut ev, os_event::H_DEVICE, self.device);
        put_u32(&mut ev, os_event::FD, gfd as u32);
        put_u32(&mut ev, os_event::STATUS, u32::MAX);
        ok_or_die(
            "ALLOC_OS_EVENT",
            self.env.rm(self.ctl, esc::ALLOC_OS_EVENT, &mut ev, false),
        );
        expect_ok("ALLOC_OS_EVENT", u32_at(&ev, os_event::STATUS));
        let mut sp = vec![0u8; abi::size::SYS_PARAMS];
        put_u64(&mut sp, 0, 128 * MIB);
        ok_or_die(
            "SYS_PARAMS",
            self.env.rm(self.ctl, esc::SYS_PARAMS, &mut sp, false),
        );
        let mut numa = vec![0xffu8; 536];
        ok_or_die(
            "NUMA_INFO",
            self.env.rm(gfd, esc::NUMA_INFO, &mut numa, false),
        );
        if self.env.major >= abi::wait_open_complete::SINCE {
            let mut w = vec![0xffu8; abi::size::WAIT_OPEN_COMPLETE];
            ok_or_die(
                "WAIT_OPEN_COMPLETE",
                self.env.rm(gfd, esc::WAIT_OPEN_COMPLETE, &mut w, false),
            );
            expect_ok("WAIT_OPEN_COMPLETE rc", u32_at(&w, 0));
        }
        let mut u = vec![0u8; abi::size::NVOS56];
        put_u32(&mut u, abi::nvos56::H_CLIENT, self.client);
        put_u32(&mut u, abi::nvos56::H_DEVICE, self.device);
        put_u32(
            &mut u,
            abi::nvos56::H_MEMORY,
            self.live.first().map(|a| a.handle).unwrap_or(0),
        );
        put_u64(&mut u, abi::nvos56::P_OLD_CPU_ADDRESS, 0x7c00_0000_0000);
        put_u64(&mut u, abi::nvos56::P_NEW_CPU_ADDRESS, 0x7c00_0010_0000);
        ok_or_die(
            "UPDATE_DEVICE_MAPPING_INFO",
            self.env
                .rm(self.ctl, esc::RM_UPDATE_DEVICE_MAPPING_INFO, &mut u, false),
        );
        expect_ok(
            "UPDATE_DEVICE_MAPPING_INFO",
            u32_at(&u, abi::nvos56::STATUS),
        );
        put_u32(&mut ev, os_event::STATUS, u32::MAX);
        ok_or_die(
            "FREE_OS_EVENT",
            self.env.rm(self.ctl, esc::FREE_OS_EVENT, &mut ev, false),
        );
        expect_ok("FREE_OS_EVENT", u32_at(&ev, os_event::STATUS));
    }

    /// RM_ALLOC_MEMORY of class 0x40 (limit = the whole heap - 1 written
    /// back) or 0x3F (limit 0xFFFFFFFF) on nvidiaN: 0-byte objects.
    pub(crate) fn alloc_memory_video_class(&mut self) {
        let g = self.rng.below(self.env.gpus as u64) as u32;
        let fd = self.gpu_fd(g as usize);
        let privileged = self.rng.chance(30);
        let cls = if privileged {
            class::NV01_MEMORY_LOCAL_PRIVILEGED
        } else {
            class::NV01_MEMORY_LOCAL_USER
        };
        let mut b = vec![0u8; abi::size::NVOS02_WITH_FD];
        put_u32(&mut b, 0, self.client);
        put_u32(&mut b, 4, self.device);
        put_u32(&mut b, 8, self.handles.pick(&mut self.rng));
        put_u32(&mut b, 12, cls);
        put_u64(&mut b, 32, random_size(&mut self.rng) - 1);
        put_u32(&mut b, 48, u32::MAX);
        ok_or_die(
            "RM_ALLOC_MEMORY video",
            self.env.rm(fd, esc::RM_ALLOC_MEMORY, &mut b, false),
        );
        expect_ok("RM_ALLOC_MEMORY video", u32_at(&b, 40));
        let want = if privileged {
            0xFFFF_FFFF
        } else {
            self.fb_size(g) - 1
        };
        if u64_at(&b, 32) != want {
            die(&format!(
                "RM_ALLOC_MEMORY {cls:#x}: limit {:#x}, expected {want:#x}",
                u64_at(&b, 32)
            ));
        }
        self.live.push(Alloc {
            handle: u32_at(&b, 8),
            video: false,
            gpu: g,
            uvm_base: None,
        });
    }

    /// VID_HEAP_CONTROL of each class: virtual, EGM, video, host,
    /// ALLOC_SIZE_RANGE, ALLOC_OS_DESCRIPTOR.
    pub(crate) fn vid_heap_class(&mut self) {
        use abi::nvos32 as v;
        let which = self.rng.below(6);
        let size = random_size(&mut self.rng);
        let h = self.handles.pick(&mut self.rng);
        let (mut b, h_off, size_off) = match which {
            0..=3 => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_SIZE);
                match which {
                    0 => put_u32(&mut b, v::ALLOC_FLAGS, v::FLAGS_VIRTUAL),
                    1 => put_u32(&mut b, v::ATTR2, v::ATTR2_USE_EGM),
                    2 => put_u32(&mut b, v::ATTR, 0),
                    _ => {
                        let loc = 1 + self.rng.below(3) as u32;
                        put_u32(&mut b, v::ATTR, loc << v::ATTR_LOCATION_SHIFT);
                    }
                }
                (b, v::H_MEMORY, Some(v::SIZE))
            }
            4 => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_SIZE_RANGE);
                match self.rng.below(3) {
                    0 => put_u32(&mut b, v::ALLOC_FLAGS, v::FLAGS_VIRTUAL),
                    1 => put_u32(&mut b, v::ATTR, 2 << v::ATTR_LOCATION_SHIFT),
                    _ => put_u32(&mut b, v::ATTR2, v::ATTR2_USE_EGM), // ignored: video
                }
                (b, v::H_MEMORY, Some(v::RANGE_SIZE))
            }
            _ => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_OS_DESCRIPTOR);
                put_u64(&mut b, v::OS_DESC_LIMIT, size.min(64 * MIB) - 1);
                (b, v::OS_DESC_H_MEMORY, None)
            }
        };
        put_u32(&mut b, h_off, h);
        if let Some(o) = size_off {
            put_u64(&mut b, o, size);
        }
        ok_or_die(
            "VID_HEAP",
            self.env
                .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
        );
        let st = u32_at(&b, v::STATUS);
        if st == status::NV_ERR_NO_MEMORY {
            return;
        }
        expect_ok(&format!("VID_HEAP class step {which}"), st);
        if let Some(o) = size_off
            && u64_at(&b, o) < size
        {
            die("VID_HEAP wrote back a smaller size");
        }
        self.live.push(Alloc {
            handle: u32_at(&b, h_off),
            video: matches!(which, 2 | 4),
            gpu: self.gpu,
            uvm_base: None,
        });
    }

    /// The classes that never hold bytes, and EGM through RM_ALLOC.
    pub(crate) fn zero_byte_classes(&mut self) {
        let which = self.rng.below(9);
        let new = self.handles.pick(&mut self.rng);
        let mut parent = self.device;
        let (cls, mut params): (u32, Option<Vec<u8>>) = match which {
            0 => {
                let mut p = vec![0u8; abi::size::PHYS_MEM_PARAMS];
                put_u64(&mut p, abi::phys_mem::PAGE_SIZE, 2 * MIB);
                (class::NV01_MEMORY_LOCAL_PHYSICAL, Some(p))
            }
            1 => {
                parent = self.subdevice;
                let mut p = vec![0u8; abi::size::FABRIC_PARAMS];
                put_u64(&mut p, abi::fabric::ALLOC_SIZE, 512 * MIB);
                put_u64(&mut p, abi::fabric::PAGE_SIZE, 512 * MIB);
                let vid = self.live.iter().find(|a| a.video).map(|a| a.handle);
                put_u32(&mut p, abi::fabric::MAP_H_VIDMEM, vid.unwrap_or(0));
                (class::NV_MEMORY_FABRIC, Some(p))
            }
            2 => {
                let (len, off) = if self.env.major >= abi::multicast::SINCE {
                    (abi::size::MULTICAST_PARAMS, abi::multicast::ALLOC_SIZE)
                } else {
                    (
                        abi::size::MULTICAST_PARAMS_LEGACY,
                        abi::multicast::ALLOC_SIZE_LEGACY,
                    )
                };
                let mut p = vec![0u8; len];
                put_u64(&mut p, off, 512 * MIB);
                (class::NV_MEMORY_MULTICAST_FABRIC, Some(p))
            }
            3 => (class::NV_MEMORY_FABRIC_IMPORT_V2, None),
            4 => (class::NV_MEMORY_FABRIC_IMPORTED_REF, None),
            5 => (class::NV_MEMORY_EXPORT, None),
            6 => (class::NV50_MEMORY_VIRTUAL, None),
            7 => (class::NV01_MEMORY_VIRTUAL, None),
            _ => {
                let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
                put_u64(&mut p, 64, random_size(&mut self.rng));
                (class::NV_MEMORY_EXTENDED_USER, Some(p))
            }
        };
        let nvos64 = self.rng.chance(30);
        let (st, h) = ok_or_die(
            "RM_ALLOC 0-byte class",
            self.env.alloc(
                self.ctl,
                nvos64,
                false,
                self.client,
                parent,
                new,
                cls,
                params.as_deref_mut(),
            ),
        );
        expect_ok(&format!("alloc class {cls:#x}"), st);
        if cls == class::NV01_MEMORY_LOCAL_PHYSICAL
            && params.as_ref().map(|p| u64_at(p, 0)) != Some(self.fb_size(self.gpu))
        {
            die("0xC2: memSize is not the whole heap");
        }
        self.live.push(Alloc {
            handle: h,
            video: false,
            gpu: self.gpu,
            uvm_base: None,
        });
    }

    /// A fresh subdevice with memory under it (video, host, a fabric range),
    /// one of them dup'd elsewhere first sometimes; then the subdevice is
    /// freed, which frees what is under it.
    pub(crate) fn subdevice_teardown(&mut self) {
        let mut sp = vec![0u8; abi::size::NV2080_ALLOC];
        let sd = self.obj(self.device, class::NV20_SUBDEVICE_0, Some(&mut sp));
        let mut under = Vec::new();
        for i in 0..1 + self.rng.below(3) {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, (1 + self.rng.below(16)) * MIB);
            let cls = if i == 2 {
                class::NV01_MEMORY_SYSTEM
            } else {
                class::NV01_MEMORY_LOCAL_USER
            };
            let (st, h) = ok_or_die(
                "alloc under subdevice",
                self.env.alloc(
                    self.ctl,
                    false,
                    false,
                    self.client,
                    sd,
                    0,
                    cls,
                    Some(&mut p),
                ),
            );
            if st == status::NV_ERR_NO_MEMORY {
                continue;
            }
            expect_ok("alloc under subdevice", st);
            under.push(h);
        }
        let mut fp = vec![0u8; abi::size::FABRIC_PARAMS];
        put_u64(&mut fp, abi::fabric::ALLOC_SIZE, 64 * MIB);
        let (st, _) = ok_or_die(
            "fabric under subdevice",
            self.env.alloc(
                self.ctl,
                false,
                false,
                self.client,
                sd,
                0,
                class::NV_MEMORY_FABRIC,
                Some(&mut fp),
            ),
        );
        expect_ok("fabric under subdevice", st);
        if let Some(&h) = under.first()
            && self.rng.chance(40)
        {
            // a reference under the device survives the teardown
            let d = self.dup_into(self.client, self.device, self.client, h);
            self.live.push(Alloc {
                handle: d,
                video: false,
                gpu: self.gpu,
                uvm_base: None,
            });
        }
        expect_ok(
            "free subdevice",
            self.env.free(self.ctl, self.client, self.device, sd),
        );
    }

    /// RM_DUP_OBJECT of `src` of `src_client` into `client` under `parent`
    /// through this actor's fd; returns the new handle.
    pub(crate) fn dup_into(&mut self, client: u32, parent: u32, src_client: u32, src: u32) -> u32 {
        use abi::nvos55;
        let new = self.handles.pick(&mut self.rng);
        let mut b = vec![0u8; abi::size::NVOS55];
        put_u32(&mut b, nvos55::H_CLIENT, client);
        put_u32(&mut b, nvos55::H_PARENT, parent);
        put_u32(&mut b, nvos55::H_OBJECT, new);
        put_u32(&mut b, nvos55::H_CLIENT_SRC, src_client);
        put_u32(&mut b, nvos55::H_OBJECT_SRC, src);
        put_u32(&mut b, nvos55::STATUS, u32::MAX);
        ok_or_die(
            "RM_DUP_OBJECT",
            self.env.rm(self.ctl, esc::RM_DUP_OBJECT, &mut b, false),
        );
        expect_ok("RM_DUP_OBJECT", u32_at(&b, nvos55::STATUS));
        let h = u32_at(&b, nvos55::H_OBJECT);
        if new != 0 && h != new {
            die("RM_DUP_OBJECT did not keep the chosen handle");
        }
        h
    }

    /// Exports `handles` (memory of this actor, all on this actor's GPU) to
    /// the nvidiactl file `exp`: one EXPORT_OBJECT_TO_FD, or a batch with an
    /// empty slot sometimes. Returns the batch size (0: single).
    pub(crate) fn export_to(&mut self, exp: RawFd, handles: &[u32]) -> u32 {
        if handles.len() == 1 && self.rng.chance(50) {
            let mut p = vec![0u8; abi::size::EXPORT_OBJECT_TO_FD];
            put_u32(&mut p, ux::EXP1_TYPE, ux::OBJECT_TYPE_RM);
            put_u32(&mut p, ux::EXP1_H_DEVICE, self.device);
            put_u32(&mut p, ux::EXP1_H_PARENT, self.device);
            put_u32(&mut p, ux::EXP1_H_OBJECT, handles[0]);
            put_u32(&mut p, ux::EXP1_FD, exp as u32);
            let st = self.env.control(
                self.ctl,
                self.client,
                self.client,
                ux::EXPORT_OBJECT_TO_FD,
                Some(&mut p),
            );
            expect_ok("EXPORT_OBJECT_TO_FD", st);
            return 0;
        }
        let mut objs: Vec<u32> = handles.to_vec();
        if self.rng.chance(30) {
            let at = self.rng.below(objs.len() as u64 + 1) as usize;
            objs.insert(at, 0);
        }
        let mut p = vec![0u8; abi::size::EXPORT_OBJECTS_TO_FD];
        put_u32(&mut p, ux::EXPN_FD, exp as u32);
        put_u32(&mut p, ux::EXPN_H_DEVICE, self.device);
        put_u16(&mut p, ux::EXPN_MAX_OBJECTS, objs.len() as u16);
        p[ux::EXPN_METADATA..ux::EXPN_METADATA + 8].copy_from_slice(b"keling\0\0");
        for (i, h) in objs.iter().enumerate() {
            put_u32(&mut p, ux::EXPN_OBJECTS + 4 * i, *h);
        }
        put_u16(&mut p, ux::EXPN_NUM_OBJECTS, objs.len() as u16);
        let st = self.env.control(
            self.ctl,
            self.client,
            self.client,
            ux::EXPORT_OBJECTS_TO_FD,
            Some(&mut p),
        );
        expect_ok("EXPORT_OBJECTS_TO_FD", st);
        objs.len() as u32
    }

    /// Removes and returns the live allocations with these handles.
    pub(crate) fn take_live(&mut self, handles: &[u32]) -> Vec<Alloc> {
        let (out, keep): (Vec<Alloc>, Vec<Alloc>) = self
            .live
            .drain(..)
            .partition(|a| handles.contains(&a.handle));
        self.live = keep;
        out
    }

    /// Up to `n` distinct live allocations on this actor's GPU, at random.
    pub(crate) fn pick_live(&mut self, n: usize) -> Vec<u32> {
        let mut c: Vec<u32> = self
            .live
            .iter()
            .filter(|a| a.gpu == self.gpu)
            .map(|a| a.handle)
            .collect();
        let mut out = Vec::new();
        while out.len() < n && !c.is_empty() {
            let i = self.rng.below(c.len() as u64) as usize;
            out.push(c.swap_remove(i));
        }
        out
    }

    /// A small burst of allocs/frees/controls (threads and children).
    pub(crate) fn burst(&mut self, n: u32) {
        for _ in 0..n {
            match self.rng.below(4) {
                0 | 1 => self.alloc_random_video(),
                2 => self.free_random(),
                _ => self.control(),
            }
        }
    }
}
