//! Complete stacks for code without frame pointers: DWARF unwinding in the handler.

mod support;

use std::path::Path;
use support::*;

/// gcc -O2 moves `main` to the start of .text (.text.startup), where `go tool pprof` fails to
/// name it — with gperftools' own profiles too; -fno-reorder-functions keeps it in place.
const NO_FP_FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-fno-reorder-functions"];

#[test]
fn known_answer_without_frame_pointers() {
    let dir = scratch_dir("nofp");
    let hot = compile_c(&dir, "hot.c", "hot_nofp", NO_FP_FLAGS, false);
    let profile = dir.join("nofp.prof");
    run_preloaded(&hot, &["4"], &profile, &[("CPUPROFILE_FREQUENCY", "250")]);
    for (reader, table) in [
        ("cpuprof top", cpuprof_top(&profile)),
        ("go tool pprof", go_pprof(&hot, &profile)),
    ] {
        assert_three_to_one(reader, &table, &profile);
        let on_hot = share(&table, "hot_a") + share(&table, "hot_b");
        let main = share(&table, "main");
        assert!(
            main >= 0.95 * on_hot,
            "{reader}: main on {main}% of samples, hot_a+hot_b {on_hot}%: {table:?}"
        );
    }
}

#[test]
fn frame_pointer_walks_cannot_see_through_frameless_code() {
    // The control for the test above: the same binary walked with frame pointers only loses
    // main on most samples, so the DWARF walker is what makes the difference.
    let dir = scratch_dir("nofp-fp");
    let hot = compile_c(&dir, "hot.c", "hot_nofp", NO_FP_FLAGS, false);
    let profile = dir.join("fp.prof");
    run_preloaded(&hot, &["1"], &profile, &[("CPUPROFILE_UNWINDER", "fp")]);
    let table = cpuprof_top(&profile);
    assert!(share(&table, "main") < 50.0, "{table:?}");
}

#[test]
fn handler_needs_little_stack_below_the_interrupted_code() {
    let dir = scratch_dir("headroom");
    let prog = compile_c(&dir, "headroom.c", "headroom", &["-O2"], false);
    let used = |out: &std::process::Output| -> usize { values(out)["stack_used"].parse().unwrap() };
    let own = used(&run_ok(&prog, &["1"], &[]));
    for unwinder in ["auto", "fp"] {
        let out = run_preloaded(
            &prog,
            &["1"],
            &dir.join("headroom.prof"),
            &[("CPUPROFILE_UNWINDER", unwinder), ("CPUPROFILE_FREQUENCY", "1000")],
        );
        // The kernel's signal frame (~3 KiB with AVX-512 state) and the red zone included;
        // this is a debug build of the library (release: see docs/UNWINDING.md).
        let headroom = used(&out) as i64 - own as i64;
        assert!(
            headroom > 0 && headroom < 8192,
            "{unwinder}: the signal took {headroom} bytes below the program's own {own}"
        );
    }
}

/// Flat percentage per function in `perf report` output.
fn perf_flat(perf_data: &Path) -> Vec<(String, f64)> {
    let out = run_ok(
        Path::new("perf"),
        &[
            "report",
            "-i",
            perf_data.to_str().unwrap(),
            "--no-children",
            "--sort",
            "symbol",
            "--stdio",
            "-g",
            "none",
        ],
        &[],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let pct = cols.next()?.strip_suffix('%')?.parse().ok()?;
            let name = cols.nth(1)?.to_string();
            (!name.starts_with("0x")).then_some((name, pct))
        })
        .collect()
}

#[test]
fn python_stacks_are_complete_and_agree_with_perf() {
    if !require_tools(&["perf", "/usr/bin/python3"]) {
        return;
    }
    let dir = scratch_dir("python");
    let script = dir.join("loop.py");
    std::fs::write(
        &script,
        "import time\n\
         def inner(n):\n    s = 0\n    for i in range(n):\n        s += i * i % 7\n    return s\n\
         end = time.process_time() + 6\nt = 0\nwhile time.process_time() < end:\n    t += inner(20000)\nprint(t)\n",
    )
    .unwrap();
    let (profile, perf_data) = (dir.join("py.prof"), dir.join("perf.data"));
    // perf samples the same run; the profiler's variables go to python only, through env(1).
    let preload = format!("LD_PRELOAD={}", lib().display());
    let output = format!("CPUPROFILE={}", profile.display());
    #[rustfmt::skip]
    let perf_args = [
        "record", "-q", "-F", "1000", "--call-graph", "dwarf", "-o", perf_data.to_str().unwrap(), "--",
        "env", &preload, &output, "CPUPROFILE_FREQUENCY=250", "/usr/bin/python3", script.to_str().unwrap(),
    ];
    run_ok(Path::new("perf"), &perf_args, &[]);
    let ours = cpuprof_top(&profile);
    let entry = share(&ours, "_start").max(share(&ours, "__libc_start_main"));
    assert!(
        entry >= 90.0,
        "only {entry}% of samples reach the process entry: {ours:?}"
    );

    let flat = flat_percentages(&profile);
    let theirs = perf_flat(&perf_data);
    for (name, pct) in theirs.iter().take(5) {
        let mine = flat.get(name).copied().unwrap_or(0.0);
        assert!(
            (mine - pct).abs() <= 5.0,
            "{name}: cpuprof {mine}%, perf {pct}%\nperf: {theirs:?}\nours: {flat:?}"
        );
    }
}

#[test]
fn dlopen_and_dlclose_while_profiling() {
    let dir = scratch_dir("dlopen");
    let plugin = dir.join("libplugin.so");
    let cc = std::process::Command::new("cc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(root().join("tests/c/plugin.c"))
        .status()
        .unwrap();
    assert!(cc.success());
    let prog = compile_c(
        &dir,
        "dlopen_loop.c",
        "dlopen_loop",
        &["-O2", "-fomit-frame-pointer", "-ldl"],
        false,
    );
    let profile = dir.join("dlopen.prof");
    let out = run_preloaded(
        &prog,
        &[plugin.to_str().unwrap(), "40", "0.1"],
        &profile,
        &[("CPUPROFILE_FREQUENCY", "250")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let value = |key: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    assert!(text.contains("ok"));
    // 35 cycles between the readings each build and free two snapshots (~1 MiB each here):
    // leaked, they would add tens of MiB.
    let growth = value("rss_late ") - value("rss_early ");
    assert!(
        growth < 4096,
        "resident memory grew by {growth} KiB over 35 dlopen/dlclose cycles"
    );

    let table = cpuprof_top(&profile);
    let (burn, caller, main) = (
        share(&table, "plugin_burn"),
        share(&table, "run_cycle"),
        share(&table, "main"),
    );
    assert!(burn >= 80.0, "the unloaded library's function is named: {table:?}");
    assert!(
        caller >= 0.9 * burn && main >= 0.9 * burn,
        "its callers are found: {table:?}"
    );

    // The same program with no thread of its own: cpuprof adds none (session::threadless), so
    // no writer refreshes the unwinder's snapshot at each dlopen. The library's code is still
    // sampled and named (its mappings are recorded before each dlclose); its callers are found
    // only through frame pointers, which this build omits (docs/DESIGN.md, "A process without
    // a thread of cpuprof's").
    let single = dir.join("dlopen-single.prof");
    run_preloaded(
        &prog,
        &[plugin.to_str().unwrap(), "10", "0.1", "single"],
        &single,
        &[("CPUPROFILE_FREQUENCY", "250")],
    );
    let table = cpuprof_top(&single);
    assert!(share(&table, "plugin_burn") >= 80.0, "single-threaded: {table:?}");
}

/// `[start, end)` of `symbol` in a non-PIE `binary`, from `nm -S`.
fn symbol_range(binary: &Path, symbol: &str) -> (u64, u64) {
    let out = run_ok(
        Path::new("nm"),
        &["-S", "--defined-only", binary.to_str().unwrap()],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let fields = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[3] == symbol)
        .unwrap_or_else(|| panic!("{symbol} not in nm output"));
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    (hex(fields[0]), hex(fields[0]) + hex(fields[1]))
}

#[test]
fn walks_through_the_lazy_binding_stub() {
    // With LD_BIND_NOT=1 every call through the PLT enters ld.so's binding stub
    // (_dl_runtime_resolve_*), whose CFA is rbx-relative, and most samples land in the symbol
    // lookup below it. Every sample must still reach main, and none may hold a PC outside code.
    let dir = scratch_dir("lazy-plt");
    let prog = compile_c(
        &dir,
        "lazy_plt.c",
        "lazy_plt",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-no-pie",
            "-Wl,-z,lazy",
            "-Wl,--no-as-needed",
            "-lm",
        ],
        false,
    );
    let main = symbol_range(&prog, "main");
    let plain = run_ok(&prog, &["250000"], &[("LD_BIND_NOT", "1")]);
    for hz in ["100", "4000"] {
        let profile = dir.join(format!("lazy-{hz}.prof"));
        let out = run_preloaded(
            &prog,
            &["250000"],
            &profile,
            &[("LD_BIND_NOT", "1"), ("CPUPROFILE_FREQUENCY", hz)],
        );
        assert_eq!(out.stdout, plain.stdout, "{hz} Hz: the program's output changed");
        let parsed = read_profile(&profile);
        let total = parsed.total_samples();
        assert!(total >= 50, "{hz} Hz: only {total} samples");
        let mut in_main = 0;
        for sample in &parsed.samples {
            for (i, &pc) in sample.pcs.iter().enumerate() {
                // Return addresses point after their call: look up the call itself.
                let at = if i == 0 { pc } else { pc - 1 };
                assert!(
                    parsed.maps.find(at).is_some_and(|m| m.is_executable()),
                    "{hz} Hz: frame {i} {pc:#x} is not in code: {:x?}",
                    sample.pcs
                );
            }
            if sample.pcs.iter().any(|&pc| (main.0..main.1).contains(&(pc - 1))) {
                in_main += sample.count;
            }
        }
        let share = in_main as f64 / total as f64;
        eprintln!("{hz} Hz: main on {in_main} of {total} samples");
        assert!(share >= 0.95, "{hz} Hz: main on {in_main} of {total} samples");
    }
}
