//! Starting and stopping from the environment, as gperftools does when its library is loaded:
//! `CPUPROFILE`, `CPUPROFILE_USE_PID` and `CPUPROFILESIGNAL` (the timer options are read by
//! [`Options::from_env`]).

use super::options::WallBeside;
use super::{global, Options};
use crate::in_program::fd::{identity, GuardedFd};
use crate::in_program::messages;
use crate::sampler::signals;
use crate::writer::epochs::EpochOptions;
use std::ffi::{c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Where the profile goes, if the environment asks for one. `None` when `CPUPROFILE` is unset
/// or empty, and in setuid/setgid programs, which must not write files an unprivileged user
/// chose.
pub fn profile_path_from_env(var: impl Fn(&str) -> Option<String>, privileged: bool) -> Option<PathBuf> {
    path_from_env("CPUPROFILE", var, privileged)
}

/// Where the wall-clock profile goes: `CPUPROFILE_WALL`, by the rules of `CPUPROFILE`.
pub fn wall_path_from_env(var: impl Fn(&str) -> Option<String>, privileged: bool) -> Option<PathBuf> {
    path_from_env("CPUPROFILE_WALL", var, privileged)
}

fn path_from_env(name: &str, var: impl Fn(&str) -> Option<String>, privileged: bool) -> Option<PathBuf> {
    let base = var(name).filter(|p| !p.is_empty())?;
    if privileged {
        return None;
    }
    Some(match var("CPUPROFILE_USE_PID") {
        Some(_) => PathBuf::from(format!("{}_{}", base, std::process::id())),
        None => PathBuf::from(base),
    })
}

/// Whether the process runs with privileges its invoker does not have.
pub fn is_privileged() -> bool {
    // SAFETY: plain queries of process credentials.
    unsafe {
        libc::getauxval(libc::AT_SECURE) != 0 || libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid()
    }
}

/// The profile database of epoch mode, if `CPUPROFILE_DB` names one (never for setuid/setgid
/// programs, as for `CPUPROFILE`).
pub fn database_from_env(var: impl Fn(&str) -> Option<String>, privileged: bool) -> Option<PathBuf> {
    let dir = var("CPUPROFILE_DB").filter(|p| !p.is_empty())?;
    (!privileged).then(|| PathBuf::from(dir))
}

/// Called when the library is loaded: starts profiling, or arms the toggle signal.
/// `CPUPROFILE_DB` (epoch mode) takes precedence over `CPUPROFILE`: every process of a
/// program tree it is inherited by writes its own files into the database.
pub fn start_from_environment() {
    let var = |k: &str| std::env::var(k).ok();
    let unnamed_root = var(messages::ROOT_PID_VARIABLE).is_none();
    if let Some(db) = database_from_env(var, is_privileged()) {
        if unnamed_root {
            name_root();
        }
        let mut options = Options::from_env(var);
        options.epochs = Some(EpochOptions::from_env(var));
        if let Err(e) = global::start(&db, options) {
            crate::say!("cpuprof: {e}; the program continues without profiling");
        }
        return;
    }
    // Read before the environment is changed below: bash replaces getenv/setenv with its own,
    // and once its setenv has run, its getenv finds none of the variables not yet imported
    // (every CPUPROFILE_* option was ignored in bash).
    let Some((path, options)) = profiles_from_env(var, is_privileged()) else {
        // An endpoint alone (`CPUPROF_HTTP`) makes a process tree too: only its first process
        // speaks (`http`'s takeover messages of the processes it runs stay quiet).
        if unnamed_root && var("CPUPROF_HTTP").is_some_and(|v| !v.trim().is_empty()) {
            name_root();
        }
        return;
    };
    let toggle = var("CPUPROFILESIGNAL");
    // Programs this one execs inherit the environment (and LD_PRELOAD): they must write their
    // own `_<pid>` file rather than truncate ours, and keep quiet (`in_program::messages`).
    if var("CPUPROFILE_USE_PID").is_none() {
        // Only when absent: glibc's setenv replaces the entry even with the same value, and
        // Chromium sets its process titles only over an environment still laid out as the
        // kernel left it.
        std::env::set_var("CPUPROFILE_USE_PID", "1");
    }
    if unnamed_root {
        name_root();
    }
    match toggle {
        Some(sig) => match sig.trim().parse::<c_int>() {
            Ok(signal) => arm_toggle_signal(signal, path, options),
            Err(_) => crate::say!("cpuprof: CPUPROFILESIGNAL={sig:?} is not a signal number; not profiling"),
        },
        None => {
            if let Err(e) = global::start(&path, options) {
                crate::say!("cpuprof: {e}; the program continues without profiling");
            }
        }
    }
}

/// Names this process, for the processes it execs, as the one started under the profiler.
fn name_root() {
    std::env::set_var(messages::ROOT_PID_VARIABLE, std::process::id().to_string());
}

/// The profile to take from `CPUPROFILE` and `CPUPROFILE_WALL`: a CPU profile, a wall-clock
/// profile of every thread at `CPUPROFILE_WALL_FREQUENCY` (default 100) samples per second, or
/// both in one run (the wall profile beside the CPU one). The path and the options.
fn profiles_from_env(var: impl Fn(&str) -> Option<String>, privileged: bool) -> Option<(PathBuf, Options)> {
    let wall = wall_path_from_env(&var, privileged);
    let cpu = profile_path_from_env(&var, privileged);
    let mut options = Options::from_env(&var);
    let wall_frequency = var("CPUPROFILE_WALL_FREQUENCY").map_or(super::options::DEFAULT_FREQUENCY, |hz| {
        super::options::parse_frequency(&hz).min(super::options::MAX_WALL_FREQUENCY)
    });
    match (cpu, wall) {
        (None, None) => None,
        (Some(cpu), None) => Some((cpu, options)),
        (None, Some(wall)) => {
            options.wall = true;
            options.frequency = wall_frequency;
            Some((wall, options))
        }
        (Some(cpu), Some(wall)) => {
            options.wall_beside = Some(WallBeside {
                path: wall,
                frequency: wall_frequency,
            });
            Some((cpu, options))
        }
    }
}

/// Called at exit: stops a running profile and writes it.
pub fn stop_at_exit() {
    super::children::process_is_ending();
    match global::stop_any() {
        Ok(_) | Err(crate::Error::NotRunning) | Err(crate::Error::ForkedChild { .. }) => {}
        Err(e) => crate::say!("cpuprof: {e}"),
    }
}

/// Write end of the pipe from the toggle signal handler to the toggle thread, and its
/// identity: the handler writes only while the number still refers to our pipe.
static TOGGLE_PIPE: AtomicI32 = AtomicI32::new(-1);
static TOGGLE_DEV: AtomicU64 = AtomicU64::new(0);
static TOGGLE_INO: AtomicU64 = AtomicU64::new(0);

/// Each delivery of `signal` toggles profiling; the n-th profile goes to `path.n`. Start and
/// stop happen on a dedicated thread, never in the handler, which only writes one byte.
fn arm_toggle_signal(signal: c_int, path: PathBuf, mut options: Options) {
    // The toggle thread is this process's: a forked child could never stop a profile of its own.
    options.follow_forks = false;
    let Some((read_end, write_end)) = toggle_pipe() else {
        crate::say!(
            "cpuprof: cannot create the CPUPROFILESIGNAL pipe: {}",
            std::io::Error::last_os_error()
        );
        return;
    };
    let (dev, ino) = write_end.recorded_identity();
    TOGGLE_DEV.store(dev, Ordering::Relaxed);
    TOGGLE_INO.store(ino, Ordering::Relaxed);
    TOGGLE_PIPE.store(write_end.raw(), Ordering::Release);
    // The handler may write to it for the rest of the process's life.
    write_end.abandon();
    if let Err(e) = signals::install(signal, on_toggle_signal) {
        crate::say!("cpuprof: CPUPROFILESIGNAL: {e}; not profiling");
        return;
    }
    let builder = std::thread::Builder::new().name("cpuprof-toggle".into());
    let spawned = crate::in_program::thread::spawn_signal_free(builder, move || {
        let mut next = 0u64;
        let mut byte = 0u8;
        loop {
            if !read_end.is_still_ours() {
                crate::say!(
                    "cpuprof: CPUPROFILESIGNAL: {}; the signal no longer toggles profiling",
                    read_end.taken_error()
                );
                read_end.abandon();
                return;
            }
            // SAFETY: reads one byte into a local from our own (just checked) pipe.
            match unsafe { libc::read(read_end.raw(), &mut byte as *mut u8 as *mut c_void, 1) } {
                1 => {}
                n if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => continue,
                _ => {
                    // End of file: the program closed the write end (close_range and the like).
                    crate::say!("cpuprof: CPUPROFILESIGNAL: the program closed cpuprof's pipe; the signal no longer toggles profiling");
                    return;
                }
            }
            if global::info().is_some() {
                stop_at_exit();
            } else {
                let file = PathBuf::from(format!("{}.{}", path.display(), next));
                let mut options = options.clone();
                if let Some(beside) = &mut options.wall_beside {
                    beside.path = PathBuf::from(format!("{}.{}", beside.path.display(), next));
                }
                next += 1;
                if let Err(e) = global::start(&file, options) {
                    crate::say!("cpuprof: {e}");
                }
            }
        }
    });
    if let Err(e) = spawned {
        crate::say!("cpuprof: cannot start the CPUPROFILESIGNAL thread: {e}");
    }
}

/// In a forked child: the toggle thread is the parent's, and a toggle signal delivered here
/// must not write into the parent's pipe (it would toggle the parent's profile).
pub fn forget_in_child() {
    TOGGLE_PIPE.store(-1, Ordering::Release);
}

/// The toggle pipe's (read, write) ends, at high numbers.
fn toggle_pipe() -> Option<(GuardedFd, GuardedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which are ours.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both were just created by pipe2 and are owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Some((
        GuardedFd::adopt(r, "the CPUPROFILESIGNAL pipe").ok()?,
        GuardedFd::adopt(w, "the CPUPROFILESIGNAL pipe").ok()?,
    ))
}

unsafe extern "C" fn on_toggle_signal(_sig: c_int, _info: *mut libc::siginfo_t, _uc: *mut c_void) {
    // SAFETY: fstat (in `identity`) and write(2) are async-signal-safe; errno is restored for
    // the interrupted code.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let fd = TOGGLE_PIPE.load(Ordering::Acquire);
        let ours = (TOGGLE_DEV.load(Ordering::Relaxed), TOGGLE_INO.load(Ordering::Relaxed));
        if fd >= 0 && identity(fd) == Some(ours) {
            libc::write(fd, b"t".as_ptr() as *const c_void, 1);
        }
        *errno = saved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules_follow_gperftools() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(profile_path_from_env(env(&[]), false), None);
        assert_eq!(profile_path_from_env(env(&[("CPUPROFILE", "")]), false), None);
        assert_eq!(
            profile_path_from_env(env(&[("CPUPROFILE", "/tmp/x")]), false),
            Some("/tmp/x".into())
        );
        assert_eq!(profile_path_from_env(env(&[("CPUPROFILE", "/tmp/x")]), true), None);
        let with_pid = profile_path_from_env(env(&[("CPUPROFILE", "/tmp/x"), ("CPUPROFILE_USE_PID", "")]), false);
        assert_eq!(with_pid, Some(format!("/tmp/x_{}", std::process::id()).into()));
    }

    #[test]
    fn cpu_and_wall_variables_give_one_profile_or_both() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(profiles_from_env(env(&[]), false).is_none());
        let (path, o) = profiles_from_env(
            env(&[("CPUPROFILE_WALL", "/w"), ("CPUPROFILE_WALL_FREQUENCY", "5000")]),
            false,
        )
        .unwrap();
        assert_eq!((path, o.wall, o.frequency), ("/w".into(), true, 1000));
        let both = &[
            ("CPUPROFILE", "/c"),
            ("CPUPROFILE_FREQUENCY", "250"),
            ("CPUPROFILE_WALL", "/w"),
        ];
        let (path, o) = profiles_from_env(env(both), false).unwrap();
        assert_eq!((path, o.wall, o.frequency), ("/c".into(), false, 250));
        assert_eq!(
            o.wall_beside,
            Some(WallBeside {
                path: "/w".into(),
                frequency: 100
            })
        );
        assert!(
            profiles_from_env(env(both), true).is_none(),
            "never for setuid programs"
        );
    }
}
