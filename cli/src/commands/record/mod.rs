//! `record`: runs a program under libcpuprof.so, then summarises the profiles of every
//! process it started: the program writes the profile's path, and each process that execs
//! with the profiler preloaded writes `<path>_<pid>` (libcpuprof.so sets `CPUPROFILE_USE_PID`
//! for them), so a compiler driver's `cc1plus` and `as` are reported too.
//!
//! Each profile's `# process` line (cpuprof::format::process) says which process wrote it:
//! the command's own process is named as the user named it (`redis-server`, not the file the
//! symlink leads to), the others by `argv[0]`, and the processes of one executable are merged
//! into one report, split by their Chromium-style `--type=`.

use crate::error::{Error, Result};
mod summary;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// libcpuprof.so: `$CPUPROF_LIB`, else beside this executable (a cargo target directory) or
/// in `../lib` and `../lib/cpuprof` from it (an installed tree).
pub fn find_library() -> Result<PathBuf> {
    if let Some(lib) = std::env::var_os("CPUPROF_LIB") {
        let lib = PathBuf::from(lib);
        return if lib.is_file() {
            Ok(lib)
        } else {
            Err(format!("CPUPROF_LIB={} is not a file", lib.display()).into())
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    ["libcpuprof.so", "../lib/libcpuprof.so", "../lib/cpuprof/libcpuprof.so"]
        .iter()
        .map(|rel| dir.join(rel))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Input(format!(
                "cannot find libcpuprof.so beside {} or in ../lib; set CPUPROF_LIB",
                exe.display()
            ))
        })
}

/// How the recorded program ended, as an exit code for `cpuprof record` itself: its own
/// code, or 128 + the signal that killed it (as shells report it).
pub struct Outcome {
    pub code: u8,
    pub killed_by: Option<i32>,
    /// The process started (the first to write the profile).
    pub pid: u32,
}

/// Runs `command` with the profiler preloaded, writing `output`.
fn run(command: &[String], output: &Path, frequency: Option<u32>) -> Result<Outcome> {
    let library = find_library()?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{} {existing}", library.display()),
        _ => library.display().to_string(),
    };
    let mut child = Command::new(&command[0]);
    child
        .args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env("CPUPROFILE", output);
    if let Some(hz) = frequency {
        child.env("CPUPROFILE_FREQUENCY", hz.to_string());
    }
    // Ctrl-C and Ctrl-\ are for the program: it is in our process group and gets them too;
    // we wait for it to finish and then report.
    // SAFETY: setting dispositions to SIG_IGN and back; no handler runs.
    let old = unsafe {
        [
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        ]
    };
    let mut pid = 0;
    let status = child
        .spawn()
        .and_then(|mut c| {
            pid = c.id();
            c.wait()
        })
        .map_err(|e| format!("cannot run {}: {e}", command[0]));
    // SAFETY: restores the dispositions saved above.
    unsafe {
        libc::signal(libc::SIGINT, old[0]);
        libc::signal(libc::SIGQUIT, old[1]);
    }
    let status = status?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => Outcome {
            code: code as u8,
            killed_by: None,
            pid,
        },
        (None, Some(sig)) => Outcome {
            code: (128 + sig) as u8,
            killed_by: Some(sig),
            pid,
        },
        _ => Outcome {
            code: 1,
            killed_by: None,
            pid,
        },
    })
}

/// What was on disk under a profile's name before the run, so that only the files this run
/// wrote are reported (file times are too coarse to compare with the clock).
pub struct Before(HashMap<PathBuf, (u64, u64, i64, i64)>);

impl Before {
    pub fn snapshot(output: &Path) -> Before {
        Before(
            written_candidates(output)
                .into_iter()
                .filter_map(|(path, _)| Some((path.clone(), identity(&path)?)))
                .collect(),
        )
    }

    /// The profiles this run wrote: `output` (pid `first_pid`) and `output_<pid>` of each
    /// process that exec'd with the profiler preloaded, in pid order after the first.
    pub fn written(&self, output: &Path, first_pid: u32) -> Vec<(PathBuf, u32)> {
        let mut out: Vec<(PathBuf, u32)> = written_candidates(output)
            .into_iter()
            .map(|(path, pid)| (path, pid.unwrap_or(first_pid)))
            .filter(|(path, _)| identity(path).is_some_and(|id| self.0.get(path) != Some(&id)))
            .collect();
        out.sort_by_key(|&(_, pid)| (pid != first_pid, pid));
        out
    }
}

/// Inode, size and modification time: any write changes one of them.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    let m = std::fs::metadata(path).ok()?;
    m.is_file().then(|| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// `output` itself and every `output_<pid>` beside it, with the pid.
fn written_candidates(output: &Path) -> Vec<(PathBuf, Option<u32>)> {
    let mut out = vec![(output.to_path_buf(), None)];
    let dir = output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(prefix) = output.file_name().and_then(|n| n.to_str()).map(|n| format!("{n}_")) else {
        return out;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse().ok())
        else {
            continue;
        };
        out.push((output.with_file_name(&name), Some(pid)));
    }
    out
}

/// How `record` reports the processes it followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MergeMode {
    /// One report per program; the processes of one program (the same executable file, and
    /// the same Chromium-style `--type`) merged.
    Auto,
    /// Every process in one report.
    All,
    /// One report per process.
    None,
}

/// `cpuprof record`: runs the program with the library preloaded, then reports what it wrote.
pub fn record(a: crate::args::RecordArgs) -> Result<u8> {
    let before = Before::snapshot(&a.output);
    let outcome = run(&a.command, &a.output, a.frequency)?;
    if let Some(sig) = outcome.killed_by {
        eprintln!("cpuprof: the program was killed by signal {sig}; its profile ends where it was killed");
    }
    summary::summarise(
        &before.written(&a.output, outcome.pid),
        &a.command,
        a.count,
        a.merge,
        a.html,
    );
    Ok(outcome.code)
}
