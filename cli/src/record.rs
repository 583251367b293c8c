//! `record`: runs a program under libcpuprof.so, then summarises its profile.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// libcpuprof.so: `$CPUPROF_LIB`, else beside this executable (a cargo target directory) or
/// in `../lib` and `../lib/cpuprof` from it (an installed tree).
pub fn find_library() -> Result<PathBuf, String> {
    if let Some(lib) = std::env::var_os("CPUPROF_LIB") {
        let lib = PathBuf::from(lib);
        return if lib.is_file() {
            Ok(lib)
        } else {
            Err(format!("CPUPROF_LIB={} is not a file", lib.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    ["libcpuprof.so", "../lib/libcpuprof.so", "../lib/cpuprof/libcpuprof.so"]
        .iter()
        .map(|rel| dir.join(rel))
        .find(|p| p.is_file())
        .ok_or(format!(
            "cannot find libcpuprof.so beside {} or in ../lib; set CPUPROF_LIB",
            exe.display()
        ))
}

/// How the recorded program ended, as an exit code for `cpuprof record` itself: its own
/// code, or 128 + the signal that killed it (as shells report it).
pub struct Outcome {
    pub code: u8,
    pub killed_by: Option<i32>,
}

/// Runs `command` with the profiler preloaded, writing `output`.
pub fn run(command: &[String], output: &Path, frequency: Option<u32>) -> Result<Outcome, String> {
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
    let status = child
        .spawn()
        .and_then(|mut c| c.wait())
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
        },
        (None, Some(sig)) => Outcome {
            code: (128 + sig) as u8,
            killed_by: Some(sig),
        },
        _ => Outcome {
            code: 1,
            killed_by: None,
        },
    })
}
