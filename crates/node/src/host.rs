//! What macOS tells about this machine and its processes, where Linux has `/proc`: sysctl
//! values, the kernel's memory and CPU counters (mach host statistics), and per-process usage
//! (`proc_pid_rusage`). Only on macOS; the Linux readers stay beside their callers.
//!
//! libc marks `mach_host_self` and `mach_timebase_info` deprecated in favour of the `mach2`
//! crate; the bindings are still there and correct, and two functions do not justify a new
//! dependency, so their uses allow the deprecation.

use std::ffi::CString;

/// The raw bytes of sysctl `name`; `None` where this kernel has no such value.
fn sysctl_bytes(name: &str) -> Option<Vec<u8>> {
    let c = CString::new(name).ok()?;
    let mut len: libc::size_t = 0;
    // SAFETY: a null buffer asks only for the size, written to `len`.
    let rc = unsafe {
        libc::sysctlbyname(
            c.as_ptr(),
            std::ptr::null_mut(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 || len == 0 {
        return None;
    }
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` holds `len` bytes, and sysctl writes at most `len` (updating it).
    let rc = unsafe {
        libc::sysctlbyname(
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    buf.truncate(len);
    Some(buf)
}

/// An integer sysctl (`hw.memsize`, `hw.physicalcpu`), whichever of 4 or 8 bytes it is.
pub fn sysctl_u64(name: &str) -> Option<u64> {
    let b = sysctl_bytes(name)?;
    match b.len() {
        4 => Some(u32::from_ne_bytes(b.try_into().ok()?) as u64),
        8 => Some(u64::from_ne_bytes(b.try_into().ok()?)),
        _ => None,
    }
}

/// A string sysctl (`machdep.cpu.brand_string`), without its terminating NUL.
pub fn sysctl_string(name: &str) -> Option<String> {
    let b = sysctl_bytes(name)?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = String::from_utf8_lossy(&b[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The hardware UUID of this machine (`gethostuuid`), lower-case with dashes.
pub fn host_uuid() -> Option<String> {
    let mut id = [0u8; 16];
    let wait = libc::timespec {
        tv_sec: 5,
        tv_nsec: 0,
    };
    // SAFETY: `id` is the 16-byte uuid_t the call fills.
    if unsafe { libc::gethostuuid(id.as_mut_ptr(), &wait) } != 0 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// This host's mach port, asked for once (each call adds a reference to the port).
fn host_port() -> libc::mach_port_t {
    static HOST: std::sync::OnceLock<libc::mach_port_t> = std::sync::OnceLock::new();
    // SAFETY: mach_host_self has no preconditions.
    #[allow(deprecated)]
    *HOST.get_or_init(|| unsafe { libc::mach_host_self() })
}

/// (total, available) memory in bytes. Total is `hw.memsize`; available is what the kernel
/// can hand out without swapping or compressing: free pages (speculative ones included),
/// inactive pages (clean or cheaply reclaimed file cache) and purgeable pages, the figure
/// closest to Linux's MemAvailable. Zero for what cannot be read.
pub fn memory() -> (u64, u64) {
    let total = sysctl_u64("hw.memsize").unwrap_or(0);
    // SAFETY: an all-zero vm_statistics64 is a valid value to be overwritten.
    let mut vm: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
    let mut count = libc::HOST_VM_INFO64_COUNT;
    // SAFETY: `vm` has room for `count` integers, which is what HOST_VM_INFO64 writes.
    let kr = unsafe {
        libc::host_statistics64(
            host_port(),
            libc::HOST_VM_INFO64,
            (&mut vm as *mut libc::vm_statistics64).cast(),
            &mut count,
        )
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if kr != libc::KERN_SUCCESS || page <= 0 {
        return (total, 0);
    }
    let pages = vm.free_count as u64 + vm.inactive_count as u64 + vm.purgeable_count as u64;
    (total, (pages * page as u64).min(total))
}

/// The machine's (total, idle) CPU ticks since boot, summed over every core
/// (`HOST_CPU_LOAD_INFO`: user, system, idle and nice).
pub fn cpu_ticks() -> Option<(u64, u64)> {
    // SAFETY: an all-zero host_cpu_load_info is a valid value to be overwritten.
    let mut info: libc::host_cpu_load_info = unsafe { std::mem::zeroed() };
    let mut count = libc::HOST_CPU_LOAD_INFO_COUNT;
    // SAFETY: `info` has room for `count` integers, which is what HOST_CPU_LOAD_INFO writes.
    let kr = unsafe {
        libc::host_statistics(
            host_port(),
            libc::HOST_CPU_LOAD_INFO,
            (&mut info as *mut libc::host_cpu_load_info).cast(),
            &mut count,
        )
    };
    if kr != libc::KERN_SUCCESS {
        return None;
    }
    let ticks = info.cpu_ticks.map(u64::from);
    let total = ticks.iter().sum();
    Some((total, ticks[libc::CPU_STATE_IDLE as usize]))
}

/// `proc_pid_rusage` of `pid` (this process for `None`).
fn rusage(pid: Option<u32>) -> Option<libc::rusage_info_v4> {
    // SAFETY: getpid has no preconditions.
    let pid = pid.map_or_else(|| unsafe { libc::getpid() }, |p| p as libc::pid_t);
    // SAFETY: an all-zero rusage_info_v4 is a valid value to be overwritten.
    let mut info: libc::rusage_info_v4 = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_INFO_V4 writes one rusage_info_v4 into the buffer given.
    let rc = unsafe {
        libc::proc_pid_rusage(
            pid,
            libc::RUSAGE_INFO_V4,
            (&mut info as *mut libc::rusage_info_v4).cast(),
        )
    };
    (rc == 0).then_some(info)
}

/// The peak memory of process `pid` (this process for `None`), in bytes: its lifetime maximum
/// physical footprint, the figure macOS itself reports as a process's peak memory (`time -l`,
/// Activity Monitor). macOS keeps no peak of the resident set that Linux's VmHWM is; the
/// footprint counts the pages the process dirtied, not the clean file pages it maps, so a
/// model mapped from disk weighs less here than in VmHWM.
pub fn peak_memory(pid: Option<u32>) -> Option<u64> {
    rusage(pid).map(|r| r.ri_lifetime_max_phys_footprint)
}

/// CPU seconds (user and system) process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let r = rusage(Some(pid))?;
    Some((r.ri_user_time + r.ri_system_time) as f64 * timebase()? * 1e-9)
}

/// Nanoseconds per mach absolute-time unit, the unit of `proc_pid_rusage`'s times: 1 on Intel,
/// 125/3 on Apple silicon.
#[allow(deprecated)]
fn timebase() -> Option<f64> {
    let mut tb = libc::mach_timebase_info { numer: 0, denom: 0 };
    // SAFETY: writes the struct it is given.
    let rc = unsafe { libc::mach_timebase_info(&mut tb) };
    (rc == 0 && tb.denom != 0).then(|| tb.numer as f64 / tb.denom as f64)
}

/// The pids of `pid`'s children.
pub fn children(pid: u32) -> Vec<u32> {
    let mut buf = vec![0 as libc::pid_t; 256];
    loop {
        let bytes = (buf.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
        // SAFETY: `buf` holds `bytes` bytes; the call writes at most that many.
        let n =
            unsafe { libc::proc_listchildpids(pid as libc::pid_t, buf.as_mut_ptr().cast(), bytes) };
        if n <= 0 {
            return Vec::new();
        }
        // The count of pids written; a full buffer may have been cut short, so it is asked
        // again with more room.
        let got = (n as usize).min(buf.len());
        if got < buf.len() {
            buf.truncate(got);
            return buf
                .into_iter()
                .filter(|&p| p > 0)
                .map(|p| p as u32)
                .collect();
        }
        buf.resize(buf.len() * 4, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_reports_memory_cpu_and_this_process() {
        let (total, avail) = memory();
        assert!(total >= 1 << 30, "{total}");
        assert!(avail > 0 && avail <= total, "{avail} of {total}");
        let (t, idle) = cpu_ticks().expect("cpu ticks");
        assert!(t > 0 && idle <= t, "{idle} of {t}");
        assert!(sysctl_u64("hw.physicalcpu").is_some_and(|n| n >= 1));
        assert!(
            host_uuid().is_some_and(|u| u.len() == 36),
            "{:?}",
            host_uuid()
        );
        assert!(sysctl_string("kern.ostype").is_some_and(|s| s == "Darwin"));
        assert!(peak_memory(None).is_some_and(|b| b > 0));
        assert!(cpu_seconds(std::process::id()).is_some());
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let kids = children(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(kids.contains(&child.id()), "{kids:?}");
    }
}
