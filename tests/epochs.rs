//! Epoch mode (`CPUPROFILE_DB`): the profile rolls over into a database of complete epoch
//! files, `DB/<epoch start UTC>/<program>.<pid>.prof`, read by every reader; nothing lost or
//! counted twice at the roll-overs (the exact version of that, through the table without
//! signals, is the writer's unit test `samples_counted_during_roll_overs_are_written_once`);
//! finished epochs survive SIGKILL; memory and descriptors stay flat under a byte budget; and
//! several processes, forked and exec'ed, share one database.

mod support;

use cpuprof::format::database::parse_epoch_name;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

fn cpuprof(args: &[&str]) -> Output {
    Command::new(cli())
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap()
}

/// The database's epoch directories (by name) and their files (by name); entries removed
/// while they are listed (by the budget of a running writer) are skipped.
fn database(db: &Path) -> BTreeMap<String, Vec<String>> {
    let Ok(entries) = std::fs::read_dir(db) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let mut files: Vec<String> = std::fs::read_dir(e.path())
                .ok()?
                .flatten()
                .map(|f| f.file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            Some((e.file_name().to_string_lossy().into_owned(), files))
        })
        .collect()
}

/// Every finished epoch file (not the temporary ones, which start with a dot).
fn finished_files(db: &Path) -> Vec<PathBuf> {
    database(db)
        .iter()
        .flat_map(|(epoch, files)| {
            files
                .iter()
                .filter(|f| !f.starts_with('.') && f.ends_with(".prof"))
                .map(move |f| db.join(epoch).join(f))
        })
        .collect()
}

fn epoch_env<'a>(db: &'a Path, epoch: &'a str, hz: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("LD_PRELOAD", lib().to_str().unwrap()),
        ("CPUPROFILE_DB", db.to_str().unwrap()),
        ("CPUPROFILE_EPOCH", epoch),
        ("CPUPROFILE_FREQUENCY", hz),
    ]
}

fn wall_seconds(out: &Output) -> f64 {
    values(out)["wall"].trim().parse().unwrap()
}

/// 10 s of hot.c in 1-s epochs: at least one complete file per whole epoch the run spans,
/// each valid for `cpuprof check`, google-pprof and go tool pprof; the summed samples per
/// CPU-second match a single-file run's within sampling error; the output is the plain run's;
/// the CLI reads the database (`db`, `top --db`) as the files merged.
#[test]
fn epochs_of_a_known_workload_are_complete_profiles_summing_to_a_single_run() {
    let dir = scratch_dir("epochs_hot");
    let program = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let plain = run_ok(&program, &["10"], &[]);
    // The rate of samples per CPU-second of one file, from a shorter run.
    let single = dir.join("single.prof");
    let one = run_preloaded(&program, &["4"], &single, &[]);
    let single_rate = read_profile(&single).total_samples() as f64 / reported_cpu_seconds(&one);

    let db = dir.join("db");
    let out = run_ok(&program, &["10"], &epoch_env(&db, "1", "100"));
    assert_eq!(values(&out)["checksum"], values(&plain)["checksum"]);
    let files = finished_files(&db);
    let whole_epochs = wall_seconds(&out).floor() as usize;
    assert!(
        files.len() + 1 >= whole_epochs && whole_epochs >= 9,
        "{} files for {whole_epochs} epochs: {:?}",
        files.len(),
        database(&db)
    );
    assert!(
        database(&db).values().flatten().all(|f| !f.starts_with('.')),
        "no temporary file is left: {:?}",
        database(&db)
    );
    let mut total = 0;
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("hot.") && name.ends_with(".prof"), "{name}");
        let check = cpuprof(&["check", file.to_str().unwrap()]);
        assert!(check.status.success(), "{}: {check:?}", file.display());
        let samples = read_profile(file).total_samples();
        total += samples;
        // Every reader takes every epoch file (an epoch of 1 s is too few samples for shares,
        // which are checked on the sum below); an epoch the program only began or ended in may
        // hold no sample.
        let g = google_pprof(&program, file);
        assert!(
            samples == 0 || g.contains_key("hot_a") || g.contains_key("hot_b"),
            "google-pprof {}: {g:?}",
            file.display()
        );
        let p = go_pprof(&program, file);
        assert!(
            samples == 0 || p.contains_key("hot_a") || p.contains_key("hot_b"),
            "go tool pprof {}: {p:?}",
            file.display()
        );
    }
    let rate = total as f64 / reported_cpu_seconds(&out);
    // ~1000 and ~400 samples: standard errors of ~3 % and ~5 % on the rates; 4 of them on the
    // difference.
    let margin = 4.0 * (1.0f64 / 1000.0 + 1.0 / 400.0).sqrt();
    assert!(
        (rate / single_rate - 1.0).abs() <= margin,
        "epochs: {total} samples, {rate:.1}/CPU-s; one file: {single_rate:.1}/CPU-s"
    );
    // The epochs merged (`cpuprof merge`) give the workload's 3:1 known answer.
    let merged = dir.join("merged.prof");
    let mut args = vec!["merge", "-o", merged.to_str().unwrap()];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = cpuprof(&args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read_profile(&merged).total_samples(), total);
    assert_three_to_one("cpuprof top of the merged epochs", &cpuprof_top(&merged), &merged);
    assert_three_to_one(
        "google-pprof of the merged epochs",
        &google_pprof(&program, &merged),
        &merged,
    );

    // The CLI reads the database itself: `top --db` is `top` of the merged files, and `db`
    // lists one program, one process, every epoch and every sample.
    let db_arg = db.to_str().unwrap();
    let of_db = cpuprof(&["top", "-n", "20", "--db", db_arg]);
    let of_merge = cpuprof(&["top", "-n", "20", merged.to_str().unwrap()]);
    assert!(of_db.status.success(), "{of_db:?}");
    assert_eq!(
        String::from_utf8_lossy(&of_db.stdout),
        String::from_utf8_lossy(&of_merge.stdout)
    );
    let listing = cpuprof(&["db", db_arg]);
    let listing = String::from_utf8_lossy(&listing.stdout);
    let row = listing
        .lines()
        .find(|l| l.starts_with("hot "))
        .unwrap_or_else(|| panic!("{listing}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols[1..5],
        [files.len().to_string(), "1".into(), total.to_string(), "0".into()],
        "{listing}"
    );
}

/// SIGKILL at a random moment: every finished epoch passes `check`; the epoch being written
/// is the temporary file, complete as of its last checkpoint (it passes `check` too).
#[test]
fn sigkill_leaves_finished_epochs_intact_and_the_last_one_complete() {
    let dir = scratch_dir("epochs_kill");
    let program = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    for hz in ["100", "4000"] {
        let db = &dir.join(format!("db{hz}"));
        let mut child = Command::new(&program)
            .arg("30")
            .envs(epoch_env(db, "0.2", hz))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // A moment from the subsecond clock: anywhere in an epoch, after at least 5 of them.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        std::thread::sleep(Duration::from_millis(1000 + u64::from(nanos % 1000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        let files = finished_files(db);
        assert!(files.len() >= 3, "{hz} Hz: {:?}", database(db));
        for file in &files {
            let check = cpuprof(&["check", file.to_str().unwrap()]);
            assert!(check.status.success(), "{hz} Hz, {}: {check:?}", file.display());
        }
        let temporary: Vec<PathBuf> = database(db)
            .iter()
            .flat_map(|(epoch, fs)| {
                fs.iter()
                    .filter(|f| f.starts_with('.'))
                    .map(move |f| db.join(epoch).join(f))
            })
            .collect();
        // The epoch being written when the kill came (none if it came between the rename
        // and the next open, which is rare), and the one before it if the kill came during a
        // roll-over, which opens the next file before it completes the last.
        assert!(temporary.len() <= 2, "{temporary:?}");
        for t in &temporary {
            assert!(t.to_string_lossy().ends_with(".prof.tmp"), "{}", t.display());
            let check = cpuprof(&["check", t.to_str().unwrap()]);
            assert!(
                check.status.success(),
                "{hz} Hz: a killed epoch is complete as of its last checkpoint: {check:?}"
            );
            let top = cpuprof(&["top", "--binary", program.to_str().unwrap(), t.to_str().unwrap()]);
            assert!(top.status.success(), "{hz} Hz: {top:?}");
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The fewest descriptors `pid` held over 20 looks 10 ms apart: the writer holds one or two
/// more for a moment while it rolls an epoch over (the next file, the database directory), and a
/// leak would raise the floor, not just one look.
fn open_fds(pid: u32) -> usize {
    (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
        })
        .min()
        .unwrap()
}

fn bytes_in(db: &Path) -> u64 {
    database(db)
        .iter()
        .flat_map(|(epoch, files)| files.iter().map(move |f| db.join(epoch).join(f)))
        .filter_map(|p| std::fs::symlink_metadata(p).ok().map(|m| m.len()))
        .sum()
}

/// 2,000 epochs of 50 ms at 1000 Hz: RSS and open descriptors after the first 100 epochs do not
/// grow; the database stays within its byte budget (plus the epoch being written); the epochs
/// removed are always the oldest.
#[test]
fn soak_keeps_memory_descriptors_and_the_database_flat() {
    let dir = scratch_dir("epochs_soak");
    let program = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let db = dir.join("db");
    // A link and a stranger inside the database: never followed, never removed.
    std::fs::create_dir_all(&db).unwrap();
    let outside = dir.join("outside");
    std::fs::create_dir_all(outside.join("keep")).unwrap();
    std::os::unix::fs::symlink(&outside, db.join("20000101T000000.000Z")).unwrap();
    std::fs::create_dir_all(db.join("notes")).unwrap();
    let budget: u64 = 300_000;
    let mut child = Command::new(&program)
        .args(["0", "stdin"])
        .envs(epoch_env(&db, "0.05", "1000"))
        .env("CPUPROFILE_DB_MAX_BYTES", budget.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let epochs_so_far = |db: &Path| -> usize {
        // Epoch directories ever made: the newest's start minus the first's, in epochs.
        let names: Vec<String> = database(db).keys().filter(|n| n.starts_with("20")).cloned().collect();
        names.len()
    };
    let spawned = std::time::SystemTime::now();
    std::thread::sleep(Duration::from_secs(5)); // 100 epochs of 50 ms
    let (rss_early, fds_early) = (rss_kib(pid), open_fds(pid));
    let mut seen: Vec<String> = Vec::new();
    let mut max_bytes = 0;
    let mut orders_checked = 0;
    let start_of = |name: &str| parse_epoch_name(name).unwrap_or_else(|| panic!("{name}"));
    // Until the newest epoch is the 2,000th of 50 ms since the program started (at most 5 min).
    let mut spanned = Duration::ZERO;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while spanned < Duration::from_millis(50 * 2000) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now: Vec<String> = database(&db).keys().filter(|n| n.starts_with("202")).cloned().collect();
        // Oldest first: whatever was seen before and is gone now is older than all that is left
        // of what was seen.
        let gone: Vec<&String> = seen.iter().filter(|n| !now.contains(n)).collect();
        let kept_oldest = seen.iter().find(|n| now.contains(n));
        if let (Some(newest_gone), Some(kept)) = (gone.iter().max(), kept_oldest) {
            assert!(*newest_gone < kept, "{newest_gone} removed before {kept}");
            orders_checked += 1;
        }
        if let Some(newest) = now.last() {
            spanned = start_of(newest).duration_since(spawned).unwrap_or_default();
        }
        seen = now;
        max_bytes = max_bytes.max(bytes_in(&db));
    }
    assert!(
        spanned >= Duration::from_millis(50 * 2000),
        "epochs written over {spanned:?}: fewer than 2,000"
    );
    let (rss_late, fds_late) = (rss_kib(pid), open_fds(pid));
    child.stdin.take().unwrap().write_all(b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let files = finished_files(&db);
    assert!(epochs_so_far(&db) >= 2, "{:?}", database(&db));
    // One epoch's file is ~3 to 30 KB: the budget holds some 10+ epochs.
    let largest = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).max().unwrap();
    assert!(
        max_bytes <= budget + 2 * largest,
        "the database reached {max_bytes} bytes for a budget of {budget} (largest file {largest})"
    );
    assert!(orders_checked >= 10, "removals seen {orders_checked} times");
    assert!(fds_late <= fds_early, "descriptors {fds_early} -> {fds_late}");
    // The writer's buffers, the table's touched pages and the maps text are reused: a few
    // hundred KiB of noise (malloc arenas) at most, not the ~50 KiB an epoch would add each.
    assert!(rss_late <= rss_early + 1024, "RSS {rss_early} KiB -> {rss_late} KiB");
    for f in &files {
        let check = cpuprof(&["check", f.to_str().unwrap()]);
        assert!(check.status.success(), "{}: {check:?}", f.display());
    }
    assert!(outside.join("keep").is_dir(), "the link was followed");
    assert!(
        db.join("notes").is_dir(),
        "a directory not named as an epoch was removed"
    );
    eprintln!(
        "soak: RSS {rss_early} -> {rss_late} KiB, fds {fds_early} -> {fds_late}, database at most {max_bytes} bytes (budget {budget}), {} epoch files left",
        files.len()
    );
}

/// 4 processes at once, each forking a child that computes (profiled from the fork) and one
/// that execs (a profiled process of its own), then exec'ing itself (same pid, same program,
/// maybe the same epoch): every profiled process's samples are all there (none overwritten or
/// missing), and only profiled processes wrote files.
#[test]
fn four_processes_with_forks_and_execs_share_one_database() {
    let dir = scratch_dir("epochs_four");
    let program = compile_c(&dir, "epoch_workers.c", "epoch_workers", FLAGS, false);
    let db = dir.join("db");
    for hz in ["100", "4000"] {
        let _ = std::fs::remove_dir_all(&db);
        let children: Vec<_> = (0..4)
            .map(|_| {
                Command::new(&program)
                    .arg("0.6")
                    .envs(epoch_env(&db, "0.25", hz))
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Main-thread CPU seconds per profiled pid (the last line a pid printed: the clock
        // carries over exec).
        let mut cpu: HashMap<u32, f64> = HashMap::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let w: Vec<&str> = line.split_whitespace().collect();
                cpu.insert(w[1].parse().unwrap(), w[3].parse().unwrap());
            }
        }
        assert_eq!(
            cpu.len(),
            12,
            "4 parents, their forked and their exec'ed children: {cpu:?}"
        );
        let mut samples: HashMap<u32, u64> = HashMap::new();
        let files = finished_files(&db);
        for f in &files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            let pid: u32 = name.rsplit('.').nth(1).unwrap().parse().unwrap();
            let program = name.rsplitn(3, '.').nth(2).unwrap();
            assert!(
                program == "epoch_workers" || program.starts_with("epoch_workers~"),
                "{name}"
            );
            assert!(cpu.contains_key(&pid), "{name}: not a profiled process's");
            let check = cpuprof(&["check", f.to_str().unwrap()]);
            assert!(check.status.success(), "{name}: {check:?}");
            *samples.entry(pid).or_default() += read_profile(f).total_samples();
        }
        assert!(
            database(&db).values().flatten().all(|f| !f.starts_with('.')),
            "{:?}",
            database(&db)
        );
        // The CLI takes the database as it is: one program (self-exec images, `~N`, are the same
        // program and process), 12 processes, every sample.
        let listing = cpuprof(&["db", db.to_str().unwrap()]);
        let listing = String::from_utf8_lossy(&listing.stdout);
        let row = listing
            .lines()
            .find(|l| l.starts_with("epoch_workers "))
            .unwrap_or_else(|| panic!("{listing}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        let total: u64 = samples.values().sum();
        assert_eq!(
            cols[2..5],
            ["12".to_string(), total.to_string(), "0".into()],
            "{listing}"
        );
        assert!(listing.contains(": 1 programs,"), "{listing}");
        let period = if hz == "100" { 0.01 } else { 0.00025 };
        for (pid, seconds) in &cpu {
            let got = samples.get(pid).copied().unwrap_or(0) as f64 * period;
            // A missing or overwritten epoch file is a quarter of a process's samples or more.
            assert!(
                (got / seconds - 1.0).abs() < 0.2,
                "{hz} Hz: pid {pid} used {seconds} CPU-s, its epoch files hold {got} s: {:?}",
                database(&db)
            );
        }
    }
}

/// The C API (`CpuprofStartDatabase`, then `ProfilerStop`) and the Rust builder write the
/// same layout; the last epoch is completed at stop.
#[test]
fn c_and_rust_front_ends_write_epochs() {
    let dir = scratch_dir("epochs_api");
    let program = compile_c(&dir, "hot.c", "hot_api", FLAGS, true);
    let db = dir.join("c");
    let db_arg = db.to_str().unwrap();
    let out = run_ok(&program, &["1", "db", db_arg, "0.2"], &[]);
    assert_eq!(values(&out)["checksum"], "1");
    let files = finished_files(&db);
    assert!(files.len() >= 4, "{:?}", database(&db));
    let mut total = 0;
    for f in &files {
        assert!(f.file_name().unwrap().to_string_lossy().starts_with("hot_api."));
        total += read_profile(f).total_samples();
    }
    let expected = reported_cpu_seconds(&out) * 100.0;
    assert!(
        (total as f64 - expected).abs() <= 0.25 * expected,
        "{total} samples for {expected}"
    );

    let db = dir.join("rust");
    let guard = cpuprof::Profiler::builder()
        .epochs(Duration::from_millis(100))
        .database_budget(Some(10_000_000), None)
        .report_on_stderr(false)
        .start(&db)
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_millis(600);
    let mut x = 1u64;
    while std::time::Instant::now() < end {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    let report = guard.stop().unwrap();
    assert_eq!(report.path.as_ref(), Some(&db));
    let files = finished_files(&db);
    assert!(files.len() >= 4, "{:?}", database(&db));
    for f in &files {
        read_profile(f);
    }
    assert!(database(&db).values().flatten().all(|f| !f.starts_with('.')));
}
