//! Heap profiles: the known answer of `tests/c/heap_known.c` (preloaded, `HEAPPROFILE`) and of
//! `examples/heap_sampled.rs` (the `heap::Sampled` global allocator, no preload), each read by
//! our reader and by google-pprof and go tool pprof, in-use and allocated bytes per function
//! within 5 % of what the program counted. The thresholds: at the default sampling (one sample
//! per 512 KiB) and 100 rounds, big_b's in-use bytes rest on ~7,000 samples, a standard error
//! of ~1.2 %; 5 % is four of them.

mod support;
use cpuprof::format::heap::{HeapProfile, HeapValue};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

const ROUNDS: &str = "100";

fn go_pprof_bytes(binary: &Path, profile: &str, value: &str, col: usize) -> HashMap<String, f64> {
    let out = run_ok(
        Path::new("go"),
        &[
            "tool",
            "pprof",
            "-top",
            "-cum",
            "-nodecount=1000",
            &format!("-sample_index={value}"),
            binary.to_str().unwrap(),
            profile,
        ],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    megabytes(&String::from_utf8_lossy(&out.stdout), col)
}

/// Our reader: bytes per function containing the record's first address (the allocating
/// call), named from the binary's symbol table.
fn our_bytes(binary: &Path, profile: &HeapProfile, value: HeapValue) -> HashMap<String, f64> {
    let nm = run_ok(
        Path::new("nm"),
        &["--defined-only", "-S", binary.to_str().unwrap()],
        &[],
    );
    let symbols: Vec<(u64, u64, String)> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() == 4).then(|| {
                (
                    u64::from_str_radix(c[0], 16).unwrap(),
                    u64::from_str_radix(c[1], 16).unwrap(),
                    c[3].to_string(),
                )
            })
        })
        .collect();
    let maps = profile.maps();
    let binary_name = std::fs::canonicalize(binary).unwrap();
    let base = maps
        .entries
        .iter()
        .find(|e| Path::new(&e.path) == binary_name && e.offset == 0)
        .expect("the binary's first mapping")
        .start;
    let mut out = HashMap::new();
    for record in &profile.records {
        let Some(&pc) = record.stack.first() else { continue };
        let at = pc.wrapping_sub(base);
        if let Some((_, _, name)) = symbols
            .iter()
            .find(|(start, size, _)| *start <= at && at < start + size)
        {
            *out.entry(name.clone()).or_insert(0.0) += record.counts.unsampled(profile.period).get(value) as f64;
        }
    }
    out
}

fn the_only_file(dir: &Path, prefix: &str) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().unwrap().to_string_lossy().starts_with(prefix) && p.extension() == Some("heap".as_ref())
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

/// Checks a function's in-use (inuse a, inuse b) and allocated bytes in every reader.
fn check_readers(binary: &Path, profile_path: &Path, truth: [f64; 4], short_names: bool) {
    let [alloc_a, alloc_b, inuse_a, inuse_b] = truth;
    let profile = HeapProfile::parse(&std::fs::read(profile_path).unwrap()).unwrap();
    assert_eq!(profile.period, 512 * 1024);
    // The C program's allocating calls are in big_a and big_b themselves; the Rust one's
    // inside the allocation functions big_a and big_b call, so readers see them as callers.
    if short_names {
        let ours = our_bytes(binary, &profile, HeapValue::InuseSpace);
        assert_within("ours, big_a in use", ours["big_a"], inuse_a);
        assert_within("ours, big_b in use", ours["big_b"], inuse_b);
        let ours = our_bytes(binary, &profile, HeapValue::AllocSpace);
        assert_within("ours, big_a allocated", ours["big_a"], alloc_a);
        assert_within("ours, big_b allocated", ours["big_b"], alloc_b);
    }
    // Cumulative columns: the same numbers whether or not the function is the leaf.
    for (value, a, b) in [("inuse_space", inuse_a, inuse_b), ("alloc_space", alloc_a, alloc_b)] {
        let g = google_pprof_bytes(binary, profile_path, value, 3);
        assert_within(&format!("google-pprof --{value}, big_a"), g["big_a"], a);
        assert_within(&format!("google-pprof --{value}, big_b"), g["big_b"], b);
        let g = go_pprof_bytes(binary, profile_path.to_str().unwrap(), value, 3);
        assert_within(&format!("go tool pprof -sample_index={value}, big_a"), g["big_a"], a);
        assert_within(&format!("go tool pprof -sample_index={value}, big_b"), g["big_b"], b);
    }
}

#[test]
fn preloaded_c_program_known_answer() {
    let dir = scratch_dir("heap_known");
    let program = compile_c(
        &dir,
        "heap_known.c",
        "heap_known",
        &["-O2", "-fno-omit-frame-pointer"],
        false,
    );
    let prefix = dir.join("hk");
    let out = run_alone(
        &program,
        &[ROUNDS],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("HEAPPROFILE", prefix.to_str().unwrap()),
            // One file, at the end.
            ("HEAP_PROFILE_INUSE_INTERVAL", "0"),
            ("HEAP_PROFILE_ALLOCATION_INTERVAL", "0"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("hk.0001.heap (at the end)"), "{stderr}");
    check_readers(&program, &the_only_file(&dir, "hk"), truth(&out.stdout), true);
}

#[test]
fn dump_triggers_write_numbered_files() {
    let dir = scratch_dir("heap_triggers");
    let program = compile_c(&dir, "heap_known.c", "heap_known", &["-O2"], false);
    let prefix = dir.join("t");
    // 10 rounds 50 ms apart, ~170 MiB more in use each: the heap profile's thread, which
    // looks every 100 ms, sees each 500 MiB crossed.
    let out = run_alone(
        &program,
        &["10", "pause"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("HEAPPROFILE", prefix.to_str().unwrap()),
            // The program holds ~1.7 GiB at the end: a file per 500 MiB in use, and the last.
            ("HEAP_PROFILE_INUSE_INTERVAL", "524288000"),
            ("HEAP_PROFILE_ALLOCATION_INTERVAL", "0"),
        ],
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".heap"))
        .collect();
    files.sort();
    // At least two crossings seen (the thread may see two at once on a busy machine), then
    // the last file, numbered from 1 without gaps.
    assert!(files.len() >= 3, "{out:?}");
    let expected: Vec<String> = (1..=files.len()).map(|i| format!("t.{i:04}.heap")).collect();
    assert_eq!(files, expected, "{out:?}");
    assert!(stderr(&out).contains(&format!("{} (at the end)", expected.last().unwrap())));
    // Each later file holds more in use than the one before.
    let inuse: Vec<u64> = files
        .iter()
        .map(|f| {
            let p = HeapProfile::parse(&std::fs::read(dir.join(f)).unwrap()).unwrap();
            p.records.iter().map(|r| r.counts.unsampled(p.period).inuse_bytes).sum()
        })
        .collect();
    assert!(inuse.windows(2).all(|w| w[0] < w[1]), "{inuse:?}");
}

/// A program thread that asks for a file (`HeapProfilerDump`) after loading a library runs
/// cpuprof's code, which refreshes the unwinder's snapshot and writes the file: none of what
/// that allocates is the program's. With every allocation sampled, the files hold the
/// program's 32 blocks and no chain through cpuprof (the snapshot it kept was once ~1 MB in
/// use under `cpuprof::unwind`, found in python3 calling the dump through ctypes).
#[test]
fn allocations_inside_cpuprof_on_a_program_thread_are_not_the_programs() {
    let dir = scratch_dir("heap_own_work");
    let program = compile_c(
        &dir,
        "heap_own_work.c",
        "heap_own_work",
        &["-O2", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"],
        false,
    );
    let prefix = dir.join("o");
    run_alone(
        &program,
        &["libz.so.1"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("HEAPPROFILE", prefix.to_str().unwrap()),
            ("HEAP_PROFILE_SAMPLE", "1"),
            ("HEAP_PROFILE_INUSE_INTERVAL", "0"),
            ("HEAP_PROFILE_ALLOCATION_INTERVAL", "0"),
        ],
    );
    for n in 1..=3 {
        let file = dir.join(format!("o.{n:04}.heap"));
        let top = cpuprof_top_text(&file, &["--sample-index", "alloc_space"]);
        assert!(top.contains("program_block"), "{}: {top}", file.display());
        assert!(
            !top.contains("cpuprof::") && !top.contains("dl_iterate_phdr"),
            "{}: cpuprof's own allocations\n{top}",
            file.display()
        );
    }
}

#[test]
fn rust_global_allocator_known_answer() {
    let example = build_example("heap_sampled", &[]);
    let dir = scratch_dir("heap_sampled");
    let profile = dir.join("rust.heap");
    let out = run_alone(&example, &[profile.to_str().unwrap(), ROUNDS], &[]);
    let truth = truth(&out.stdout);
    check_readers(&example, &profile, truth, false);
    // The program's own report (heap::report): cumulative bytes in use, in bytes.
    let table = String::from_utf8_lossy(&out.stdout);
    let cum = |function: &str| -> f64 {
        let line = table
            .lines()
            .find(|l| l.ends_with(&format!("::{function}")))
            .unwrap_or_else(|| panic!("{function} not in\n{table}"));
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    assert_within("heap::report, big_a in use", cum("big_a"), truth[2]);
    assert_within("heap::report, big_b in use", cum("big_b"), truth[3]);
}

/// Without a heap profile, a preloaded program's allocations are passed through: the same
/// output, no file.
#[test]
fn nothing_without_heapprofile() {
    let dir = scratch_dir("heap_off");
    let program = compile_c(&dir, "heap_known.c", "heap_known", &["-O2"], false);
    let plain = run_ok(&program, &["2"], &[]);
    let preloaded = run_alone(&program, &["2"], &[("LD_PRELOAD", lib().to_str().unwrap())]);
    assert_eq!(plain.stdout, preloaded.stdout);
    assert!(
        preloaded.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&preloaded.stderr)
    );
    let status = Command::new("ls").arg(&dir).output().unwrap();
    assert!(!String::from_utf8_lossy(&status.stdout).contains(".heap"));
}

fn get(address: &str, target: &str) -> (u16, Vec<u8>) {
    http_exchange(
        address,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        std::time::Duration::from_secs(60),
    )
}

/// The endpoint samples the heap of a preloaded program (no HEAPPROFILE needed): `/pprof/heap`
/// and `/debug/pprof/heap` give the known answer to google-pprof and go tool pprof,
/// `/debug/pprof/allocs` defaults to allocated bytes, `/pprof/growth` first shows what is in
/// use, then (nothing allocated since) nothing.
#[test]
fn http_endpoint_known_answer() {
    use std::io::BufRead;
    let dir = scratch_dir("heap_http");
    let program = compile_c(
        &dir,
        "heap_known.c",
        "heap_known",
        &["-O2", "-fno-omit-frame-pointer"],
        false,
    );
    let _alone = alone();
    let mut server = HttpChild::start(&program, &[ROUNDS, "serve"], &[]);
    let mut line = String::new();
    std::io::BufReader::new(server.child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let [alloc_a, alloc_b, inuse_a, inuse_b] = truth(line.as_bytes());

    let (status, text) = get(&server.address, "/pprof/heap");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    let legacy = dir.join("endpoint.heap");
    std::fs::write(&legacy, &text).unwrap();
    let g = google_pprof_bytes(&program, &legacy, "inuse_space", 3);
    assert_within("/pprof/heap, google-pprof, big_a", g["big_a"], inuse_a);
    assert_within("/pprof/heap, google-pprof, big_b", g["big_b"], inuse_b);

    let (status, pb) = get(&server.address, "/debug/pprof/heap");
    assert_eq!(status, 200);
    let proto = dir.join("heap.pb.gz");
    std::fs::write(&proto, &pb).unwrap();
    let g = go_pprof_bytes(&program, proto.to_str().unwrap(), "inuse_space", 3);
    assert_within("/debug/pprof/heap, go tool pprof, big_b in use", g["big_b"], inuse_b);
    let g = go_pprof_bytes(&program, proto.to_str().unwrap(), "alloc_space", 3);
    assert_within("/debug/pprof/heap, go tool pprof, big_a allocated", g["big_a"], alloc_a);
    assert_within("/debug/pprof/heap, go tool pprof, big_b allocated", g["big_b"], alloc_b);

    let (status, pb) = get(&server.address, "/debug/pprof/allocs");
    assert_eq!(status, 200);
    let allocs = dir.join("allocs.pb.gz");
    std::fs::write(&allocs, &pb).unwrap();
    let top = run_ok(
        Path::new("go"),
        &[
            "tool",
            "pprof",
            "-top",
            program.to_str().unwrap(),
            allocs.to_str().unwrap(),
        ],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.contains("Type: alloc_space"), "{top}");

    let (status, grown) = get(&server.address, "/pprof/growth");
    assert_eq!(status, 200);
    let grown = HeapProfile::parse(&grown).unwrap();
    let total: u64 = grown.records.iter().map(|r| r.counts.inuse_bytes).sum();
    assert_within("growth since the start", total as f64, inuse_a + inuse_b);
    let (_, again) = get(&server.address, "/pprof/growth");
    assert!(HeapProfile::parse(&again).unwrap().records.is_empty());

    let (out, _) = server.finish();
    assert!(out.status.success());
}

/// Without the endpoint's sampling, the heap endpoints say how to get one.
#[test]
fn http_endpoint_without_heap_sampling() {
    let _alone = alone();
    let server = HttpChild::start(Path::new("sleep"), &["60"], &[("CPUPROF_HEAP", "0")]);
    let (status, body) = get(&server.address, "/pprof/heap");
    assert_eq!(status, 409);
    assert!(String::from_utf8_lossy(&body).contains("HEAPPROFILE"));
    let mut child = server.child;
    child.kill().unwrap();
    child.wait().unwrap();
}
