//! Whether the kernel serves FUSE over io_uring to a mount made now, and if not, why: one
//! line that names the switch. Read before mounting: a mount that asks for the transport at
//! INIT must then register its ring entries, or its requests wait forever.

use std::path::Path;

/// The module parameter that turns the transport on (root may write 1 to it).
pub const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// Why FUSE over io_uring is not on offer.
#[derive(Debug, PartialEq, Eq)]
pub enum NotOffered {
    /// The kernel has no such transport (before Linux 6.14, or built without it).
    Kernel,
    /// The kernel has it, switched off.
    Off,
    /// io_uring itself is disabled (`kernel.io_uring_disabled`).
    IoUringDisabled(String),
}

impl std::fmt::Display for NotOffered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOffered::Kernel => write!(f, "this kernel has no FUSE over io_uring (Linux 6.14+ built with CONFIG_FUSE_IO_URING; {SWITCH} is missing); use --fuse-transport dev"),
            NotOffered::Off => write!(f, "FUSE over io_uring is switched off: as root, echo 1 > {SWITCH} before mounting, or use --fuse-transport dev"),
            NotOffered::IoUringDisabled(v) => write!(f, "io_uring is disabled (kernel.io_uring_disabled = {v}): set it to 0, or use --fuse-transport dev"),
        }
    }
}

/// Whether a mount made now is offered the transport.
pub fn offered() -> Result<(), NotOffered> {
    offered_in(Path::new("/"))
}

/// [`offered`], reading the files under `root` (tests).
pub fn offered_in(root: &Path) -> Result<(), NotOffered> {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let switch = std::fs::read_to_string(at(SWITCH)).map_err(|_| NotOffered::Kernel)?;
    if !matches!(switch.trim(), "Y" | "y" | "1") {
        return Err(NotOffered::Off);
    }
    // Absent before Linux 6.6: io_uring is then allowed.
    if let Ok(v) = std::fs::read_to_string(at(IO_URING_DISABLED)) {
        if v.trim() != "0" {
            return Err(NotOffered::IoUringDisabled(v.trim().to_string()));
        }
    }
    Ok(())
}

/// The kernel's FUSE queues: one per possible CPU.
pub fn queues() -> usize {
    std::fs::read_to_string(POSSIBLE_CPUS)
        .ok()
        .and_then(|s| count_cpus(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The CPUs of a list such as `0-3,8,10-11` (the highest plus one: queue ids are CPU ids).
fn count_cpus(list: &str) -> Option<usize> {
    let mut top = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<usize>().ok()?;
        top = top.max(Some(last));
    }
    top.map(|t| t + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(switch: Option<&str>, disabled: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        let put = |p: &str, v: &str| {
            let p = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, v).expect("write");
        };
        if let Some(v) = switch {
            put(SWITCH, v);
        }
        if let Some(v) = disabled {
            put(IO_URING_DISABLED, v);
        }
        d
    }

    #[test]
    fn the_switch_and_io_uring_decide() {
        let off = root_with(Some("N\n"), Some("0\n"));
        assert_eq!(offered_in(off.path()), Err(NotOffered::Off));
        let on = root_with(Some("Y\n"), Some("0\n"));
        assert_eq!(offered_in(on.path()), Ok(()));
        let none = root_with(None, None);
        assert_eq!(offered_in(none.path()), Err(NotOffered::Kernel));
        let disabled = root_with(Some("Y\n"), Some("2\n"));
        assert_eq!(
            offered_in(disabled.path()),
            Err(NotOffered::IoUringDisabled("2".into()))
        );
        for e in [NotOffered::Kernel, NotOffered::Off] {
            let line = e.to_string();
            assert!(line.contains(SWITCH) && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn queues_are_counted_by_the_highest_cpu() {
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0-3,8,10-11"), Some(12));
        assert_eq!(count_cpus("x"), None);
    }
}
