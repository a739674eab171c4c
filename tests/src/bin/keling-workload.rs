//! Small, predictable processes for Keling's tests and benchmarks.
//!
//! Each subcommand does one thing whose trace the tests know in advance; `--report
//! FILE` writes the pids it created as JSON so a test can match them to the trace.
use std::{
    hint::black_box,
    io::{Read, Write},
    time::{Duration, Instant},
};

fn usage() -> ! {
    eprintln!(
        "usage: keling-workload <command>\n\
         forktree REPORT     fork 3 children: one execs /bin/true, one exits 7, one sleeps 20 times\n\
         sleeper N MS        sleep N times for MS milliseconds\n\
         busy MS             spin on the CPU for MS milliseconds\n\
         threads N MS REPORT N threads that each spin MS ms; REPORT gets each thread's CPU time\n\
         syscalls N          N getppid calls; prints ns per call\n\
         ioctls N            N ioctl(FIONREAD) calls on a pipe; prints ns per call\n\
         rmctl DIR N         N RM_CONTROL ioctls on DIR/nvidiactl; prints ns per call\n\
         rmctl-rate DIR RATE SECS [P]  RATE RM_CONTROL ioctls a second on DIR/nvidiactl for\n\
                             SECS s, from P processes (default 1); prints the calls made\n\
         bursts DIR N CALLS GAP_MS  N bursts of CALLS RM_CONTROLs on DIR/nvidiactl, GAP_MS apart\n\
         pingpong N          two processes bounce a byte N times over pipes; prints round trips/s\n\
         \n\
         KELING_WL_CPU=N pins the process to CPU N first; pingpong's second process\n\
         goes to KELING_WL_CHILD_CPU=M when set, and KELING_WL_RATE=R paces it to R round\n\
         trips a second."
    );
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage())
}

fn fork() -> i32 {
    // SAFETY: this program is single-threaded where it forks.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    pid
}

fn wait(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

fn spin(ms: u64) {
    let end = Instant::now() + Duration::from_millis(ms);
    let mut x = 0u64;
    while Instant::now() < end {
        for _ in 0..1000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

fn forktree(report: &str) {
    let exec_true = fork();
    if exec_true == 0 {
        let err =
            std::os::unix::process::CommandExt::exec(&mut std::process::Command::new("/bin/true"));
        panic!("exec /bin/true: {err}");
    }
    let exit7 = fork();
    if exit7 == 0 {
        // SAFETY: exiting the child at once.
        unsafe { libc::_exit(7) };
    }
    let sleeper = fork();
    if sleeper == 0 {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    for pid in [exec_true, exit7, sleeper] {
        wait(pid);
    }
    let json = format!(
        "{{\"parent\":{},\"exec_true\":{exec_true},\"exit7\":{exit7},\"sleeper\":{sleeper}}}\n",
        std::process::id()
    );
    std::fs::write(report, json).expect("write report");
}

fn per_call_ns(n: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn pingpong(n: u64) {
    let mut a = [0; 2];
    let mut b = [0; 2];
    // SAFETY: valid 2-int arrays.
    unsafe {
        assert_eq!(libc::pipe(a.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(b.as_mut_ptr()), 0);
    }
    use std::os::fd::FromRawFd;
    // SAFETY: fresh fds from pipe().
    let (mut a_r, mut a_w, mut b_r, mut b_w) = unsafe {
        (
            std::fs::File::from_raw_fd(a[0]),
            std::fs::File::from_raw_fd(a[1]),
            std::fs::File::from_raw_fd(b[0]),
            std::fs::File::from_raw_fd(b[1]),
        )
    };
    let rate: Option<f64> = std::env::var("KELING_WL_RATE")
        .ok()
        .and_then(|r| r.parse().ok());
    let start = Instant::now();
    let child = fork();
    let mut byte = [0u8];
    if child == 0 {
        if let Some(cpu) = std::env::var("KELING_WL_CHILD_CPU")
            .ok()
            .and_then(|c| c.parse().ok())
        {
            pin_to_cpu(cpu);
        }
        for _ in 0..n {
            a_r.read_exact(&mut byte).unwrap();
            b_w.write_all(&byte).unwrap();
        }
        // SAFETY: exiting the child.
        unsafe { libc::_exit(0) };
    }
    for i in 0..n {
        if let Some(rate) = rate {
            // Ahead of the pace: wait (in 1 ms steps, so the pace holds on average).
            let due = Duration::from_secs_f64(i as f64 / rate);
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(ahead.max(Duration::from_millis(1)));
            }
        }
        a_w.write_all(&byte).unwrap();
        b_r.read_exact(&mut byte).unwrap();
    }
    wait(child);
    println!("{:.0}", n as f64 / start.elapsed().as_secs_f64());
}

/// CPU time this thread has used, by the kernel's own clock.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "pin to CPU {cpu}"
        );
    }
}

/// RM_CONTROL = _IOWR('F', 0x2A, 32).
const RM_CONTROL: u64 = 0xC020_462A;

/// DIR/nvidiactl opened, and a params buffer for RM_CONTROL.
fn open_rmctl(dir: &str) -> (i32, [u8; 32]) {
    let path = std::ffi::CString::new(format!("{dir}/nvidiactl")).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
    assert!(fd >= 0, "open {dir}/nvidiactl");
    (fd, [0u8; 32])
}

/// `rate` RM_CONTROLs a second for `secs` s; returns how many were made.
fn rmctl_rate(dir: &str, rate: u64, secs: u64) -> u64 {
    let (fd, mut params) = open_rmctl(dir);
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut done = 0u64;
    // At most a millisecond's worth of calls between looks at the clock, so
    // a rate this process cannot reach still ends on time.
    let batch = (rate / 1000).max(1);
    while Instant::now() < end {
        // Catch up to the pace, then sleep a millisecond.
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        let upto = due.min(done + batch);
        while done < upto {
            // SAFETY: the kernel reads/writes at most 32 bytes of params.
            black_box(unsafe { libc::ioctl(fd, RM_CONTROL, params.as_mut_ptr()) });
            done += 1;
        }
        if done >= due {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    done
}

/// [`rmctl_rate`] from `producers` processes at once (this one and forked
/// children, each `rate / producers`): the calls made by all.
fn rmctl_rate_from(producers: u64, dir: &str, rate: u64, secs: u64) -> u64 {
    let share = (rate / producers).max(1);
    let mut children = Vec::new();
    for _ in 1..producers {
        let mut fds = [0; 2];
        // SAFETY: a valid 2-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: this program is single-threaded here; the child only calls
        // rmctl_rate, writes its count and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let n = rmctl_rate(dir, share, secs);
            // SAFETY: writing 8 bytes from a valid buffer to our pipe, then exiting.
            unsafe {
                libc::write(fds[1], n.to_ne_bytes().as_ptr().cast(), 8);
                libc::_exit(0)
            }
        }
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        children.push((pid, fds[0]));
    }
    let mut total = rmctl_rate(dir, share, secs);
    for (pid, fd) in children {
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes into a valid buffer; waiting for our child.
        unsafe {
            libc::read(fd, b.as_mut_ptr().cast(), 8);
            libc::close(fd);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        total += u64::from_ne_bytes(b);
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(cpu) = std::env::var("KELING_WL_CPU")
        .ok()
        .and_then(|c| c.parse().ok())
    {
        pin_to_cpu(cpu);
    }
    match args.get(1).map(String::as_str) {
        Some("forktree") => forktree(args.get(2).map(String::as_str).unwrap_or_else(|| usage())),
        Some("sleeper") => {
            let (n, ms): (u32, u64) = (arg(&args, 2), arg(&args, 3));
            for _ in 0..n {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        Some("busy") => spin(arg(&args, 2)),
        Some("threads") => {
            let (n, ms): (usize, u64) = (arg(&args, 2), arg(&args, 3));
            let report: String = arg(&args, 4);
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    std::thread::spawn(move || {
                        spin(ms);
                        // SAFETY: gettid has no preconditions.
                        (unsafe { libc::gettid() }, thread_cpu_ns())
                    })
                })
                .collect();
            let entries: Vec<String> = handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .map(|(tid, ns)| format!("{{\"tid\":{tid},\"cpu_ns\":{ns}}}"))
                .collect();
            std::fs::write(report, format!("[{}]\n", entries.join(","))).expect("write report");
        }
        Some("syscalls") => {
            // SAFETY: getppid has no preconditions.
            let ns = per_call_ns(arg(&args, 2), || unsafe {
                black_box(libc::getppid());
            });
            println!("{ns:.1}");
        }
        Some("ioctls") => {
            let mut fds = [0; 2];
            // SAFETY: valid array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let mut avail = 0i32;
            // SAFETY: FIONREAD writes an int to a valid pointer.
            let ns = per_call_ns(arg(&args, 2), || unsafe {
                black_box(libc::ioctl(fds[0], libc::FIONREAD, &mut avail));
            });
            println!("{ns:.1}");
        }
        Some("rmctl") => {
            // RM_CONTROL on whatever DIR/nvidiactl is (for the
            // benchmark: a plain file, so the call fails fast with ENOTTY and what is
            // measured is the probes' decode-and-report path, not a driver).
            let (fd, mut params) = open_rmctl(&arg::<String>(&args, 2));
            // SAFETY: the kernel reads/writes at most 32 bytes of params.
            let ns = per_call_ns(arg(&args, 3), || unsafe {
                black_box(libc::ioctl(fd, RM_CONTROL, params.as_mut_ptr()));
            });
            println!("{ns:.1}");
        }
        Some("rmctl-rate") => {
            let dir: String = arg(&args, 2);
            let (rate, secs): (u64, u64) = (arg(&args, 3), arg(&args, 4));
            let producers: u64 = if args.len() > 5 { arg(&args, 5) } else { 1 };
            println!("{}", rmctl_rate_from(producers.max(1), &dir, rate, secs));
        }
        Some("bursts") => {
            let dir: String = arg(&args, 2);
            let (n, calls, gap_ms): (u64, u64, u64) = (arg(&args, 3), arg(&args, 4), arg(&args, 5));
            let (fd, mut params) = open_rmctl(&dir);
            for _ in 0..n {
                for _ in 0..calls {
                    // SAFETY: the kernel reads/writes at most 32 bytes of params.
                    black_box(unsafe { libc::ioctl(fd, RM_CONTROL, params.as_mut_ptr()) });
                }
                std::thread::sleep(Duration::from_millis(gap_ms));
            }
        }
        Some("pingpong") => pingpong(arg(&args, 2)),
        _ => usage(),
    }
}
