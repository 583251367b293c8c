//! The known-answer C workload under LD_PRELOAD and through the C API, checked by our reader
//! and by google-pprof and go tool pprof; and the C API's edge cases.

mod support;

use cpuprof::format::Profile;
use support::*;

const FP_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];
/// Known-answer runs take ~1000 samples (4 CPU-seconds at 250 Hz), so that ±4 points is about
/// three standard deviations of the sampling error; at 100 Hz it would be under two.
const KNOWN_ANSWER_ENV: &[(&str, &str)] = &[("CPUPROFILE_FREQUENCY", "250")];

fn assert_all_readers_agree(binary: &std::path::Path, profile: &std::path::Path) {
    assert_three_to_one("cpuprof top", &cpuprof_top(profile), profile);
    assert_three_to_one("google-pprof", &google_pprof(binary, profile), profile);
    assert_three_to_one("go tool pprof", &go_pprof(binary, profile), profile);
}

#[test]
fn preloaded_sample_total_at_100_hz() {
    let dir = scratch_dir("total");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    let profile = dir.join("hot.prof");
    let out = run_preloaded(&hot, &["3"], &profile, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("PROFILE: interrupts/evictions/bytes = "),
        "summary line: {stderr}"
    );

    let parsed = Profile::parse(&std::fs::read(&profile).unwrap()).unwrap();
    assert_eq!(parsed.period_us, 10_000);
    let sampled = parsed.total_samples() as f64 * parsed.period_us as f64 / 1e6;
    let cpu = reported_cpu_seconds(&out);
    assert!(
        (sampled - cpu).abs() <= 0.10 * cpu,
        "samples x period = {sampled:.2} s, process CPU = {cpu:.2} s"
    );
    assert!(parsed
        .maps
        .entries
        .iter()
        .any(|m| m.path == hot.to_str().unwrap() && m.is_executable()));
}

#[test]
fn preloaded_known_answer() {
    let dir = scratch_dir("preload");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    let profile = dir.join("hot.prof");
    run_preloaded(&hot, &["4"], &profile, KNOWN_ANSWER_ENV);
    assert_all_readers_agree(&hot, &profile);
}

#[test]
fn c_api_known_answer() {
    let dir = scratch_dir("capi");
    let hot = compile_c(&dir, "hot.c", "hot_api", FP_FLAGS, true);
    let profile = dir.join("api.prof");
    run_alone(&hot, &["4", "api", profile.to_str().unwrap()], KNOWN_ANSWER_ENV);
    assert_all_readers_agree(&hot, &profile);
}

#[test]
fn c_api_start_stop_twice_writes_two_valid_files() {
    let dir = scratch_dir("twice");
    let hot = compile_c(&dir, "hot.c", "hot_api", FP_FLAGS, true);
    let (first, second) = (dir.join("1.prof"), dir.join("2.prof"));
    run_ok(
        &hot,
        &["2", "twice", first.to_str().unwrap(), second.to_str().unwrap()],
        &[],
    );
    for file in [first, second] {
        let p = Profile::parse(&std::fs::read(&file).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            p.total_samples() >= 50,
            "{}: {} samples",
            file.display(),
            p.total_samples()
        );
    }
}

#[test]
fn c_api_unwritable_path_fails_cleanly_and_the_program_continues() {
    let dir = scratch_dir("unwritable");
    let hot = compile_c(&dir, "hot.c", "hot_api", FP_FLAGS, true);
    for path in ["/nonexistent-dir/x.prof", dir.to_str().unwrap()] {
        let out = run_ok(&hot, &["0.2", "unwritable", path], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot create profile") && stderr.contains(path),
            "message names path and cause: {stderr}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("checksum 1"));
    }
}

/// SIGKILL after 4 s: with checkpoints (the default) the file is a complete profile; without
/// (`CPUPROFILE_CHECKPOINT=off`) its records harvested so far are readable, the trailer missing.
#[test]
fn killed_process_leaves_a_complete_profile_or_readable_records() {
    let dir = scratch_dir("sigkill");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    for checkpoint in ["2", "off"] {
        let profile = dir.join(format!("killed-{checkpoint}.prof"));
        let mut child = std::process::Command::new(&hot)
            .arg("30")
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE", &profile)
            .env("CPUPROFILE_CHECKPOINT", checkpoint)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_secs(4));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let bytes = std::fs::read(&profile).unwrap();
        let (partial, defect) = Profile::parse_lenient(&bytes).unwrap();
        assert_eq!(defect.is_none(), checkpoint != "off", "{checkpoint}: {defect:?}");
        assert!(
            partial.total_samples() >= 20,
            "{checkpoint}: records written before the kill: {} samples",
            partial.total_samples()
        );
    }
}

#[test]
fn garbage_frame_pointers_are_sampled_without_a_crash() {
    let dir = scratch_dir("garbage");
    let prog = compile_c(
        &dir,
        "garbage_fp.c",
        "garbage_fp",
        &["-O1", "-fno-omit-frame-pointer", "-mno-red-zone"],
        false,
    );
    let profile = dir.join("garbage.prof");
    let out = run_preloaded(&prog, &["2.5", "2"], &profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let p = Profile::parse(&std::fs::read(&profile).unwrap()).unwrap();
    assert!(p.total_samples() >= 1500, "sampled {} times", p.total_samples());
}

#[test]
fn setuid_programs_ignore_cpuprofile() {
    use std::os::unix::fs::PermissionsExt;
    if !require_root("making a setuid program") {
        return;
    }
    let dir = scratch_dir("setuid");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let hot = compile_c(&dir, "hot.c", "hot_linked", FP_FLAGS, true);
    let profile = dir.join("setuid.prof");
    // Control: the same linked program, not setuid, honours CPUPROFILE.
    run_ok(&hot, &["0.1"], &[("CPUPROFILE", profile.to_str().unwrap())]);
    assert!(profile.exists(), "CPUPROFILE autostart works for -lcpuprof programs");
    std::fs::remove_file(&profile).unwrap();
    // setuid to nobody: uid 0 != euid 65534, so the loader sets AT_SECURE.
    let c = std::ffi::CString::new(hot.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    std::fs::set_permissions(&hot, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = run_ok(&hot, &["0.1"], &[("CPUPROFILE", profile.to_str().unwrap())]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("checksum 1"));
    assert!(
        !profile.exists(),
        "a setuid program must not write the profile CPUPROFILE names"
    );
}
