//! What `record` prints after the run: the profiles written, grouped into reports by program
//! and process type, and each report's top functions.

use super::MergeMode;
use crate::error::Error;
use crate::model::stacks::Stacks;
use crate::symbols::{file_name, Locator};
use cpuprof::format::Profile;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One profile the run wrote, read.
struct Written {
    path: PathBuf,
    pid: u32,
    /// Whether this is the command's own process (the first profile).
    command: bool,
    /// The executable (path, inode) from the maps; `None` when the file has no maps.
    program: Option<(String, u64)>,
    /// What the process is called: the name the user gave for the command itself, else
    /// `argv[0]`'s file name (from the profile's `# process` line), else the executable's path.
    name: String,
    /// The Chromium-style process type (`--type=renderer`; `utility: SUB-TYPE`; `browser` for
    /// a process without one among processes of its executable with one).
    kind: Option<String>,
    /// What the summary line says of the process: its title or command line.
    description: String,
    profile: Profile,
}

/// Longest description in the summary lines, in characters.
const DESCRIPTION_CHARS: usize = 100;

/// Prints, on stderr (stdout is the program's), the profiles written (one line each: file,
/// pid, samples, what the process was), grouped as `merge_mode` groups them into reports, and
/// then a report of the top functions of each group. With `html`, writes each report's page
/// beside its profile.
pub(super) fn summarise(files: &[(PathBuf, u32)], command: &[String], count: usize, merge_mode: MergeMode, html: bool) {
    if files.is_empty() {
        eprintln!("cpuprof: no profile was written");
        return;
    }
    let mut written = read_written(files, command);
    name_browsers(&mut written);
    let samples = |i: usize| written[i].profile.total_samples();
    let total = |g: &[usize]| -> u64 { g.iter().map(|&i| samples(i)).sum() };
    // The command's process first, then by samples (most first), in each group and of groups.
    let order = |&i: &usize| (!written[i].command, std::cmp::Reverse(samples(i)), written[i].pid);
    let mut groups = group(&written, merge_mode);
    for g in &mut groups {
        g.sort_by_key(order);
    }
    groups.sort_by_key(|g| (!written[g[0]].command, std::cmp::Reverse(total(g))));
    let labels = labels(&written, &groups);

    eprintln!("cpuprof: {} profiles written:", written.len());
    let width = written
        .iter()
        .map(|w| w.path.display().to_string().len())
        .max()
        .unwrap_or(0);
    let line = |w: &Written, indent: &str| {
        eprintln!(
            "{indent}{:<width$}  pid {:<7} {:>8} samples  {}",
            w.path.display().to_string(),
            w.pid,
            w.profile.total_samples(),
            w.description
        );
    };
    if merge_mode == MergeMode::Auto && groups.iter().any(|g| g.len() > 1) {
        for (group, label) in groups.iter().zip(&labels) {
            let processes = if group.len() == 1 { "process" } else { "processes" };
            eprintln!("  {label}: {} {processes}, {} samples", group.len(), total(group));
            for &i in group {
                line(&written[i], "    ");
            }
        }
    } else {
        let mut all: Vec<usize> = (0..written.len()).collect();
        all.sort_by_key(order);
        for i in all {
            line(&written[i], "  ");
        }
    }
    let mut reports: Vec<(&Vec<usize>, &String)> = groups.iter().zip(&labels).filter(|(g, _)| total(g) > 0).collect();
    reports.sort_by_key(|(g, _)| std::cmp::Reverse(total(g)));
    for (group, label) in reports {
        report_group(&written, group, label, count, html);
    }
}

/// The profiles written, read and identified; one that cannot be read is reported.
fn read_written(files: &[(PathBuf, u32)], command: &[String]) -> Vec<Written> {
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
        match crate::input::raw::read(path, &bytes, &locator) {
            Ok(profile) => {
                let program = executable(&profile).map(|e| (e.path.clone(), e.inode));
                let given = (i == 0).then_some(command[0].as_str());
                let (name, kind, description) = identify(&profile, program.as_ref().map(|p| p.0.as_str()), given);
                written.push(Written {
                    path: path.clone(),
                    pid: *pid,
                    command: i == 0,
                    program,
                    name,
                    kind,
                    description,
                    profile,
                });
            }
            Err(e) => eprintln!("cpuprof: {e}"),
        }
    }
    written
}

/// Among processes of an executable some of which have a type, one without is the browser.
fn name_browsers(written: &mut [Written]) {
    let typed: Vec<Option<(String, u64)>> = written
        .iter()
        .filter(|w| w.kind.is_some())
        .map(|w| w.program.clone())
        .collect();
    for w in written.iter_mut().filter(|w| w.kind.is_none() && w.program.is_some()) {
        if typed.contains(&w.program) {
            w.kind = Some("browser".to_string());
            w.description = format!("{} (browser)", w.name);
        }
    }
}

/// Groups of indices into `written`, each one report.
fn group(written: &[Written], merge_mode: MergeMode) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    match merge_mode {
        MergeMode::All => groups.push((0..written.len()).collect()),
        MergeMode::None => groups.extend((0..written.len()).map(|i| vec![i])),
        MergeMode::Auto => {
            let mut by_program: HashMap<(&(String, u64), Option<&str>), usize> = HashMap::new();
            for (i, w) in written.iter().enumerate() {
                match &w.program {
                    Some(p) => match by_program.get(&(p, w.kind.as_deref())) {
                        Some(&g) => groups[g].push(i),
                        None => {
                            by_program.insert((p, w.kind.as_deref()), groups.len());
                            groups.push(vec![i]);
                        }
                    },
                    None => groups.push(vec![i]),
                }
            }
        }
    }
    groups
}

/// The executable a profile's maps show: the lowest file with code mapped (the first file alone
/// can be data: a JVM maps its class-data archive below the `java` launcher).
fn executable(profile: &Profile) -> Option<&cpuprof::format::maps::MapEntry> {
    let entries = &profile.maps.entries;
    let has_code = |path: &str| entries.iter().any(|e| e.path == path && e.perms.contains('x'));
    entries
        .iter()
        .find(|e| e.path.starts_with('/') && has_code(&e.path))
        .or_else(|| entries.iter().find(|e| e.path.starts_with('/')))
}

/// A process's name, type and description (see [`Written`]), from its profile's `# process`
/// line and executable; `given`: the name the user gave, for the command's own process.
fn identify(profile: &Profile, exe: Option<&str>, given: Option<&str>) -> (String, Option<String>, String) {
    let fallback = || exe.unwrap_or("(program unknown: the file has no maps)").to_string();
    let Some(process) = &profile.maps.process else {
        // A profile without the line (gperftools', older cpuprof's): as before, the executable.
        let name = given.map_or_else(fallback, |g| file_name(g).to_string());
        return (name, None, fallback());
    };
    let argv0 = process.argv0().unwrap_or_default();
    // A program that rewrote its arguments as a title (nginx's `nginx: worker process`,
    // Chromium's whole command line, redis's `redis-server *:6379`) leaves one argument with
    // spaces; its first word names the program.
    let title = process.args.len() == 1 && argv0.contains(' ') && exe.is_none_or(|e| file_name(e) != file_name(&argv0));
    let from_argv0 = file_name(if title {
        argv0.split(' ').next().unwrap_or("")
    } else {
        &argv0
    })
    .trim_end_matches(':');
    let name = match (given, from_argv0) {
        (Some(g), _) => file_name(g).to_string(),
        (None, "") => exe.map_or_else(fallback, |e| file_name(e).to_string()),
        (None, n) => n.to_string(),
    };
    let kind = process_type(&process.args);
    let description = match &kind {
        Some(kind) => format!("{name} ({kind})"),
        None if title => abbreviate(argv0.trim(), DESCRIPTION_CHARS),
        None => abbreviate(&process.command_line(), DESCRIPTION_CHARS),
    };
    (name, kind, description)
}

/// The Chromium-style process type of a command line: `--type=T` (`utility: S` with
/// `--utility-sub-type=S`); `None` without one. Arguments are also split at spaces, for a
/// command line rewritten into one title (as Chromium's processes rewrite theirs).
fn process_type(args: &[Vec<u8>]) -> Option<String> {
    let words: Vec<String> = args
        .iter()
        .flat_map(|a| {
            String::from_utf8_lossy(a)
                .split(' ')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .skip(1)
        .collect();
    let value = |flag: &str| {
        words
            .iter()
            .find_map(|w| w.strip_prefix(flag))
            .filter(|v| !v.is_empty())
    };
    let kind = value("--type=")?;
    Some(match value("--utility-sub-type=") {
        Some(sub) if kind == "utility" => format!("utility: {sub}"),
        _ => kind.to_string(),
    })
}

/// The heading of each group's report: the name of its first process, with its type and, when
/// the name is not the executable's file name (`redis-server` for `redis-check-rdb`) or
/// another group of another executable has the same name, the executable.
fn labels(written: &[Written], groups: &[Vec<usize>]) -> Vec<String> {
    let label = |group: &[usize], with_exe: bool| {
        let lead = &written[group[0]];
        if group.iter().any(|&i| written[i].program != lead.program) {
            return "every process".to_string();
        }
        let mut notes = Vec::new();
        if let Some(kind) = lead
            .kind
            .as_ref()
            .filter(|k| group.iter().all(|&i| written[i].kind.as_ref() == Some(*k)))
        {
            notes.push(kind.clone());
        }
        match &lead.program {
            Some((exe, _)) if exe != &lead.name && (with_exe || file_name(exe) != lead.name) => notes.push(exe.clone()),
            _ => {}
        }
        match notes.is_empty() {
            true => lead.name.clone(),
            false => format!("{} ({})", lead.name, notes.join("; ")),
        }
    };
    let plain: Vec<String> = groups.iter().map(|g| label(g, false)).collect();
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let program = &written[g[0]].program;
            let clash = plain
                .iter()
                .zip(groups)
                .any(|(other, h)| other == &plain[i] && &written[h[0]].program != program);
            if clash {
                label(g, true)
            } else {
                plain[i].clone()
            }
        })
        .collect()
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
fn abbreviate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

fn report_group(written: &[Written], group: &[usize], name: &str, count: usize, html: bool) {
    let first = &written[group[0]];
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
        match crate::model::merge::merge(&named).and_then(|(bytes, _)| {
            Profile::parse(&bytes)
                .map(|p| (p, bytes))
                .map_err(|e| Error::Input(e.to_string()))
        }) {
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
                    report_group(written, &[i], &written[i].name, count, html);
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
    eprint!("{}", crate::render::text::top(&stacks.functions(), false, count));
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
    let (locator, filters) = (Locator::default(), crate::model::filters::Filters::default());
    let opts = crate::render::html::Options {
        locator: &locator,
        filters: &filters,
        tick_us: crate::analysis::local_tick_us(),
        title,
    };
    let output = crate::render::html::beside(profile);
    let written = crate::render::html::page(profile, bytes, &crate::render::html::Baseline::None, &opts)
        .and_then(|page| std::fs::write(&output, page).map_err(|e| Error::write(&output, e)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use cpuprof::format::{Maps, ProcessLine, SlotFormat};

    fn profile(args: Option<&[&str]>) -> Profile {
        let process = args.map(|args| ProcessLine {
            pid: 2,
            ppid: 1,
            forked: false,
            args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
        });
        Profile {
            format: SlotFormat::NATIVE,
            period_us: 1000,
            samples: Vec::new(),
            records: 0,
            maps: Maps {
                process,
                ..Maps::default()
            },
        }
    }

    fn identified(args: Option<&[&str]>, exe: &str, given: Option<&str>) -> (String, Option<String>, String) {
        identify(&profile(args), Some(exe), given)
    }

    #[test]
    fn processes_are_named_by_argv0_and_titles_by_their_first_word() {
        let nginx = "/usr/sbin/nginx";
        let master = "nginx: master process /usr/sbin/nginx -g daemon off;";
        assert_eq!(
            identified(Some(&[master]), nginx, None),
            ("nginx".into(), None, master.into())
        );
        assert_eq!(
            identified(Some(&["nginx: worker process"]), nginx, None),
            ("nginx".into(), None, "nginx: worker process".into())
        );
        let cc1 = "/usr/lib/gcc/x86_64-linux-gnu/12/cc1";
        assert_eq!(
            identified(Some(&[cc1, "-quiet", "a b.c"]), cc1, None),
            ("cc1".into(), None, format!("{cc1} -quiet \"a b.c\""))
        );
        // A path with spaces, run without arguments, is not a title.
        let spaced = "/opt/My App/app";
        assert_eq!(identified(Some(&[spaced]), spaced, None).0, "app");
        // The command's own process keeps the name the user gave; its description is what the
        // process shows (redis-server writes a title over its arguments).
        let redis = identified(
            Some(&["redis-server *:6379"]),
            "/usr/bin/redis-check-rdb",
            Some("redis-server"),
        );
        assert_eq!(redis, ("redis-server".into(), None, "redis-server *:6379".into()));
        // Without a process line: the executable, as before (the command's by its given name).
        let old = identified(None, "/usr/bin/app", None);
        assert_eq!(old, ("/usr/bin/app".into(), None, "/usr/bin/app".into()));
        assert_eq!(identified(None, "/usr/bin/app", Some("./app")).0, "app");
        let long = "x".repeat(300);
        assert_eq!(
            identified(Some(&["/bin/x", &long]), "/bin/x", None).2.chars().count(),
            DESCRIPTION_CHARS + 3
        );
    }

    #[test]
    fn chromium_process_types_are_read_from_arguments_or_a_title() {
        let exe = "/usr/lib/chromium/chromium";
        let renderer = "/usr/lib/chromium/chromium --type=renderer --lang=en-US";
        assert_eq!(
            identified(Some(&[renderer]), exe, None),
            ("chromium".into(), Some("renderer".into()), "chromium (renderer)".into())
        );
        let utility = [exe, "--type=utility", "--utility-sub-type=network.mojom.NetworkService"];
        assert_eq!(
            identified(Some(&utility), exe, None).1.as_deref(),
            Some("utility: network.mojom.NetworkService")
        );
        assert_eq!(
            process_type(&[b"--type=gpu-process".to_vec()]),
            None,
            "argv[0] is no flag"
        );
        assert_eq!(
            process_type(&[exe.as_bytes().to_vec(), b"--type=gpu-process".to_vec()]).as_deref(),
            Some("gpu-process")
        );
        assert_eq!(process_type(&[exe.as_bytes().to_vec(), b"--type=".to_vec()]), None);
    }

    #[test]
    fn labels_add_the_executable_when_the_name_does_not_say_it() {
        let written = |name: &str, exe: &str, inode: u64, kind: Option<&str>| Written {
            path: PathBuf::from("p"),
            pid: 1,
            command: false,
            program: Some((exe.to_string(), inode)),
            name: name.to_string(),
            kind: kind.map(str::to_string),
            description: String::new(),
            profile: profile(None),
        };
        let all = [
            written("redis-server", "/usr/bin/redis-check-rdb", 1, None),
            written("chromium", "/usr/lib/chromium/chromium", 2, Some("renderer")),
            written("chromium", "/usr/lib/chromium/chromium", 2, Some("renderer")),
            written("app", "/a/app", 3, None),
            written("app", "/b/app", 4, None),
            written("/usr/bin/old", "/usr/bin/old", 5, None),
        ];
        let groups = vec![vec![0], vec![1, 2], vec![3], vec![4], vec![5]];
        assert_eq!(
            labels(&all, &groups),
            [
                "redis-server (/usr/bin/redis-check-rdb)",
                "chromium (renderer)",
                "app (/a/app)",
                "app (/b/app)",
                "/usr/bin/old"
            ]
        );
        assert_eq!(labels(&all, &[vec![1, 3]]), ["every process"]);
    }
}
