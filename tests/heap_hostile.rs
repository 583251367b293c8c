//! Programs a heap profiler's interposers must not change (`tests/c/heap_hostile.c`'s modes:
//! fork without exec, 1,000 short threads, realloc chains, the aligned family and its errors,
//! a single-threaded process kept so;
//! C++ `new[]`, `delete`, `std::bad_alloc`; jemalloc preloaded after and before libcpuprof.so;
//! python3 and a JVM): each run under `HEAPPROFILE` exits and prints as it does without it,
//! and what it wrote reads as a heap profile, in our reader and in google-pprof. The dlsym
//! bootstrap is in every preloaded run: the first allocation finds the allocator.

mod support;
use cpuprof::format::heap::HeapProfile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

/// Runs `program args` plainly and under HEAPPROFILE (with `preload` as LD_PRELOAD and `env`),
/// asserts the same behaviour, and returns the heap files written and the profiled stderr.
fn plain_vs_heap(
    dir: &Path,
    program: &Path,
    args: &[&str],
    preload: &str,
    env: &[(&str, &str)],
) -> (Vec<PathBuf>, String) {
    let run = |extra: &[(&str, &str)]| -> Output {
        Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .envs(extra.iter().copied())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", program.display()))
    };
    let plain = run(&[]);
    let prefix = dir.join("h");
    let profiled = {
        let _alone = alone();
        run(&[("LD_PRELOAD", preload), ("HEAPPROFILE", prefix.to_str().unwrap())])
    };
    assert_same_behaviour(&format!("{} {args:?}", program.display()), &plain, &profiled);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some("heap".as_ref()))
        .collect();
    files.sort();
    for f in &files {
        HeapProfile::parse(&std::fs::read(f).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    (files, stderr(&profiled))
}

/// google-pprof reads `profile` of `program` (what was allocated: these programs free most
/// of it before their end).
fn google_pprof_reads(program: &Path, profile: &Path) {
    let out = run_ok(
        Path::new("google-pprof"),
        &[
            "--text",
            "--alloc_space",
            program.to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Total:"), "{}: {text}", profile.display());
}

fn hostile_mode(mode: &str, sample: &str) {
    let dir = scratch_dir(&format!("heap_hostile_{mode}"));
    let program = compile_c(&dir, "heap_hostile.c", "heap_hostile", &["-O2"], false);
    let (files, _) = plain_vs_heap(
        &dir,
        &program,
        &[mode],
        lib().to_str().unwrap(),
        &[("HEAP_PROFILE_SAMPLE", sample)],
    );
    assert!(!files.is_empty(), "{mode}: no heap profile");
    google_pprof_reads(&program, files.last().unwrap());
}

#[test]
fn fork_without_exec() {
    let dir = scratch_dir("heap_hostile_fork");
    let program = compile_c(&dir, "heap_hostile.c", "heap_hostile", &["-O2"], false);
    let (files, _) = plain_vs_heap(
        &dir,
        &program,
        &["fork"],
        lib().to_str().unwrap(),
        &[("HEAP_PROFILE_SAMPLE", "64")],
    );
    // The parent's file and the child's own (`h_PID.0001.heap`), both complete.
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "h.0001.heap"), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("h_") && n.ends_with(".0001.heap")),
        "{names:?}"
    );
    for f in &files {
        google_pprof_reads(&program, f);
    }
    // What the parent allocated and freed before the fork is in its file only: a child's
    // history starts at the fork, with the blocks it inherited.
    for f in &files {
        let top = cpuprof_top_text(
            f,
            &["--sample-index", "alloc_objects", "--binary", program.to_str().unwrap()],
        );
        let child = f.file_name().unwrap().to_string_lossy().starts_with("h_");
        assert_eq!(top.contains("parent_only"), !child, "{}\n{top}", f.display());
    }
}

#[test]
fn short_threads() {
    hostile_mode("threads", "4096");
}

#[test]
fn realloc_chains() {
    hostile_mode("realloc", "1");
}

#[test]
fn aligned_family_and_errors() {
    hostile_mode("aligned", "1");
}

/// A single-threaded process stays single-threaded under HEAPPROFILE (`unshare -r` and
/// Chromium's zygote refuse otherwise); the heap profile's thread starts with the program's
/// first one, and then writes the files its triggers ask for (here every second).
#[test]
fn single_threaded_until_the_program_starts_a_thread() {
    let dir = scratch_dir("heap_hostile_single");
    let program = compile_c(&dir, "heap_hostile.c", "heap_hostile", &["-O2"], false);
    let (files, err) = plain_vs_heap(
        &dir,
        &program,
        &["single"],
        lib().to_str().unwrap(),
        &[("HEAP_PROFILE_TIME_INTERVAL", "1")],
    );
    // The output compared above holds "threads alone 1".
    assert!(
        files.len() >= 2,
        "a file while the program ran, and one at its end: {files:?}\n{err}"
    );
    assert!(err.contains("1 s since the last"), "{err}");
    google_pprof_reads(&program, files.last().unwrap());
}

#[test]
fn cxx_new_delete_and_bad_alloc() {
    let dir = scratch_dir("heap_hostile_cxx");
    let program = dir.join("heap_cxx");
    let built = Command::new("g++")
        .args(["-O2", "-g"])
        .arg(root().join("tests/c/heap_cxx.cc"))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let (files, _) = plain_vs_heap(&dir, &program, &[], lib().to_str().unwrap(), &[]);
    let profile = files.last().unwrap();
    let out = run_ok(
        Path::new("google-pprof"),
        &[
            "--text",
            "--alloc_space",
            program.to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[],
    );
    // operator new[] is the allocator's frame, which pprof drops: `arrays` allocated.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("arrays"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// jemalloc preloaded after libcpuprof.so is the allocator underneath, sampled; preloaded
/// before, it takes the calls, and the heap profile says it is off.
#[test]
fn jemalloc_preloaded() {
    if !require_file(Path::new(JEMALLOC), "libjemalloc2") {
        return;
    }
    let dir = scratch_dir("heap_jemalloc_after");
    let program = compile_c(
        &dir,
        "heap_known.c",
        "heap_known",
        &["-O2", "-fno-omit-frame-pointer"],
        false,
    );
    let after = format!("{}:{JEMALLOC}", lib().display());
    let (files, _) = plain_vs_heap(&dir, &program, &["5"], &after, &[]);
    let profile = HeapProfile::parse(&std::fs::read(files.last().unwrap()).unwrap()).unwrap();
    let inuse: u64 = profile
        .records
        .iter()
        .map(|r| r.counts.unsampled(profile.period).inuse_bytes)
        .sum();
    // heap_known 5 holds ~900 MB at the end.
    assert!(inuse > 700 << 20, "{inuse}");
    let maps = String::from_utf8_lossy(&profile.maps_text);
    assert!(maps.contains("libjemalloc"), "jemalloc was not loaded");

    let dir = scratch_dir("heap_jemalloc_before");
    let before = format!("{JEMALLOC}:{}", lib().display());
    let (files, stderr) = plain_vs_heap(&dir, &program, &["5"], &before, &[]);
    assert!(files.is_empty(), "{files:?}");
    assert!(stderr.contains("heap profile off"), "{stderr}");
}

/// A program with its own malloc, started again as `/proc/self/exe` (Chromium's zygote): the
/// heap profile is off in both processes, each saying the program defines malloc itself (the
/// loader names the second one `/proc/self/exe`, which was once taken for another object,
/// with advice to reorder LD_PRELOAD that could not help).
#[test]
fn a_program_with_its_own_malloc_says_so_under_any_name() {
    let dir = scratch_dir("heap_own_malloc");
    let program = compile_c(&dir, "own_malloc.c", "own_malloc", &["-O2"], false);
    let out = run_ok(
        &program,
        &[],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("HEAPPROFILE", dir.join("h").to_str().unwrap()),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let off: Vec<&str> = stderr.lines().filter(|l| l.contains("heap profile off")).collect();
    assert_eq!(off.len(), 2, "{stderr}");
    for line in off {
        assert!(
            line.contains("the program defines malloc itself") && !line.contains("/proc/self/exe"),
            "{line}"
        );
    }
}

/// A non-PIE program that takes malloc's address (as Debian's python3 does) has an executable
/// symbol named malloc, its "canonical PLT" entry, which dlsym answers: once taken for the
/// program's own malloc, which turned the heap profile off. It is on, and its 64 MiB kept
/// through the pointer are in the profile (sampled: within 25 %, five standard errors).
#[test]
fn a_non_pie_program_taking_mallocs_address_is_profiled() {
    let dir = scratch_dir("heap_non_pie");
    let program = compile_c(
        &dir,
        "non_pie_malloc.c",
        "non_pie_malloc",
        &["-O2", "-no-pie", "-fno-pie"],
        false,
    );
    let prefix = dir.join("h");
    let out = run_ok(
        &program,
        &[],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("HEAPPROFILE", prefix.to_str().unwrap()),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("heap profile off"), "{stderr}");
    let file = dir.join("h.0001.heap");
    let profile = cpuprof::format::heap::HeapProfile::parse(&std::fs::read(&file).unwrap()).unwrap();
    let sampled = profile.totals();
    let (_, inuse) = cpuprof::format::heap::unsample(sampled.inuse_objects, sampled.inuse_bytes, profile.period);
    let expected = 64.0 * 1048576.0;
    assert!(
        (inuse as f64 / expected - 1.0).abs() <= 0.25,
        "{inuse} bytes in use, 64 MiB kept"
    );
    let top = cpuprof_top_text(&file, &["--sample-index", "inuse_space"]);
    assert!(share(&cum_percentages(&top), "through_pointer") >= 95.0, "{top}");
    google_pprof_reads(&program, &file);
}

#[test]
fn python3_under_heapprofile() {
    if !require_tools(&["python3"]) {
        return;
    }
    let dir = scratch_dir("heap_python");
    let script = "import json\nd = [json.dumps({'a': i, 'b': [i] * 10}) for i in range(100000)]\nprint(len(d), sum(map(len, d)))\n";
    // The interpreter itself, not a wrapper script that execs it (pyenv's shims).
    let real = run_ok(Path::new("python3"), &["-c", "import sys; print(sys.executable)"], &[]);
    let python = PathBuf::from(String::from_utf8_lossy(&real.stdout).trim());
    let (files, _) = plain_vs_heap(&dir, &python, &["-c", script], lib().to_str().unwrap(), &[]);
    assert_eq!(files, [dir.join("h.0001.heap")]);
    google_pprof_reads(&python, &files[0]);
}

#[test]
fn jvm_under_heapprofile() {
    if !require_tools(&["java"]) {
        return;
    }
    let dir = scratch_dir("heap_jvm");
    let source = dir.join("Alloc.java");
    std::fs::write(
        &source,
        "public class Alloc { public static void main(String[] a) { long s = 0; \
         for (int i = 0; i < 200000; i++) { s += new StringBuilder().append(i).toString().length(); } \
         System.out.println(s); } }\n",
    )
    .unwrap();
    let java = which("java");
    let (files, _) = plain_vs_heap(
        &dir,
        &java,
        &["-Xshare:off", source.to_str().unwrap()],
        lib().to_str().unwrap(),
        &[],
    );
    assert!(!files.is_empty());
    HeapProfile::parse(&std::fs::read(files.last().unwrap()).unwrap()).unwrap();
}

/// The file `tool` in PATH resolves to.
fn which(tool: &str) -> PathBuf {
    let out = run_ok(Path::new("sh"), &["-c", &format!("command -v {tool}")], &[]);
    std::fs::canonicalize(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}
