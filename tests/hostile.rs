//! Hostile programs (tests/c/hostile.c, tests/c/capi.c): with the profiler they must behave
//! exactly as without it — same output, same exit status — and leave a valid profile.
//! Each condition runs under every timer kind. docs/HOSTILE.md lists the conditions.

mod support;

use cpuprof::format::Profile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

const TIMERS: &[&str] = &["auto", "perf", "itimer"];

fn hostile() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("hostile-bin");
            compile_c(
                &dir,
                "hostile.c",
                "hostile",
                &["-O1", "-fno-omit-frame-pointer", "-mno-red-zone"],
                false,
            )
        })
        .clone()
}

fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs `mode` plainly and under each timer; asserts identical stdout and exit status.
/// Returns the profiles written.
fn behaves_the_same(mode: &str) -> Vec<PathBuf> {
    behaves_the_same_under(mode, TIMERS)
}

fn behaves_the_same_under(mode: &str, timers: &[&str]) -> Vec<PathBuf> {
    let prog = hostile();
    PlainVsProfiled::new(mode, &scratch_dir(&format!("hostile-{mode}")))
        .across("CPUPROFILE_TIMER", timers)
        .with("CPUPROFILE_FREQUENCY", "1000")
        .run(|run| run_program(&prog, &[mode], &run.env, &[]))
        .profiled
        .into_iter()
        .map(|p| p.profile)
        .collect()
}

fn assert_valid(profiles: &[PathBuf]) {
    for p in profiles {
        Profile::parse(&std::fs::read(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

#[test]
fn recursion_100000_frames_deep() {
    assert_valid(&behaves_the_same("deep"));
}

#[test]
fn thread_on_a_64_kib_stack_near_exhaustion() {
    assert_valid(&behaves_the_same("smallstack"));
}

#[test]
fn threads_inside_their_own_sigusr1_and_sigsegv_handlers() {
    assert_valid(&behaves_the_same("inhandler"));
}

#[test]
fn generated_code_without_unwind_info_and_garbage_rbp() {
    assert_valid(&behaves_the_same("jit"));
}

#[test]
fn threads_that_block_every_signal() {
    assert_valid(&behaves_the_same("blockall"));
}

#[test]
fn fork_without_exec_leaves_the_parent_profile_alone() {
    let profiles = behaves_the_same("fork");
    assert_valid(&profiles);
    let seconds = |path: &Path| {
        let prof = Profile::parse(&std::fs::read(path).unwrap()).unwrap();
        prof.total_samples() as f64 * prof.period_us as f64 / 1e6
    };
    for p in &profiles {
        let dir = p.parent().unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let children: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|c| {
                c.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}_"))
            })
            .collect();
        // The parent burnt 0.6 s; the child's 0.3 s is in its own file (session::children),
        // not in (nor corrupting) the parent's.
        assert_eq!(children.len(), 1, "the forked child's own profile: {children:?}");
        assert!(seconds(p) < 0.75, "{}: {:.2} s sampled", p.display(), seconds(p));
        // Its 0.3 s, but for the process-wide timer at 1000 Hz, capped by the kernel tick
        // (one sample per tick: a quarter of them).
        let child = seconds(&children[0]);
        let expected = if name.starts_with("itimer") {
            0.04..0.45
        } else {
            0.15..0.45
        };
        assert!(expected.contains(&child), "{}: {child:.2} s", children[0].display());
    }
}

#[test]
fn fork_exec_vfork_posix_spawn_and_system_in_a_loop() {
    assert_valid(&behaves_the_same("spawn"));
}

#[test]
fn exec_into_a_program_without_the_profiler_survives() {
    // execve replaces the process: its profile is completed before (trailer and maps), and the
    // new program must not die of a profiling signal.
    for p in behaves_the_same("exec") {
        Profile::parse(&std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

#[test]
fn interrupted_system_calls_fail_no_more_than_without_the_profiler() {
    // The default timer and perf events. A POSIX CPU timer per thread advances only while its
    // thread runs, so a thread that sleeps in blocking calls is almost never interrupted in one;
    // perf events signal in user mode only. The process-wide `itimer` (like gperftools'
    // setitimer) can fire on a thread entering a blocking call, which then fails with EINTR
    // (docs/HOSTILE.md).
    assert_valid(&behaves_the_same_under("syscalls", &["auto", "perf"]));
}

#[test]
fn an_application_installing_its_own_sigprof_timer_after_start() {
    assert_valid(&behaves_the_same("ownsig"));
}

#[test]
fn killed_by_sigsegv_leaves_a_complete_profile() {
    // SIGSEGV at its default action: the profile is completed first
    // (sampler::default_actions), then the fault is raised again and kills the program.
    for p in behaves_the_same("segv") {
        let profile = Profile::parse(&std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            profile.total_samples() >= 100,
            "{}: {} samples",
            p.display(),
            profile.total_samples()
        );
    }
}

#[test]
fn start_and_stop_from_many_threads_at_once() {
    let dir = scratch_dir("race");
    let prog = compile_c(&dir, "capi.c", "capi", &["-O2", "-fno-omit-frame-pointer"], true);
    let base = dir.join("race.prof");
    for timer in TIMERS {
        let out = run_ok(&prog, &["race", base.to_str().unwrap()], &[("CPUPROFILE_TIMER", timer)]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
        for i in 0..8 {
            let p = dir.join(format!("race.prof.{i}"));
            if p.exists() {
                Profile::parse(&std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            }
        }
    }
}

#[test]
fn a_profiling_signal_after_stop_is_harmless() {
    let dir = scratch_dir("afterstop");
    let prog = compile_c(&dir, "capi.c", "capi", &["-O2", "-fno-omit-frame-pointer"], true);
    let out = run_ok(
        &prog,
        &["afterstop", dir.join("a.prof").to_str().unwrap()],
        &[("CPUPROFILE_TIMER", "itimer")],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("survived"));
}

#[test]
fn a_symlink_at_the_output_path_is_not_followed() {
    let dir = scratch_dir("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.join("link.prof");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let prog = hostile();
    let out = run(
        &prog,
        &["blockall"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE", link.to_str().unwrap()),
        ],
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("symbolic link") && stderr.contains("link.prof"),
        "{stderr}"
    );
}

#[test]
fn a_full_disk_is_reported_and_the_program_runs_on() {
    let Some(disk) = FullDisk::mount("fulldisk") else {
        return;
    };
    let profile = disk.path().join("full.prof");
    let prog = hostile();
    let plain = run(&prog, &["distinct"], &[]);
    let out = run(
        &prog,
        &["distinct"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE", profile.to_str().unwrap()),
        ],
    );
    let bytes = std::fs::read(&profile).unwrap();
    drop(disk);
    assert_eq!(out.status.code(), plain.status.code());
    assert_eq!(out.stdout, plain.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("No space left on device") && stderr.contains("full.prof"),
        "{stderr}"
    );
    let (partial, _) = Profile::parse_lenient(&bytes).unwrap();
    assert!(
        partial.records > 0,
        "the records written before the disk filled are readable"
    );
}
