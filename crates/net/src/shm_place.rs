//! Where this host's shared-memory regions live, and which boot of the host a process runs
//! in: the two facts (with the user) that tell whether two ranks can share a region. Linux
//! has `/dev/shm` and `/proc/sys/kernel/random/boot_id`; macOS has neither, so it gets a
//! private directory and `kern.bootsessionuuid`.

use std::path::PathBuf;

/// Where shared-memory regions are created.
#[cfg(not(target_os = "macos"))]
pub(crate) fn shm_dir() -> PathBuf {
    if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// Where shared-memory regions are created: macOS has no `/dev/shm`, so the region is an
/// owner-only file in the user's private temporary directory (`/var/folders/../T`, mode 0700,
/// which `confstr(_CS_DARWIN_USER_TEMP_DIR)` names whatever `$TMPDIR` says), mapped by every
/// rank as on Linux. Unlike `/dev/shm` the directory is on disk: the rings' pages live in the
/// page cache like any mapped file's and may be written back now and then, which costs some
/// I/O but changes nothing the ranks see. POSIX `shm_open` would avoid the file, but its
/// objects are named in one namespace for the whole machine rather than in a directory only
/// this user can list. The usual temporary directory if confstr has no answer.
#[cfg(target_os = "macos")]
pub(crate) fn shm_dir() -> PathBuf {
    let mut buf = vec![0u8; 1024];
    // SAFETY: confstr writes at most `buf.len()` bytes, NUL included, into the buffer.
    let n = unsafe {
        libc::confstr(
            libc::_CS_DARWIN_USER_TEMP_DIR,
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n == 0 || n > buf.len() {
        return std::env::temp_dir();
    }
    buf.truncate(n - 1);
    match String::from_utf8(buf) {
        Ok(dir) if std::path::Path::new(&dir).is_dir() => PathBuf::from(dir),
        _ => std::env::temp_dir(),
    }
}

/// The kernel's id of this boot, equal for every process and network namespace of the host.
#[cfg(target_os = "linux")]
pub(crate) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

/// The kernel's id of this boot: sysctl `kern.bootsessionuuid`, a UUID drawn at each boot.
#[cfg(target_os = "macos")]
pub(crate) fn boot_id() -> Option<String> {
    let name = c"kern.bootsessionuuid";
    let mut buf = [0u8; 64];
    let mut len: libc::size_t = buf.len();
    // SAFETY: `buf` holds `len` bytes, and sysctl writes at most that many (updating `len`).
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    let id = buf.get(..len)?;
    let end = id.iter().position(|&b| b == 0).unwrap_or(id.len());
    let id = std::str::from_utf8(&id[..end]).ok()?.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// No boot id is known here, so [`crate::Transport::Auto`] never picks shared memory.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) fn boot_id() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_id_and_a_region_directory_are_found() {
        assert!(shm_dir().is_dir(), "{}", shm_dir().display());
        #[cfg(any(target_os = "linux", target_os = "macos"))]
        assert!(
            boot_id().is_some_and(|id| id.len() == 36),
            "{:?}",
            boot_id()
        );
    }

    #[cfg(target_os = "macos")]
    #[test]
    fn the_macos_region_directory_is_this_users_alone() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(shm_dir()).expect("metadata");
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{:o}",
            meta.permissions().mode()
        );
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    }
}
