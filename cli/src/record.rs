//! `record`: runs a program under libcpuprof.so, then summarises the profiles of every
//! process it started: the program writes the profile's path, and each process that execs
//! with the profiler preloaded writes `<path>_<pid>` (libcpuprof.so sets `CPUPROFILE_USE_PID`
//! for them), so a compiler driver's `cc1plus` and `as` are reported too.

use crate::stacks::Stacks;
use crate::symbolize::Locator;
use cpuprof::format::Profile;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
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
    /// The process started (the first to write the profile).
    pub pid: u32,
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
    /// One report per program; the processes of one program (the same executable file) merged.
    Auto,
    /// Every process in one report.
    All,
    /// One report per process.
    None,
}

/// One profile the run wrote, read.
struct Written {
    path: PathBuf,
    pid: u32,
    /// The executable (path, inode) from the maps; `None` when the file has no maps.
    program: Option<(String, u64)>,
    profile: Profile,
}

/// Prints, on stderr (stdout is the program's), one line per profile written (program, pid,
/// samples) and then the top functions of each program, or of each process, or of all.
/// Prints the summary of the profiles written and a report per group of them (as
/// `merge_mode` groups them), and with `html` writes each report's page beside its profile.
pub fn summarise(files: &[(PathBuf, u32)], command: &[String], count: usize, merge_mode: MergeMode, html: bool) {
    if files.is_empty() {
        eprintln!("cpuprof: no profile was written");
        return;
    }
    let first_program = resolve(&command[0]);
    let mut written = Vec::new();
    for (i, (path, pid)) in files.iter().enumerate() {
        // The first process is the command itself: its executable places a profile cut short.
        let locator = Locator {
            binaries: if i == 0 {
                first_program.clone().into_iter().collect()
            } else {
                Vec::new()
            },
            ..Locator::default()
        };
        let Ok(bytes) = std::fs::read(path) else { continue };
        match crate::cut_short::read(path, &bytes, &locator) {
            Ok(profile) => {
                let program = profile
                    .maps
                    .entries
                    .iter()
                    .find(|e| e.path.starts_with('/'))
                    .map(|e| (e.path.clone(), e.inode));
                written.push(Written {
                    path: path.clone(),
                    pid: *pid,
                    program,
                    profile,
                });
            }
            Err(e) => eprintln!("cpuprof: {e}"),
        }
    }
    eprintln!("cpuprof: {} profiles written:", written.len());
    let width = written
        .iter()
        .map(|w| w.path.display().to_string().len())
        .max()
        .unwrap_or(0);
    for w in &written {
        let program = w
            .program
            .as_ref()
            .map_or("(program unknown: the file has no maps)", |p| p.0.as_str());
        eprintln!(
            "  {:<width$}  pid {:<7} {:>8} samples  {program}",
            w.path.display().to_string(),
            w.pid,
            w.profile.total_samples()
        );
    }
    // Groups of indices into `written`, each one report.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    match merge_mode {
        MergeMode::All => groups.push((0..written.len()).collect()),
        MergeMode::None => groups.extend((0..written.len()).map(|i| vec![i])),
        MergeMode::Auto => {
            let mut by_program: HashMap<&(String, u64), usize> = HashMap::new();
            for (i, w) in written.iter().enumerate() {
                match &w.program {
                    Some(p) => match by_program.get(p) {
                        Some(&g) => groups[g].push(i),
                        None => {
                            by_program.insert(p, groups.len());
                            groups.push(vec![i]);
                        }
                    },
                    None => groups.push(vec![i]),
                }
            }
        }
    }
    let total = |g: &[usize]| -> u64 { g.iter().map(|&i| written[i].profile.total_samples()).sum() };
    groups.retain(|g| total(g) > 0);
    groups.sort_by_key(|g| std::cmp::Reverse(total(g)));
    for group in &groups {
        report_group(&written, group, count, html);
    }
}

fn report_group(written: &[Written], group: &[usize], count: usize, html: bool) {
    let first = &written[group[0]];
    let name = match (
        &first.program,
        group.iter().all(|&i| written[i].program == first.program),
    ) {
        (Some(p), true) => p.0.clone(),
        _ => "every process".to_string(),
    };
    // The report's profile, and its bytes for the page.
    let profile = if group.len() == 1 {
        std::fs::read(&first.path)
            .ok()
            .map(|bytes| (first.profile.clone(), bytes))
    } else {
        let named: Vec<(String, Profile)> = group
            .iter()
            .map(|&i| (written[i].path.display().to_string(), written[i].profile.clone()))
            .collect();
        match crate::merge::merge(&named)
            .and_then(|(bytes, _)| Profile::parse(&bytes).map(|p| (p, bytes)).map_err(|e| e.to_string()))
        {
            Ok(merged) => {
                let files: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
                eprintln!(
                    "\ncpuprof: {name}: {} processes merged (write it with: cpuprof merge -o merged.prof {})",
                    group.len(),
                    files.join(" ")
                );
                Some(merged)
            }
            Err(e) => {
                eprintln!(
                    "\ncpuprof: {name}: the {} processes cannot be merged ({e}); reported one by one",
                    group.len()
                );
                for &i in group {
                    report_group(written, &[i], count, html);
                }
                None
            }
        }
    };
    let Some((profile, bytes)) = profile else { return };
    if group.len() == 1 {
        eprintln!("\ncpuprof: {name}, pid {} ({}):", first.pid, first.path.display());
    }
    let stacks = Stacks::symbolise(&profile, &Locator::default());
    eprint!("{}", crate::report::top(&stacks.functions(), false, count));
    if html {
        let title = if group.len() == 1 {
            format!("{name}, pid {} ({})", first.pid, first.path.display())
        } else {
            format!("{name}, {} processes merged", group.len())
        };
        write_page(&first.path, &bytes, title);
    }
}

/// The report's page beside `profile` (the first of a merged group); a failure is reported,
/// the text report stands.
fn write_page(profile: &Path, bytes: &[u8], title: String) {
    let (locator, filters) = (Locator::default(), crate::filters::Filters::default());
    let opts = crate::html::Options {
        locator: &locator,
        filters: &filters,
        tick_us: crate::local_tick_us(),
        title,
    };
    let output = crate::html::beside(profile);
    let written = crate::html::page(profile, bytes, &crate::html::Baseline::None, &opts)
        .and_then(|page| std::fs::write(&output, page).map_err(|e| format!("cannot write {}: {e}", output.display())));
    match written {
        Ok(()) => eprintln!("cpuprof: wrote {}", output.display()),
        Err(e) => eprintln!("cpuprof: no HTML report: {e}"),
    }
}

/// The file `program` names, as `execvp` finds it: a path with a slash as it is, else the
/// first executable of that name in `$PATH`.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}
