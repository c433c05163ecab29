//! The memory this process can still take (Linux): the kernel's
//! `MemAvailable`, and the room left under the memory limit of the
//! process's cgroup or of any cgroup above it (a container's limit, which
//! `/proc/meminfo` does not show), whichever is less.

use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit" (cgroup v1 writes one near 2^63).
const NO_LIMIT: u64 = 1 << 60;

/// Bytes available to this process; `None` where nothing can be read (not
/// Linux, or no `/proc`).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_room(&t, Path::new("/sys/fs/cgroup")));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

/// The least room under a memory limit along the process's cgroups (the
/// `/proc/self/cgroup` text) and their ancestors, in the hierarchies
/// mounted under `root`: cgroup v2's `memory.max` less `memory.current`,
/// v1's `memory/…/memory.limit_in_bytes` less `memory.usage_in_bytes`, each
/// usage less the page cache the kernel drops first (`memory.stat`'s
/// `inactive_file`, v1's `total_inactive_file`), as container tools count a
/// working set. `None` where no level has a limit.
fn cgroup_room(self_cgroup: &str, root: &Path) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mount, limit_file, usage_file, cache_key) = if controllers.is_empty() {
            (
                root.to_path_buf(),
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        } else {
            continue;
        };
        let mut rel = PathBuf::from(path.trim_start_matches('/'));
        loop {
            let dir = mount.join(&rel);
            let limit = read_bytes(&dir.join(limit_file)).filter(|&l| l < NO_LIMIT);
            if let (Some(limit), Some(usage)) = (limit, read_bytes(&dir.join(usage_file))) {
                let cache = stat(&dir.join("memory.stat"), cache_key).unwrap_or(0);
                let room = limit.saturating_sub(usage.saturating_sub(cache));
                least = Some(least.map_or(room, |l| l.min(room)));
            }
            if !rel.pop() {
                break;
            }
        }
    }
    least
}

/// The value of `key` in a `memory.stat` file (lines `key value`).
fn stat(file: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A file holding one number (`max` and anything else: `None`).
fn read_bytes(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, file: &str, text: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        if cfg!(target_os = "linux") {
            assert!(available_memory().is_some_and(|b| b > 0), "this machine's");
        }
    }

    /// cgroup v2: the tightest level counts, `max` is no limit.
    #[test]
    fn cgroup_v2_limits_along_the_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        write(root, "box/memory.max", "1000000\n");
        write(root, "box/memory.current", "250000\n");
        write(root, "box/app/memory.max", "max\n");
        write(root, "box/app/memory.current", "200000\n");
        assert_eq!(cgroup_room("0::/box/app\n", root), Some(750_000));
        write(root, "box/app/memory.max", "300000\n");
        assert_eq!(cgroup_room("0::/box/app\n", root), Some(100_000));
        // Page cache the kernel drops first is room.
        write(
            root,
            "box/app/memory.stat",
            "anon 150000\ninactive_file 50000\n",
        );
        assert_eq!(cgroup_room("0::/box/app\n", root), Some(150_000));
        assert_eq!(cgroup_room("0::/\n", root), None, "no limit at the root");
    }

    /// cgroup v1: the `memory` controller's hierarchy; v1's "unlimited" and
    /// other controllers' lines are no limit.
    #[test]
    fn cgroup_v1_memory_controller() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        write(
            root,
            "memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(root, "memory/memory.usage_in_bytes", "6000000000\n");
        write(root, "memory/job/memory.limit_in_bytes", "3000000000\n");
        write(root, "memory/job/memory.usage_in_bytes", "1000000000\n");
        let text = "9:name=systemd:/\n4:memory:/job\n1:cpu:/\n0::/\n";
        assert_eq!(cgroup_room(text, root), Some(2_000_000_000));
        write(
            root,
            "memory/job/memory.stat",
            "inactive_file 5\ntotal_inactive_file 400000000\n",
        );
        assert_eq!(cgroup_room(text, root), Some(2_400_000_000));
        assert_eq!(cgroup_room("4:cpu,memory:/\n", root), None);
        assert_eq!(cgroup_room("garbage\n", root), None);
    }
}
