//! Stacks that cannot be read safely without the kernel's help, and signal stacks too small
//! for any signal frame (tests/c/stacks.c). With the profiler the program must behave exactly
//! as without it — same output, same exit status — and leave a valid profile. Each case runs
//! with frame-pointer and default (DWARF) walks, at 100 and 4000 samples per second.

mod support;

use cpuprof::format::Profile;
use std::path::PathBuf;
use support::*;

const UNWINDERS: &[&str] = &["fp", "auto"];
const FREQUENCIES: &[&str] = &["100", "4000"];

fn stacks() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("stacks-bin");
            compile_c(
                &dir,
                "stacks.c",
                "stacks",
                &["-O1", "-fno-omit-frame-pointer", "-mno-red-zone"],
                false,
            )
        })
        .clone()
}

/// Runs `args` plainly and under every unwinder and frequency; asserts identical stdout and
/// exit status and a valid profile. Returns the profiles with what each run printed on stderr.
fn behaves_the_same(args: &[&str]) -> Vec<(Profile, String)> {
    let prog = stacks();
    PlainVsProfiled::new(&format!("{args:?}"), &scratch_dir(&format!("stacks-{}", args[0])))
        .across("CPUPROFILE_UNWINDER", UNWINDERS)
        .across("CPUPROFILE_FREQUENCY", FREQUENCIES)
        .plain_succeeds()
        .run(|run| run_program(&prog, args, &run.env, &[]))
        .profiled
        .into_iter()
        .map(|p| {
            let profile =
                Profile::parse(&std::fs::read(&p.profile).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.run.what));
            (profile, stderr(&p.out))
        })
        .collect()
}

#[test]
fn frames_on_pages_another_thread_unmaps_are_read_without_a_fault() {
    // Before stack reads went through the kernel: SIGSEGV in every run (a page probed
    // readable, then unmapped by the mapper thread before the load).
    for (profile, stderr) in behaves_the_same(&["munmap", "1.5"]) {
        assert!(!stderr.contains("/proc/self/mem"), "{stderr}");
        // The fake frames all return to the same address: a stack repeating one address was
        // walked through at least two churned pages, so the race was really run.
        let through_churned_pages = profile
            .samples
            .iter()
            .filter(|s| s.pcs.windows(2).any(|w| w[0] == w[1]))
            .map(|s| s.count)
            .sum::<u64>();
        assert!(
            through_churned_pages >= 20,
            "only {through_churned_pages} of {} samples walked the churned frames",
            profile.total_samples()
        );
    }
}

#[test]
fn threads_with_2048_byte_sigaltstacks_are_sampled_without_dying() {
    // With SA_ONSTACK the kernel found no room for its signal frame (3.4 KiB here) on a
    // 2,048-byte altstack and killed the program at its first sample.
    for (profile, _) in behaves_the_same(&["altstack", "0.5"]) {
        // 4 threads x 0.5 s: 200 samples expected at 100 Hz.
        assert!(profile.total_samples() >= 100, "{} samples", profile.total_samples());
    }
}

#[test]
fn a_handler_running_on_its_small_altstack_survives_our_signal() {
    // The kernel nests any signal delivered there on the same altstack, which has room for
    // the program's own handler only: our signal must wait until that handler returns. The
    // program also checks that its handler's mask reads back as it set it.
    behaves_the_same(&["handler", "1"]);
}
