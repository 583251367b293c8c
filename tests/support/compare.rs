//! Plain against profiled: a program run without the profiler and then under it in each of
//! several settings (timers, frequencies, unwinders) must behave the same (exit status and
//! output), however hostile it is (tests/hostile*.rs, tests/build_ids.rs). Also the pieces
//! such runs need: resource limits, a hang guard, and a disk that fills.

use super::{lib, scratch_dir};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A program still running after this has hung; it is killed so the test fails instead.
pub const HANG: Duration = Duration::from_secs(120);

/// A resource limit set in the child before exec: the soft limit, and the hard one too if given
/// (else the hard limit stays as it is).
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub resource: libc::__rlimit_resource_t,
    pub soft: u64,
    pub hard: Option<u64>,
}

impl Limit {
    /// Soft limit `value`, hard limit unchanged.
    pub fn soft(resource: libc::__rlimit_resource_t, value: u64) -> Limit {
        Limit {
            resource,
            soft: value,
            hard: None,
        }
    }

    /// Soft and hard limit `value`.
    pub fn both(resource: libc::__rlimit_resource_t, value: u64) -> Limit {
        Limit {
            resource,
            soft: value,
            hard: Some(value),
        }
    }
}

/// A command for `program args` with `env` added and `limits` set.
pub fn command(program: &Path, args: &[&str], env: &[(String, String)], limits: &[Limit]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    if !limits.is_empty() {
        let limits = limits.to_vec();
        // SAFETY: only getrlimit/setrlimit, which are async-signal-safe, run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for l in &limits {
                    let mut limit = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::getrlimit(l.resource, &mut limit);
                    limit.rlim_cur = l.soft;
                    limit.rlim_max = l.hard.unwrap_or(limit.rlim_max);
                    if libc::setrlimit(l.resource, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Runs `cmd` to its end with stdout and stderr captured, killing it after [`HANG`].
pub fn output(mut cmd: Command) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let _guard = HangGuard::watch(&child);
    child.wait_with_output().unwrap()
}

/// [`output`] of [`command`].
pub fn run_program(program: &Path, args: &[&str], env: &[(String, String)], limits: &[Limit]) -> Output {
    output(command(program, args, env, limits))
}

/// Kills `child` if it is still running after [`HANG`]; drop the guard once it has ended.
pub struct HangGuard(Arc<AtomicBool>);

impl HangGuard {
    pub fn watch(child: &Child) -> HangGuard {
        let (done, pid) = (Arc::new(AtomicBool::new(false)), child.id() as i32);
        let flag = done.clone();
        std::thread::spawn(move || {
            let step = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !flag.load(Ordering::Acquire) && waited < HANG {
                std::thread::sleep(step);
                waited += step;
            }
            if !flag.load(Ordering::Acquire) {
                // SAFETY: kills our own child, which has not been reaped (the flag is unset).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        HangGuard(done)
    }
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The environment of a profiled run: LD_PRELOAD=libcpuprof.so, CPUPROFILE=`profile`, then
/// `settings`.
pub fn profiler_env(profile: &Path, settings: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("LD_PRELOAD".to_string(), lib().to_str().unwrap().to_string()),
        ("CPUPROFILE".to_string(), profile.to_str().unwrap().to_string()),
    ];
    env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Asserts that `profiled` behaved as `plain`: the same exit status, the same output.
pub fn assert_same_behaviour(what: &str, plain: &Output, profiled: &Output) {
    assert_eq!(
        profiled.status.to_string(),
        plain.status.to_string(),
        "{what}: exit status; stderr: {}",
        stderr(profiled)
    );
    assert!(
        profiled.stdout == plain.stdout,
        "{what}: output {:?}, without the profiler {:?}; stderr: {}",
        stdout(profiled),
        stdout(plain),
        stderr(profiled)
    );
}

/// One run of a [`PlainVsProfiled`] comparison, as given to its runner.
pub struct Run {
    /// "plain", or the profiled run's values joined by '-' ("perf-4000").
    pub name: String,
    /// What the run is, for messages: "deep with CPUPROFILE_TIMER=perf".
    pub what: String,
    /// The profile's path; `None` for the plain run.
    pub profile: Option<PathBuf>,
    /// The settings of this run (not LD_PRELOAD and CPUPROFILE).
    pub settings: Vec<(String, String)>,
    /// The environment to add: empty for the plain run, else [`profiler_env`].
    pub env: Vec<(String, String)>,
}

impl Run {
    pub fn is_plain(&self) -> bool {
        self.profile.is_none()
    }

    /// The value of `key` in this run's settings.
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// A profiled run that behaved as the plain one.
pub struct Profiled {
    pub run: Run,
    pub profile: PathBuf,
    pub out: Output,
}

/// What [`PlainVsProfiled::run`] ran: the plain run's output and each profiled run.
pub struct Compared {
    pub plain: Output,
    pub profiled: Vec<Profiled>,
}

type SameOutput = Box<dyn Fn(&str, &str) -> bool>;
type ProfileAt = Box<dyn Fn(&str) -> PathBuf>;

/// Runs a program plainly, then under the profiler once per combination of the settings given
/// with [`across`](Self::across) (and every [`with`](Self::with) setting); asserts that each
/// profiled run exits as the plain one did and prints the same (or what
/// [`stdout_same_if`](Self::stdout_same_if) accepts). How to run the program is the caller's:
/// a closure given each [`Run`], whose `env` it adds (see [`run_program`]).
pub struct PlainVsProfiled {
    what: String,
    dir: PathBuf,
    axes: Vec<(String, Vec<String>)>,
    fixed: Vec<(String, String)>,
    plain_succeeds: bool,
    same: Option<SameOutput>,
    profile_at: Option<ProfileAt>,
}

impl PlainVsProfiled {
    /// Profiles go to `dir/<run name>.prof` unless [`profile_at`](Self::profile_at) says.
    pub fn new(what: &str, dir: &Path) -> PlainVsProfiled {
        PlainVsProfiled {
            what: what.to_string(),
            dir: dir.to_path_buf(),
            axes: Vec::new(),
            fixed: Vec::new(),
            plain_succeeds: false,
            same: None,
            profile_at: None,
        }
    }

    /// One profiled run per value of `setting` (an environment variable), for each combination
    /// of the axes given before (the first axis outermost).
    pub fn across(mut self, setting: &str, values: &[&str]) -> Self {
        self.axes
            .push((setting.to_string(), values.iter().map(|v| v.to_string()).collect()));
        self
    }

    /// `setting=value` in every profiled run.
    pub fn with(mut self, setting: &str, value: &str) -> Self {
        self.fixed.push((setting.to_string(), value.to_string()));
        self
    }

    /// The plain run must exit 0.
    pub fn plain_succeeds(mut self) -> Self {
        self.plain_succeeds = true;
        self
    }

    /// Compares the output with `same(plain, profiled)` instead of equality.
    pub fn stdout_same_if(mut self, same: impl Fn(&str, &str) -> bool + 'static) -> Self {
        self.same = Some(Box::new(same));
        self
    }

    /// Where the profile of the run named `name` goes.
    pub fn profile_at(mut self, at: impl Fn(&str) -> PathBuf + 'static) -> Self {
        self.profile_at = Some(Box::new(at));
        self
    }

    /// The profiled runs: (name, settings), in order.
    fn variants(&self) -> Vec<(String, Vec<(String, String)>)> {
        let mut variants = vec![(Vec::<String>::new(), Vec::new())];
        for (setting, values) in &self.axes {
            variants = variants
                .into_iter()
                .flat_map(|(names, settings)| {
                    values.iter().map(move |v| {
                        let mut names = names.clone();
                        names.push(v.clone());
                        let mut settings: Vec<(String, String)> = settings.clone();
                        settings.push((setting.clone(), v.clone()));
                        (names, settings)
                    })
                })
                .collect();
        }
        variants
            .into_iter()
            .map(|(names, mut settings)| {
                settings.extend(self.fixed.iter().cloned());
                let name = if names.is_empty() {
                    "profiled".to_string()
                } else {
                    names.join("-")
                };
                (name, settings)
            })
            .collect()
    }

    pub fn run(self, mut run: impl FnMut(&Run) -> Output) -> Compared {
        let plain_run = Run {
            name: "plain".into(),
            what: format!("{} without the profiler", self.what),
            profile: None,
            settings: Vec::new(),
            env: Vec::new(),
        };
        let plain = run(&plain_run);
        if self.plain_succeeds {
            assert!(plain.status.success(), "{}: {plain:?}", plain_run.what);
        }
        let mut profiled = Vec::new();
        for (name, settings) in self.variants() {
            let profile = match &self.profile_at {
                Some(at) => at(&name),
                None => self.dir.join(format!("{name}.prof")),
            };
            let pairs: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let shown: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let this = Run {
                what: format!("{} with {}", self.what, shown.join(" ")),
                env: profiler_env(&profile, &pairs),
                name,
                profile: Some(profile.clone()),
                settings,
            };
            let out = run(&this);
            match &self.same {
                None => assert_same_behaviour(&this.what, &plain, &out),
                Some(same) => {
                    assert_eq!(
                        out.status.to_string(),
                        plain.status.to_string(),
                        "{}: exit status; stderr: {}",
                        this.what,
                        stderr(&out)
                    );
                    assert!(
                        same(&stdout(&plain), &stdout(&out)),
                        "{}: output {:?}, without the profiler {:?}; stderr: {}",
                        this.what,
                        stdout(&out),
                        stdout(&plain),
                        stderr(&out)
                    );
                }
            }
            profiled.push(Profiled {
                run: this,
                profile,
                out,
            });
        }
        Compared { plain, profiled }
    }
}

/// A disk that fills: a 16 KiB tmpfs mounted on a fresh scratch directory, unmounted when
/// dropped. Needs root (see [`super::require_root`]); `None` when the test is skipped.
pub struct FullDisk {
    dir: PathBuf,
}

impl FullDisk {
    pub fn mount(name: &str) -> Option<FullDisk> {
        if !super::require_root("mounting a small tmpfs") {
            return None;
        }
        let dir = scratch_dir(name);
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
            .arg(&dir)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(FullDisk { dir }),
            Ok(out) => {
                super::skip(&format!("mounting a small tmpfs failed: {}", stderr(&out).trim()));
                None
            }
            Err(e) => {
                super::skip(&format!("mounting a small tmpfs failed: {e}"));
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}
