//! libcpuprof.so built without this workspace's `.cargo/config.toml` flags (frame pointers
//! forced): what a user gets with their own `RUSTFLAGS`, or building from another directory.
//! The library's own stack walks (a new thread's start routine callers, `ProfilerGetStackTrace`)
//! must not assume its functions keep frame pointers: once they did, and such a build crashed
//! every program that started a thread under `CPUPROFILE`.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use support::*;

/// libcpuprof.so from a release build with frame pointers explicitly off.
fn library_without_frame_pointers() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = root().join("target/no-frame-pointers");
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["build", "-q", "--release", "-p", "cpuprof-preload"])
            .env("CARGO_TARGET_DIR", &target)
            // RUSTFLAGS replaces the workspace's build.rustflags.
            .env("RUSTFLAGS", "-C force-frame-pointers=no")
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building libcpuprof.so without frame pointers failed");
        let library = target.join("release/libcpuprof.so");
        // get_stack_trace_... links a program with -lcpuprof against it.
        provide_soname(&library);
        library
    })
}

#[test]
fn threads_start_and_profiles_are_written_without_frame_pointers_in_the_library() {
    let library = library_without_frame_pointers();
    let dir = scratch_dir("no_fp_threads");
    let roots = compile_c(&dir, "roots.c", "roots", &["-O2"], false);
    for frequency in ["100", "4000"] {
        let profile = dir.join(format!("roots-{frequency}.prof"));
        let plain = Command::new(&roots).args(["3", "0.5"]).output().unwrap();
        let profiled = Command::new(&roots)
            .args(["3", "0.5"])
            .env("LD_PRELOAD", library)
            .env("CPUPROFILE", &profile)
            .env("CPUPROFILE_FREQUENCY", frequency)
            .output()
            .unwrap();
        assert_eq!(profiled.status.code(), plain.status.code(), "{profiled:?}");
        assert!(profiled.status.success(), "{profiled:?}");
        // Every thread burnt 0.5 s: 2 s of CPU, of which the profile has most.
        let samples = read_profile(&profile).total_samples();
        let expected = if frequency == "100" { 200 } else { 2000 };
        assert!(
            samples * 2 >= expected,
            "{frequency} Hz: {samples} samples for ~{expected}"
        );
        // The start routines' callers were walked (by DWARF) to each thread's root.
        let top = Command::new(cli())
            .args(["top", "--cum", "-n", "50", profile.to_str().unwrap()])
            .output()
            .unwrap();
        let top = String::from_utf8_lossy(&top.stdout);
        assert!(top.contains("clone3") || top.contains("clone"), "{top}");
    }
}

/// `capi stack` (ProfilerGetStackTrace from three nested functions) linked against the library
/// without frame pointers by its directory, and run with that library: not with cargo's
/// LD_LIBRARY_PATH, which names target/debug ahead of the program's run path, so that the
/// program would load the debug build's library (with frame pointers) instead.
fn stack_trace_without_frame_pointers(scratch: &str) -> std::collections::HashMap<String, String> {
    let library = library_without_frame_pointers();
    let dir = scratch_dir(scratch);
    let prog = dir.join("capi");
    let libdir = library.parent().unwrap();
    let cc = Command::new("cc")
        .args(["-g", "-O1", "-fno-omit-frame-pointer", "-DUSE_API", "-I"])
        .arg(root().join("include"))
        .arg(root().join("tests/c/capi.c"))
        .arg("-o")
        .arg(&prog)
        .arg("-L")
        .arg(libdir)
        .args(["-lcpuprof", "-lpthread"])
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .output()
        .unwrap();
    assert!(cc.status.success(), "{cc:?}");
    // The loader's choice, as ldd shows it.
    let loaded = Command::new(&prog)
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .unwrap();
    let loaded = String::from_utf8_lossy(&loaded.stdout);
    assert!(
        loaded.contains(&format!("{SONAME} => {}", libdir.join(SONAME).display())),
        "{loaded}"
    );
    let out = Command::new(&prog)
        .arg("stack")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    values(&out)
}

#[test]
fn get_stack_trace_is_safe_without_frame_pointers_in_the_library() {
    let v = stack_trace_without_frame_pointers("no_fp_stack");
    // Whatever the walk finds, it ends the call safely; any frame it reports is one of the
    // three callers (f3, f2, f1, within their first KiB).
    let depth: usize = v["depth"].parse().unwrap();
    for i in 0..depth.min(3) {
        let offset: i64 = v[&format!("frame{i}_offset")].parse().unwrap();
        assert!((0..1024).contains(&offset), "{v:?}");
    }
}

/// The caller's frames as far as a frame-pointer walk from inside a function without one can
/// see them: at least f2 and f1 (f3, whose frame the walk may start above, is not promised).
#[test]
fn get_stack_trace_sees_the_callers_without_frame_pointers_in_the_library() {
    let v = stack_trace_without_frame_pointers("no_fp_stack_depth");
    assert!(v["depth"].parse::<i32>().unwrap() >= 2, "{v:?}");
}
