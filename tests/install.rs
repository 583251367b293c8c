//! The C install story (issue 18): `make install` into a prefix, then C and C++ programs built
//! with nothing but `pkg-config cpuprof` (the installed header; libcpuprof.so through its
//! soname; libcpuprof.a linked statically), run with only the prefix's lib on the library path,
//! their profiles read by our reader, the installed `cpuprof top` and google-pprof. The install
//! uses this test run's debug build (`BUILD_DIR`), so nothing is rebuilt.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::*;

const WORKLOAD: &str = "tests/c/installed.c";
const FLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer"];
/// CPU seconds of hot_b; hot_a burns three times as much.
const UNIT: &str = "0.3";

/// Whether the tools these tests need are installed (the skip policy: [`require_tools`]).
fn tools_present() -> bool {
    require_tools(&["make", "pkg-config", "cc", "g++", "readelf", "nm", "google-pprof"])
}

/// The library's version, from its crate (what the installed file name carries).
fn version() -> String {
    let manifest = std::fs::read_to_string(root().join("cdylib/Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("cdylib/Cargo.toml names a version")
        .to_string()
}

/// Runs `make install` (or another target) with this build and `vars`.
fn make(target: &str, vars: &[String]) {
    let out = Command::new("make")
        .current_dir(root())
        .arg(target)
        .arg(format!("BUILD_DIR={}", lib().parent().unwrap().display()))
        // Not the system's loader cache: the prefix is on no path it knows.
        .arg("LDCONFIG=true")
        .args(vars)
        .output()
        .expect("run make");
    assert!(
        out.status.success(),
        "make {target} {vars:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The prefix this test binary installed into, once.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = scratch_dir("install").join("prefix");
        make("install", &[format!("PREFIX={}", prefix.display())]);
        prefix
    })
}

/// `pkg-config ARGS cpuprof` against the prefix's cpuprof.pc, split into arguments.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("cpuprof")
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    assert!(out.status.success(), "pkg-config {args:?} cpuprof: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Builds the workload as `name` with `compiler` (cc, or g++ for C++), `extra` flags, the
/// installed header and the link arguments `libs`.
fn build(dir: &Path, name: &str, compiler: &str, extra: &[&str], libs: &[String]) -> PathBuf {
    let out = dir.join(name);
    let mut cmd = Command::new(compiler);
    cmd.args(FLAGS).args(extra).args(pkg_config(&["--cflags"]));
    if compiler == "g++" {
        cmd.args(["-x", "c++"]).arg(root().join(WORKLOAD)).args(["-x", "none"]);
    } else {
        cmd.arg(root().join(WORKLOAD));
    }
    let result = cmd.arg("-o").arg(&out).args(libs).output().expect("run the compiler");
    assert!(
        result.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// The arguments that link libcpuprof.a, as README.md says: the -Bstatic ends within the
/// flags `pkg-config --static` gives.
fn static_libs() -> Vec<String> {
    let mut libs = vec!["-Wl,-Bstatic".to_string()];
    libs.extend(pkg_config(&["--static", "--libs"]));
    libs
}

/// `readelf -d`'s NEEDED names and whether a run path is set.
fn dynamic_section(binary: &Path) -> (Vec<String>, bool) {
    let out = run_ok(Path::new("readelf"), &["-d", binary.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let needed = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect();
    (needed, text.contains("(RPATH)") || text.contains("(RUNPATH)"))
}

/// Runs `program` with `args` and `env` alone (no other profiled run of this test binary at the
/// same time), with `library_path` as the only library path (none if empty) and nothing
/// preloaded, asserting it exits 0; returns its stdout.
fn run_isolated(program: &Path, args: &[&str], env: &[(&str, &str)], library_path: &str) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .env_remove("LD_PRELOAD")
        .env_remove("CPUPROF_LIB");
    if library_path.is_empty() {
        cmd.env_remove("LD_LIBRARY_PATH");
    } else {
        cmd.env("LD_LIBRARY_PATH", library_path);
    }
    let out = {
        let _alone = alone();
        cmd.output().unwrap()
    };
    assert!(
        out.status.success(),
        "{} {args:?}: {:?}\nstdout: {}\nstderr: {}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `program UNIT api PROFILE` (or `program UNIT` with CPUPROFILE=PROFILE when `autostart`)
/// at 1000 Hz with only `library_path` on the library path; returns the profile's path.
fn run_profiled(program: &Path, autostart: bool, library_path: &str) -> PathBuf {
    let profile = program.with_extension("prof");
    let _ = std::fs::remove_file(&profile);
    let profile_arg = profile.to_str().unwrap();
    let stdout = if autostart {
        let env = [("CPUPROFILE_FREQUENCY", "1000"), ("CPUPROFILE", profile_arg)];
        run_isolated(program, &[UNIT], &env, library_path)
    } else {
        let env = [("CPUPROFILE_FREQUENCY", "1000")];
        run_isolated(program, &[UNIT, "api", profile_arg], &env, library_path)
    };
    assert_eq!(stdout.trim(), "checksum 1");
    assert!(profile.exists(), "{} wrote no profile", program.display());
    profile
}

/// The known answer (hot_a 75 %, hot_b 25 %, hot_b's in a thread of its own unless
/// `autostart`) from our reader and the installed `cpuprof top`, and with `google_pprof` from
/// google-pprof too (which takes a second or two per profile: once for each kind of link).
fn assert_known_answer(program: &Path, profile: &Path, google_pprof: bool) {
    let parsed = read_profile(profile);
    assert!(
        parsed.total_samples() >= 300,
        "{}: {} samples for 1.2 CPU-seconds at 1000 Hz",
        profile.display(),
        parsed.total_samples()
    );
    let installed_cli = prefix().join("bin/cpuprof");
    let out = run_ok(
        &installed_cli,
        &["top", "--cum", "-n", "1000", profile.to_str().unwrap()],
        &[],
    );
    let top = cum_percentages(&String::from_utf8_lossy(&out.stdout));
    assert_three_to_one("installed cpuprof top", &top, profile);
    if google_pprof {
        assert_three_to_one("google-pprof", &support::google_pprof(program, profile), profile);
    }
}

/// The mapped paths a profile records.
fn mapped_paths(profile: &Path) -> Vec<String> {
    read_profile(profile).maps.entries.into_iter().map(|e| e.path).collect()
}

/// The installed shared library's real file, as a process's maps name it.
fn installed_library() -> PathBuf {
    prefix().join(format!("lib/libcpuprof.so.{}", version()))
}

/// Asserts that `profile` was written by the prefix's libcpuprof.so, not by a build's.
fn assert_loaded_from_prefix(profile: &Path) {
    let paths = mapped_paths(profile);
    let installed = installed_library();
    assert!(
        paths.iter().any(|p| Path::new(p) == installed),
        "{} not mapped: {paths:?}",
        installed.display()
    );
    assert!(
        paths
            .iter()
            .all(|p| !p.contains("/libcpuprof.so") || Path::new(p) == installed),
        "another libcpuprof.so was mapped: {paths:?}"
    );
}

#[test]
fn make_install_with_destdir_puts_every_file_under_it_and_uninstall_removes_them() {
    if !tools_present() {
        return;
    }
    let stage = scratch_dir("install_destdir");
    // A prefix that does not exist here: nothing may be written to it, only under DESTDIR.
    let prefix = format!("/nonexistent-cpuprof-prefix-{}", std::process::id());
    let vars = [format!("PREFIX={prefix}"), format!("DESTDIR={}", stage.display())];
    make("install", &vars);
    assert!(!Path::new(&prefix).exists(), "make install wrote outside DESTDIR");

    let v = version();
    let mut files = BTreeMap::new();
    let mut pending = vec![stage.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(&stage).unwrap().to_string_lossy().into_owned();
            if meta.is_dir() {
                pending.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                files.insert(rel, format!("-> {}", target.display()));
            } else {
                use std::os::unix::fs::PermissionsExt;
                files.insert(rel, format!("{:o}", meta.permissions().mode() & 0o777));
            }
        }
    }
    let p = prefix.trim_start_matches('/');
    let expected: BTreeMap<String, String> = [
        ("bin/cpuprof", "755".to_string()),
        ("include/cpuprof.h", "644".into()),
        ("include/gperftools/profiler.h", "644".into()),
        ("include/gperftools/heap-profiler.h", "644".into()),
        ("lib/libcpuprof.a", "644".into()),
        ("lib/libcpuprof.so", format!("-> {SONAME}")),
        (&format!("lib/{SONAME}"), format!("-> libcpuprof.so.{v}")),
        (&format!("lib/libcpuprof.so.{v}"), "755".into()),
        ("lib/pkgconfig/cpuprof.pc", "644".into()),
    ]
    .into_iter()
    .map(|(rel, what)| (format!("{p}/{rel}"), what))
    .collect();
    assert_eq!(files, expected);

    // The library's soname is the name installed as its link.
    let out = run_ok(
        Path::new("readelf"),
        &["-d", stage.join(format!("{p}/lib/libcpuprof.so.{v}")).to_str().unwrap()],
        &[],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("(SONAME)             Library soname: [{SONAME}]")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The .pc file names the final prefix, not the staging directory.
    let pc = std::fs::read_to_string(stage.join(format!("{p}/lib/pkgconfig/cpuprof.pc"))).unwrap();
    assert!(pc.contains(&format!("prefix={prefix}\n")), "{pc}");
    assert!(pc.contains(&format!("Version: {v}\n")), "{pc}");
    assert!(!pc.contains(stage.to_str().unwrap()) && !pc.contains('@'), "{pc}");

    make("uninstall", &vars);
    let mut left = vec![];
    let mut pending = vec![stage.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                pending.push(path);
            } else {
                left.push(path);
            }
        }
    }
    assert!(left.is_empty(), "make uninstall left {left:?}");
}

#[test]
fn c_program_built_with_pkg_config_runs_on_the_installed_library() {
    if !tools_present() {
        return;
    }
    let dir = scratch_dir("install_c");
    let program = build(&dir, "api_c", "cc", &[], &pkg_config(&["--libs"]));
    // The header came from the prefix (not gperftools' in /usr/include, nor this repository's).
    let mut deps = Command::new("cc");
    deps.arg("-M")
        .args(pkg_config(&["--cflags"]))
        .arg(root().join(WORKLOAD));
    let deps = String::from_utf8_lossy(&deps.output().unwrap().stdout).into_owned();
    let header = prefix().join("include/gperftools/profiler.h");
    assert!(deps.contains(header.to_str().unwrap()), "{deps}");

    let (needed, run_path) = dynamic_section(&program);
    assert!(needed.iter().any(|n| n == SONAME), "NEEDED {needed:?}");
    assert!(
        !run_path,
        "pkg-config adds no run path: the library path finds the library"
    );
    let profile = run_profiled(&program, false, prefix().join("lib").to_str().unwrap());
    assert_loaded_from_prefix(&profile);
    assert_known_answer(&program, &profile, true);
}

#[test]
fn cxx_program_with_std_thread_built_with_pkg_config_runs_on_the_installed_library() {
    if !tools_present() {
        return;
    }
    let dir = scratch_dir("install_cxx");
    let program = build(&dir, "api_cxx", "g++", &[], &pkg_config(&["--libs"]));
    let (needed, _) = dynamic_section(&program);
    assert!(needed.iter().any(|n| n == SONAME), "NEEDED {needed:?}");
    let profile = run_profiled(&program, false, prefix().join("lib").to_str().unwrap());
    assert_loaded_from_prefix(&profile);
    // hot_b's 25 % runs in a std::thread: libstdc++'s call to pthread_create is interposed.
    assert_known_answer(&program, &profile, false);
}

#[test]
fn statically_linked_programs_profile_through_the_api_threads_and_cpuprofile() {
    if !tools_present() {
        return;
    }
    let dir = scratch_dir("install_static");
    let libs = static_libs();
    let c = build(&dir, "static_c", "cc", &[], &libs);
    let cxx = build(&dir, "static_cxx", "g++", &[], &libs);
    // No call into the library at all: only the link's -u keeps the profiler and its
    // constructor, which starts it from CPUPROFILE.
    let autostart = build(&dir, "static_autostart", "cc", &["-DAUTOSTART_ONLY"], &libs);
    for program in [&c, &cxx, &autostart] {
        let (needed, _) = dynamic_section(program);
        assert!(
            !needed.iter().any(|n| n.starts_with("libcpuprof")),
            "{}: NEEDED {needed:?}",
            program.display()
        );
        let profile = run_profiled(program, program == &autostart, "");
        assert!(
            !mapped_paths(&profile).iter().any(|p| p.contains("libcpuprof")),
            "{}: a libcpuprof.so was loaded",
            program.display()
        );
        // C: hot_b's thread comes from the program's pthread_create, C++: from libstdc++'s
        // (the executable's interposer is exported, as the shared library's is).
        assert_known_answer(program, &profile, program == &c);
    }
}

/// libcpuprof.a's member that defines ProfilerStart (what `-u ProfilerStart` links) defines
/// every symbol libcpuprof.so exports, the interposers among them, and holds the constructor:
/// a static link gets all of them whichever it asked for.
#[test]
fn the_archive_member_with_the_api_holds_every_interposer_and_the_constructor() {
    if !tools_present() {
        return;
    }
    let archive = prefix().join("lib/libcpuprof.a");
    let out = run_ok(
        Path::new("nm"),
        &["-A", "--defined-only", archive.to_str().unwrap()],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "ARCHIVE:MEMBER:ADDRESS TYPE NAME"
    let archive_prefix = format!("{}:", archive.display());
    let mut by_member: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in text.lines() {
        let Some((member, rest)) = line.strip_prefix(&archive_prefix).and_then(|l| l.split_once(':')) else {
            continue;
        };
        let cols: Vec<&str> = rest.split_whitespace().collect();
        if let [_, kind, name] = cols[..] {
            if kind.chars().all(|c| c.is_ascii_uppercase()) {
                by_member.entry(member).or_default().push(name);
            }
        }
    }
    let members: Vec<&str> = by_member
        .iter()
        .filter(|(_, names)| names.contains(&"ProfilerStart"))
        .map(|(m, _)| *m)
        .collect();
    assert_eq!(members.len(), 1, "ProfilerStart defined in {members:?}");
    let member = members[0];
    let exports = run_ok(
        Path::new("nm"),
        &["-D", "--defined-only", installed_library().to_str().unwrap()],
        &[],
    );
    let exports = String::from_utf8_lossy(&exports.stdout);
    let missing: Vec<&str> = exports
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|name| !by_member[member].contains(name))
        .collect();
    assert!(missing.is_empty(), "{member} lacks {missing:?}");

    let sections = run_ok(Path::new("readelf"), &["-S", "-W", archive.to_str().unwrap()], &[]);
    let sections = String::from_utf8_lossy(&sections.stdout);
    let ours = sections
        .split("\nFile: ")
        .find(|part| part.lines().next().is_some_and(|l| l.ends_with(&format!("({member})"))))
        .expect("readelf lists the member");
    assert!(ours.contains(".init_array"), "{member} has no constructor:\n{ours}");
}

#[test]
fn installed_cpuprof_record_preloads_the_installed_library() {
    if !tools_present() {
        return;
    }
    let dir = scratch_dir("install_record");
    // Linked with nothing of cpuprof: record preloads it.
    let program = build(&dir, "plain", "cc", &["-DAUTOSTART_ONLY"], &[]);
    let profile = dir.join("recorded.prof");
    let installed_cli = prefix().join("bin/cpuprof");
    let stdout = run_isolated(
        &installed_cli,
        &[
            "record",
            "-F",
            "1000",
            "-o",
            profile.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            UNIT,
        ],
        &[],
        "",
    );
    assert!(stdout.contains("checksum 1"), "{stdout}");
    assert_loaded_from_prefix(&profile);
    assert_known_answer(&program, &profile, false);
}
