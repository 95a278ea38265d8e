//! Starting a container's process: its own session (process group), a private mount namespace
//! (and UTS namespace, hostname = pod name) in which every prepared volume is bind-mounted at its
//! `mountPath` (the root itself remounted read-only for `readOnlyRootFilesystem`), then
//! setgid/setgroups/setuid and `PR_SET_PDEATHSIG` so it dies with the kubelet.
//! All of this happens in `pre_exec`, between fork and exec, using raw syscalls only on data
//! prepared before the fork.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// A bind mount inside the pod's mount namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

#[derive(Clone, Debug)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    pub mounts: Vec<Mount>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
    pub hostname: String,
    /// `securityContext.readOnlyRootFilesystem`: `/` is read-only in the pod's mount namespace
    /// (volumes, /proc and /dev stay as they are).
    pub read_only_root: bool,
}

struct PreparedMount {
    mkdirs: Vec<CString>,
    /// create an empty file at the target (mounting a file)
    touch: bool,
    source: CString,
    target: CString,
    read_only: bool,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The directories to create (outermost first) so that `target` can be a mount point.
fn ancestors(target: &Path, include_self: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut cur = PathBuf::new();
    let comps: Vec<Component> = target.components().collect();
    let n = comps.len();
    for (i, c) in comps.into_iter().enumerate() {
        cur.push(c);
        if matches!(c, Component::RootDir) {
            continue;
        }
        if i + 1 < n || include_self {
            out.push(cur.clone());
        }
    }
    out
}

/// Mounts ordered so that a parent directory is mounted before what is mounted inside it.
pub fn order_mounts(mut mounts: Vec<Mount>) -> Vec<Mount> {
    mounts.sort_by_key(|m| m.target.components().count());
    mounts
}

fn os_err(what: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Starts the process with stdout and stderr appended to `log`.
pub fn spawn(l: &Launch, log: &File) -> io::Result<Child> {
    let mut prepared = Vec::new();
    for m in order_mounts(l.mounts.clone()) {
        let is_file = m.source.is_file();
        prepared.push(PreparedMount {
            mkdirs: ancestors(&m.target, !is_file)
                .iter()
                .map(|p| cstr(p))
                .collect::<io::Result<_>>()?,
            touch: is_file,
            source: cstr(&m.source)?,
            target: cstr(&m.target)?,
            read_only: m.read_only,
        });
    }
    let hostname: Vec<u8> = l.hostname.bytes().take(63).collect();
    let uid = l.uid;
    let gid = l.gid;
    let groups: Vec<libc::gid_t> = l.groups.clone();
    let read_only_root = l.read_only_root;
    let parent = std::process::id() as libc::pid_t;

    let mut cmd = Command::new(&l.program);
    cmd.args(&l.args)
        .env_clear()
        .envs(l.env.iter().map(|(k, v)| (k, v)))
        .current_dir(l.working_dir.as_deref().unwrap_or(Path::new("/")))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log.try_clone()?))
        .kill_on_drop(false);
    // SAFETY: the closure only issues syscalls on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(os_err("setsid"));
            }
            if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS) != 0 {
                return Err(os_err("unshare(CLONE_NEWNS|CLONE_NEWUTS)"));
            }
            // nothing mounted here may propagate back to the host
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(os_err("mount --make-rprivate /"));
            }
            if !hostname.is_empty()
                && libc::sethostname(hostname.as_ptr().cast(), hostname.len()) != 0
            {
                return Err(os_err("sethostname"));
            }
            for m in &prepared {
                for d in &m.mkdirs {
                    libc::mkdir(d.as_ptr(), 0o755);
                }
                if m.touch {
                    let fd = libc::open(
                        m.target.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                    }
                }
                if libc::mount(
                    m.source.as_ptr(),
                    m.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(os_err("bind mount of a volume"));
                }
                if m.read_only
                    && libc::mount(
                        std::ptr::null(),
                        m.target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(os_err("read-only remount of a volume"));
                }
            }
            // Only this namespace's copy of the root mount; the mounts on top keep their flags.
            if read_only_root
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                ) != 0
            {
                return Err(os_err("read-only remount of the root filesystem"));
            }
            if let Some(gid) = gid {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    return Err(os_err("setgroups"));
                }
                if libc::setgid(gid) != 0 {
                    return Err(os_err("setgid"));
                }
            }
            if let Some(uid) = uid
                && libc::setuid(uid) != 0
            {
                return Err(os_err("setuid"));
            }
            // after the credential change, which clears it
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(os_err("prctl(PR_SET_PDEATHSIG)"));
            }
            if libc::getppid() != parent {
                return Err(io::Error::other("the fake kubelet exited"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `sig` to the process group led by `pid` (the container's session).
pub fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
    }
}

/// The start time of a process (field 22 of /proc/PID/stat), to recognise it after pid reuse.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// (process group, start time) of a process, from /proc/PID/stat.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some((after.get(2)?.parse().ok()?, after.get(19)?.parse().ok()?))
}

/// Whether a process of group `pgid` started at or after `since` still exists (the leader may
/// be gone while what it started lives on).
fn group_alive(pgid: u32, since: u64) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .any(|pid| stat(pid).is_some_and(|(g, t)| g == pgid && t >= since))
}

/// Records running container process groups under `dir` (one file per group leader holding its
/// start time), so that a later fake kubelet can kill what a crashed one left behind.
#[derive(Clone, Debug)]
pub struct GroupRegistry {
    dir: PathBuf,
}

impl GroupRegistry {
    pub fn new(dir: PathBuf) -> io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    pub fn add(&self, pid: u32) {
        if let Some(t) = start_time(pid) {
            let _ = std::fs::write(self.dir.join(pid.to_string()), t.to_string());
        }
    }

    pub fn remove(&self, pid: u32) {
        let _ = std::fs::remove_file(self.dir.join(pid.to_string()));
    }

    /// Kills the recorded groups whose leader is still the same process; returns how many.
    pub fn kill_leftovers(&self) -> usize {
        let mut n = 0;
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let recorded = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let (Ok(pid), Some(since)) = (name.parse::<u32>(), recorded)
                && group_alive(pid, since)
            {
                signal_group(pid, libc::SIGKILL);
                n += 1;
            }
            let _ = std::fs::remove_file(e.path());
        }
        n
    }
}

/// Exit code as the container runtime reports it: the code, or 128+signal.
pub fn exit_code(status: std::process::ExitStatus) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        _ => (255, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self() {
        let me = std::process::id();
        let t = start_time(me).unwrap();
        assert!(start_time(u32::MAX).is_none());
        // SAFETY: plain syscall
        let pgid = unsafe { libc::getpgrp() } as u32;
        assert!(group_alive(pgid, t));
        assert!(!group_alive(pgid, u64::MAX));
    }

    #[test]
    fn ancestors_of_targets() {
        assert_eq!(
            ancestors(Path::new("/var/lib/larch/state"), true),
            vec![
                PathBuf::from("/var"),
                PathBuf::from("/var/lib"),
                PathBuf::from("/var/lib/larch"),
                PathBuf::from("/var/lib/larch/state")
            ]
        );
        assert_eq!(
            ancestors(Path::new("/dev/termination-log"), false),
            vec![PathBuf::from("/dev")]
        );
    }

    /// A process with `read_only_root` cannot write to `/` but can to its volumes, and the host's
    /// root stays writable (needs root, as the kubelet itself).
    #[tokio::test]
    async fn read_only_root_filesystem() {
        let tmp = std::env::temp_dir().join(format!("fake-kubelet-ro-{}", std::process::id()));
        let vol = tmp.join("vol");
        let target = tmp.join("pod/data");
        std::fs::create_dir_all(&vol).unwrap();
        let script = format!(
            "touch {tmp}/probe 2>/dev/null && echo root-writable || echo root-read-only; touch {t}/ok && echo volume-writable",
            tmp = tmp.display(),
            t = target.display()
        );
        for (read_only_root, want) in [(true, "root-read-only"), (false, "root-writable")] {
            let log_path = tmp.join(format!("log-{read_only_root}"));
            let log = File::create(&log_path).unwrap();
            let launch = Launch {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.clone()],
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                working_dir: None,
                mounts: vec![Mount {
                    source: vol.clone(),
                    target: target.clone(),
                    read_only: false,
                }],
                uid: None,
                gid: None,
                groups: vec![],
                hostname: "ro-test".into(),
                read_only_root,
            };
            let status = spawn(&launch, &log).unwrap().wait().await.unwrap();
            assert!(status.success());
            let out = std::fs::read_to_string(&log_path).unwrap();
            assert_eq!(
                out,
                format!("{want}\nvolume-writable\n"),
                "read_only_root={read_only_root}"
            );
            assert!(vol.join("ok").exists());
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn parents_mount_first() {
        let m = |t: &str| Mount {
            source: "/s".into(),
            target: t.into(),
            read_only: false,
        };
        let ordered = order_mounts(vec![m("/etc/larch/conf.d"), m("/tmp"), m("/etc/larch")]);
        let targets: Vec<_> = ordered.iter().map(|m| m.target.to_str().unwrap()).collect();
        assert_eq!(targets, vec!["/tmp", "/etc/larch", "/etc/larch/conf.d"]);
    }
}
