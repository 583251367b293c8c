//! One symboliser: the library's in-process names (`Report::write_top`) and the `cpuprof`
//! command's (`cpuprof top`) are the same, row by row, on one profile of a program with its
//! symbols and of the same program stripped of them, both reading objects through the one ELF
//! reader (`cpuprof::elf`): functions by their symbols, functions only the unwind tables know
//! as `object+0xSTART`, code nothing names as `[object]`.
//!
//! The command also reads DWARF and separate debug files, which the library does not: the
//! programs are built without DWARF, and run with copies of the system's loader and
//! libraries whose build-ids name no debug file (the system's own have theirs installed),
//! and with a copy of libcpuprof.so stripped of its DWARF (a sample that lands in the
//! profiler's own stop at exit would otherwise get the command's inlined frames there).

mod support;

use cpuprof::Report;
use std::path::{Path, PathBuf};
use support::*;

/// A copy of `path` in `dir` whose build-id differs from the original's by one bit, so that
/// no debug file of the original is found for it.
fn without_debug_file(dir: &Path, path: &Path) -> PathBuf {
    let mut data = std::fs::read(path).unwrap();
    let elf = cpuprof::elf::Elf::parse(&data[..]).unwrap();
    if let Some(id) = cpuprof::elf::build_id(&elf, false) {
        let at = data.windows(id.len()).position(|w| w == id).unwrap();
        data[at] ^= 1;
    }
    let copy = dir.join(path.file_name().unwrap());
    std::fs::write(&copy, &data).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    copy
}

#[test]
fn report_and_cli_top_name_stripped_and_unstripped_programs_alike() {
    let dir = scratch_dir("one_symboliser");
    let symbols = compile_c(&dir, "stripped.c", "symbols", &["-O2"], false);
    run_ok(Path::new("strip"), &["--strip-debug", symbols.to_str().unwrap()], &[]);
    let stripped = dir.join("stripped");
    std::fs::copy(&symbols, &stripped).unwrap();
    run_ok(Path::new("strip"), &["--strip-all", stripped.to_str().unwrap()], &[]);
    let libs = dir.join("lib");
    std::fs::create_dir_all(&libs).unwrap();
    let loader = without_debug_file(&libs, Path::new("/lib64/ld-linux-x86-64.so.2"));
    for name in ["libc.so.6", "libgcc_s.so.1", "libm.so.6"] {
        let system = Path::new("/lib/x86_64-linux-gnu").join(name);
        if system.exists() {
            without_debug_file(&libs, &system);
        }
    }
    let runs: [(&Path, &[&str], &str); 4] = [
        (&symbols, &["1.2"], "spin_three"),
        (&stripped, &["1.2"], "stripped+0x"),
        (&symbols, &["0.4", "bare"], "bare_spin"),
        (&stripped, &["0.4", "bare"], "[stripped]"),
    ];
    let preload = libs.join("libcpuprof.so");
    std::fs::copy(lib(), &preload).unwrap();
    run_ok(Path::new("strip"), &["--strip-debug", preload.to_str().unwrap()], &[]);
    for (i, (program, args, expected)) in runs.into_iter().enumerate() {
        let profile = dir.join(format!("run{i}.prof"));
        let mut command = vec!["--library-path", libs.to_str().unwrap(), program.to_str().unwrap()];
        command.extend_from_slice(args);
        run_alone(
            &loader,
            &command,
            &[
                ("LD_PRELOAD", preload.to_str().unwrap()),
                ("CPUPROFILE", profile.to_str().unwrap()),
                ("CPUPROFILE_FREQUENCY", "500"),
            ],
        );
        let report = Report::parse(std::fs::read(&profile).unwrap()).unwrap();
        let mut ours = Vec::new();
        report.write_top(&mut ours, 1000).unwrap();
        let ours = String::from_utf8(ours).unwrap();
        let cli = run_ok(cli(), &["top", "-n", "1000", profile.to_str().unwrap()], &[]);
        let theirs = String::from_utf8(cli.stdout).unwrap();
        let rows = |table: &str| table.lines().map(str::to_string).collect::<Vec<_>>();
        for (row, (a, b)) in rows(&ours).iter().zip(rows(&theirs)).enumerate() {
            assert_eq!(
                a,
                &b,
                "{} {args:?}: row {row} differs\nReport:\n{ours}\ncpuprof top:\n{theirs}",
                program.display()
            );
        }
        assert_eq!(ours, theirs, "{} {args:?}", program.display());
        assert!(
            ours.contains(expected),
            "{} {args:?}: no {expected} row:\n{ours}",
            program.display()
        );
    }
}
