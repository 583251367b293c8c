//! Hostile input to the HTTP endpoint (`CPUPROF_HTTP`) and to the `cpuprof` command: symbol
//! look-ups in device and FIFO mappings, slow and trickling clients, abandoned profiles, a
//! listening descriptor the program recycles, and crafted profiles.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// `tests/c/endpoint_victim.c`, built once per test.
fn victim(dir: &Path) -> PathBuf {
    compile_c(dir, "endpoint_victim.c", "endpoint_victim", &["-O2"], false)
}

/// The victim program running with the endpoint on a free port.
use support::HttpChild as Served;

/// Everything a server sends on a new connection, up to its close.
fn raw_answer(address: &str) -> String {
    let mut conn = TcpStream::connect(address).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(25))).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn get(address: &str, target: &str, timeout: Duration) -> (u16, Vec<u8>) {
    http_exchange(
        address,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        timeout,
    )
}

/// A field of /proc/PID/status, in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as u64 }
}

/// The run without the profiler, for comparison: same status, same stdout.
fn assert_same_as_plain(program: &Path, args: &[&str], profiled: &Output, plain_stdin: &[u8]) {
    let mut plain = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    plain.stdin.take().unwrap().write_all(plain_stdin).unwrap();
    let plain = plain.wait_with_output().unwrap();
    assert_eq!(
        plain.status.code(),
        profiled.status.code(),
        "exit status, plain vs profiled"
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&profiled.stdout),
        "stdout, plain vs profiled"
    );
}

#[test]
fn symbol_lookups_in_dev_zero_and_fifo_mappings_answer_at_once() {
    let dir = scratch_dir("hostile_symbols");
    let program = victim(&dir);
    let d = dir.to_str().unwrap();
    let served = Served::start(&program, &["idle", d], &[]);
    let addresses_file = dir.join("addresses");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !addresses_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    let text = std::fs::read_to_string(&addresses_file).unwrap();
    let addr = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    let (zero, fifo, main) = (addr("zero"), addr("fifo"), addr("main"));
    let body = format!("{zero}+{fifo}+{main}");
    let request = format!(
        "POST /pprof/symbol HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    // Generous: the answer takes milliseconds; a reader stuck on the FIFO never answers and
    // one reading /dev/zero runs out of memory first.
    let (status, answer) = http_exchange(&served.address, request.as_bytes(), Duration::from_secs(20));
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert_eq!(status, 200, "answer after {took:?}: {answer:?}");
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 1, "only main has a name: {answer}");
    assert!(lines[0].starts_with(&main) && lines[0].ends_with("\tidle"), "{answer}");
    let rss_mb = status_kb(served.pid(), "VmHWM:") / 1024;
    assert!(rss_mb < 100, "peak RSS {rss_mb} MB after the look-ups");
    // The FIFO is still there, unopened by anyone (a reader that opened it would have left
    // it as it is too, but would never have answered).
    assert!(dir.join("mapped (deleted)").exists());
    let (out, _) = served.finish();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    std::fs::remove_file(dir.join("mapped (deleted)")).unwrap();
    assert_same_as_plain(&program, &["idle", d], &out, b"");
    eprintln!("symbol look-up answered in {took:?}, peak RSS {rss_mb} MB");
}

/// Per-request deadline of the endpoint (`cpuprof::http::REQUEST_TIMEOUT`), plus margin.
const SERVED_WITHIN: Duration = Duration::from_secs(10 + 5);

#[test]
fn sixteen_slow_clients_cannot_keep_others_out() {
    let dir = scratch_dir("hostile_slow");
    let program = victim(&dir);
    let served = Served::start(&program, &["idle", dir.to_str().unwrap()], &[]);
    let addr = served.address.clone();
    let started = Instant::now();
    // Every connection slot taken by a client sending one byte per second: each read
    // arrives well within any per-read timeout, but the request never completes.
    let slow: Vec<_> = (0..cpuprof::http::MAX_CONNECTIONS)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut conn = TcpStream::connect(&addr).unwrap();
                let end = Instant::now() + SERVED_WITHIN + Duration::from_secs(5);
                for byte in b"GET /pprof/cmdline HTTP/1.1\r\nX-Slow: ".iter().cycle() {
                    if Instant::now() > end || conn.write_all(&[*byte]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut refused = 0;
    let served_after = loop {
        let (status, body) = get(&addr, "/pprof/cmdline", Duration::from_secs(5));
        if status == 200 {
            assert!(String::from_utf8_lossy(&body).contains("endpoint_victim"));
            break started.elapsed();
        }
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
        refused += 1;
        assert!(
            started.elapsed() < SERVED_WITHIN,
            "still refused after {:?} ({refused} tries)",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        refused > 0,
        "the slow clients never filled the slots: the test proves nothing"
    );
    eprintln!("served after {served_after:?}, {refused} refusals before");
    for t in slow {
        t.join().unwrap();
    }
    let (out, _) = served.finish();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
}

#[test]
fn one_byte_segments_cost_the_program_little_cpu() {
    let dir = scratch_dir("hostile_trickle");
    let program = victim(&dir);
    let served = Served::start(&program, &["idle", dir.to_str().unwrap()], &[]);
    let before = cpu_ticks(served.pid());
    // 16 clients sending a request head one byte per segment, a millisecond apart (so each
    // read finds one byte), for 6 s, reconnecting whenever the endpoint closes on them.
    let end = Instant::now() + Duration::from_secs(6);
    let trickling: Vec<_> = (0..cpuprof::http::MAX_CONNECTIONS)
        .map(|_| {
            let addr = served.address.clone();
            std::thread::spawn(move || {
                let (mut sent, mut connections) = (0, 0);
                while Instant::now() < end {
                    let mut conn = TcpStream::connect(&addr).unwrap();
                    conn.set_nodelay(true).unwrap();
                    connections += 1;
                    let head = b"GET /pprof/cmdline HTTP/1.1\r\nX-Trickle: "
                        .iter()
                        .chain(std::iter::repeat(&b'a'));
                    for byte in head {
                        if Instant::now() >= end || conn.write_all(&[*byte]).is_err() {
                            break;
                        }
                        sent += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                (sent, connections)
            })
        })
        .collect();
    let (sent, connections) = trickling
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0), |(s, c), (s1, c1)| (s + s1, c + c1));
    let used = (cpu_ticks(served.pid()) - before) as f64 / ticks_per_second() as f64;
    eprintln!("{sent} one-byte segments on {connections} connections; the program used {used:.2} s of CPU");
    // Before the read budget and the pause after small reads (one read per byte, the whole
    // head searched after each), the program used 5.96 s of CPU in these 6 s.
    assert!(
        used < 0.5,
        "the program used {used:.2} s of CPU for {sent} one-byte segments on {connections} connections"
    );
    let (out, _) = served.finish();
    assert!(out.status.success());
}

#[test]
fn a_profile_whose_client_left_is_cancelled_at_once() {
    for frequency in ["100", "4000"] {
        let dir = scratch_dir(&format!("hostile_abandoned_{frequency}"));
        let program = victim(&dir);
        let tmp = dir.join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let served = Served::start(
            &program,
            &["idle", dir.to_str().unwrap()],
            &[("CPUPROFILE_FREQUENCY", frequency), ("TMPDIR", tmp.to_str().unwrap())],
        );
        let abandoned = TcpStream::connect(&served.address).unwrap();
        (&abandoned)
            .write_all(b"GET /pprof/profile?seconds=300 HTTP/1.1\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_secs(1));
        // The abandoned profile runs (another is refused), in memory: no temporary file.
        let (busy, _) = get(&served.address, "/pprof/profile?seconds=1", Duration::from_secs(30));
        assert_eq!(busy, 409, "the profile is being taken");
        assert_eq!(
            std::fs::read_dir(&tmp).unwrap().count(),
            0,
            "profiles are taken in memory"
        );
        drop(abandoned);
        let left = Instant::now();
        let status = loop {
            let (status, body) = get(&served.address, "/pprof/profile?seconds=1", Duration::from_secs(30));
            if status != 409 || left.elapsed() > Duration::from_secs(3) {
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                assert!(cpuprof::format::Profile::parse(&body).is_ok());
                break status;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!(
            "{frequency} Hz: new profile {status} {:?} after the client left",
            left.elapsed()
        );
        let leftovers: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(leftovers.is_empty(), "temporary files: {leftovers:?}");
        let (out, _) = served.finish();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    }
}

#[test]
fn a_recycled_listening_descriptor_is_left_to_the_program() {
    const CLIENTS: usize = 20;
    let dir = scratch_dir("hostile_takeover");
    let program = victim(&dir);
    let n = CLIENTS.to_string();
    for frequency in ["100", "4000"] {
        let served = Served::start(&program, &["takeover", &n], &[("CPUPROFILE_FREQUENCY", frequency)]);
        // cpuprof may notice the takeover (and say so) before the program prints its port.
        let mut early = Vec::new();
        let port_line = loop {
            let line = served.stderr.recv_timeout(Duration::from_secs(30)).unwrap();
            if line.starts_with("port ") {
                break line;
            }
            early.push(line);
        };
        let port = port_line.strip_prefix("port ").unwrap();
        // A connection to cpuprof's old port wakes a listener blocked on the old socket, as
        // any client of the endpoint would; the socket is gone or about to be.
        let _ = TcpStream::connect(&served.address);
        let theirs = format!("127.0.0.1:{port}");
        let answers: Vec<String> = (0..CLIENTS).map(|_| raw_answer(&theirs)).collect();
        // The listener looks at its descriptor at least once a second.
        let stopped = match early.into_iter().find(|l| l.contains("stops serving")) {
            Some(line) => Ok(line),
            None => served.stderr.recv_timeout(Duration::from_secs(10)),
        };
        let (out, rest) = served.finish();
        let from_program = answers.iter().filter(|a| a.starts_with("from the program")).count();
        assert_eq!(from_program, CLIENTS, "{frequency} Hz: answers {answers:?}");
        assert!(
            out.status.success(),
            "{:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stopped.as_ref().is_ok_and(|l| l.contains("stops serving")),
            "cpuprof did not say it stopped: {stopped:?} {rest:?}"
        );
        assert_same_as_plain_takeover(&program, &n, &out);
    }
}

/// The takeover run without the profiler: its clients are served by the program too.
fn assert_same_as_plain_takeover(program: &Path, clients: &str, profiled: &Output) {
    let mut plain = Command::new(program)
        .args(["takeover", clients])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = lines_of(plain.stderr.take().unwrap());
    let port_line = stderr.recv_timeout(Duration::from_secs(30)).unwrap();
    let theirs = format!("127.0.0.1:{}", port_line.strip_prefix("port ").unwrap());
    for _ in 0..clients.parse().unwrap() {
        raw_answer(&theirs);
    }
    drop(plain.stdin.take());
    let plain = plain.wait_with_output().unwrap();
    assert_eq!(plain.status.code(), profiled.status.code());
    assert_eq!(plain.stdout, profiled.stdout);
}

/// A raw profile with `records` and `maps` as its maps text.
fn crafted(format: cpuprof::format::SlotFormat, records: &[(u64, Vec<u64>)], maps: &str) -> Vec<u8> {
    let mut w = cpuprof::format::ProfileWriter::new(Vec::new(), format, 10_000).unwrap();
    for (count, pcs) in records {
        w.write_record(*count, pcs).unwrap();
    }
    w.finish(maps.as_bytes()).unwrap()
}

#[test]
fn top_reads_a_profile_of_many_distinct_chains_in_less_than_twice_its_size() {
    use cpuprof::format::SlotFormat;
    let dir = scratch_dir("hostile_cli_many_chains");
    // 250,000 records (20 MB), nearly all distinct chains of 4-12 frames drawn from 40
    // addresses, half in a mapping of a file that is not there: before `top` summed records
    // as it read them it kept every chain, then every chain's names (~9x the file).
    let pool: Vec<u64> = (0..40u64)
        .map(|i| {
            if i % 2 == 0 {
                0x401000 + i * 0x100
            } else {
                0x7000 + i * 8
            }
        })
        .collect();
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut total = 0;
    let records: Vec<(u64, Vec<u64>)> = (0..250_000)
        .map(|_| {
            let (count, depth) = (1 + next() % 5, 4 + next() as usize % 9);
            total += count;
            (count, (0..depth).map(|_| pool[next() as usize % pool.len()]).collect())
        })
        .collect();
    let bytes = crafted(
        SlotFormat::LE64,
        &records,
        "400000-500000 r-xp 00000000 00:00 0 /nonexistent/app\n",
    );
    let profile = dir.join("many.prof");
    std::fs::write(&profile, &bytes).unwrap();
    let run = cpuprof_measured(&dir, &["top", profile.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!("Total: {total} samples")),
        "{}",
        run.stdout
    );
    eprintln!("{} KB profile: peak RSS {} kB", bytes.len() / 1024, run.peak_rss_kb);
    assert!(
        run.peak_rss_kb * 1024 < 2 * bytes.len() as u64,
        "{} byte profile: peak RSS {} kB",
        bytes.len(),
        run.peak_rss_kb
    );
}

/// How one run of the `cpuprof` command went.
struct Measured {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    peak_rss_kb: u64,
}

/// Runs `cpuprof args` under GNU time for its peak RSS (a small process forks it: the
/// rusage of a child spawned from this large test process would start at this one's size),
/// killed after 60 s (a hang is a failure, reported as exit code 137).
fn cpuprof_measured(dir: &Path, args: &[&str]) -> Measured {
    let rss = dir.join("peak_rss");
    let _ = std::fs::remove_file(&rss);
    let out = Command::new("timeout")
        .args(["-s", "KILL", "60", "/usr/bin/time", "-f", "%M", "-o"])
        .arg(&rss)
        .arg(cli())
        .args(args)
        .output()
        .unwrap();
    Measured {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        // GNU time writes "Command exited with non-zero status N" before the number then.
        peak_rss_kb: std::fs::read_to_string(&rss)
            .ok()
            .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{args:?}: no peak RSS (killed?): {:?}", out.status)),
    }
}

/// The commands that read a profile's maps and the binaries they name.
fn reading_commands(dir: &Path, profile: &Path) -> Vec<Vec<String>> {
    let p = profile.to_str().unwrap().to_string();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    [
        vec!["top".into(), p.clone()],
        vec!["collapse".into(), "-o".into(), out("folded"), p.clone()],
        vec![
            "convert".into(),
            "--to".into(),
            "pprof".into(),
            "-o".into(),
            out("out.pb.gz"),
            p.clone(),
        ],
        vec![
            "convert".into(),
            "--to".into(),
            "dcpi".into(),
            "-o".into(),
            out("dcpi"),
            p.clone(),
        ],
        vec!["merge".into(), "-o".into(), out("merged.prof"), p.clone(), p],
    ]
    .into()
}

#[test]
fn maps_naming_a_device_or_a_fifo_are_skipped_with_a_warning() {
    let dir = scratch_dir("hostile_cli_devices");
    let fifo = dir.join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let maps = format!(
        "1000-2000 r-xp 00000000 00:06 4 /dev/zero\n3000-4000 r-xp 00000000 00:06 5 {}\n",
        fifo.display()
    );
    let profile = dir.join("devices.prof");
    let bytes = crafted(
        cpuprof::format::SlotFormat::LE64,
        &[(5, vec![0x1100, 0x3100]), (3, vec![0x3200])],
        &maps,
    );
    std::fs::write(&profile, bytes).unwrap();
    for args in reading_commands(&dir, &profile) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = cpuprof_measured(&dir, &args);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        if args[0] != "merge" {
            for path in ["/dev/zero", fifo.to_str().unwrap()] {
                assert!(
                    run.stderr.contains(&format!("{path}: not a regular file")),
                    "{args:?}: no warning about {path}: {}",
                    run.stderr
                );
            }
        }
        assert!(run.peak_rss_kb < 50 * 1024, "{args:?}: peak RSS {} kB", run.peak_rss_kb);
    }
    let top = cpuprof_measured(&dir, &["top", profile.to_str().unwrap()]);
    assert!(top.stdout.contains("Total: 8 samples"), "{}", top.stdout);
}

#[test]
fn crafted_small_profiles_cannot_make_the_cli_allocate_much() {
    use cpuprof::format::SlotFormat;
    let dir = scratch_dir("hostile_cli_memory");
    // `$build` repeated 20,000 times after a 130 KB `build=` line: 7.6-12.7 GB of path text
    // before substitutions were capped at PATH_MAX.
    let build = format!(
        "build=/{}\n5000-6000 r-xp 00000000 00:06 5 {}\n",
        "a".repeat(130_000),
        "$build/".repeat(20_000)
    );
    let build = crafted(SlotFormat::LE64, &[(1, vec![0x5100])], &build);
    // 3,000 spellings of the path of this process's libc, each mapped and sampled: each was
    // loaded on its own (1.4 GB, 40 s) before objects were keyed by device and inode.
    let libc_path = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .nth(5)
                .filter(|p| p.contains("/libc.so"))
                .map(String::from)
        })
        .expect("libc in this process's maps");
    let (dir_part, file) = libc_path.rsplit_once('/').unwrap();
    let (mut maps, mut records) = (String::new(), Vec::new());
    for i in 0..3000u64 {
        let start = 0x1000_0000 + i * 0x10_0000;
        let spelling = format!(
            "{dir_part}/{}{}{file}",
            "./".repeat(i as usize % 50),
            "/".repeat(i as usize / 50)
        );
        maps.push_str(&format!(
            "{start:x}-{:x} r-xp 00028000 00:06 5 {spelling}\n",
            start + 0x10_0000
        ));
        records.push((1, vec![start + 0x1000]));
    }
    let variants = crafted(SlotFormat::LE32, &records, &maps);
    for (name, bytes) in [("build", build), ("variants", variants)] {
        let profile = dir.join(format!("{name}.prof"));
        std::fs::write(&profile, &bytes).unwrap();
        for args in reading_commands(&dir, &profile) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = cpuprof_measured(&dir, &args);
            assert_eq!(run.code, Some(0), "{name} {args:?}: {}", run.stderr);
            eprintln!(
                "{name} ({} KB) {}: peak RSS {} kB",
                bytes.len() / 1024,
                args[0],
                run.peak_rss_kb
            );
            // 100 MB: reading the named object once, with its separate debug file (libc's,
            // from libc6-dbg, is ~45 MB of peak RSS), where these files used to take
            // 1.4-12.7 GB.
            assert!(
                run.peak_rss_kb < 100 * 1024,
                "{name} ({} bytes) {args:?}: peak RSS {} kB",
                bytes.len(),
                run.peak_rss_kb
            );
        }
    }
}

#[test]
fn counts_near_two_to_the_64_are_refused_with_the_record_never_wrapped() {
    use cpuprof::format::SlotFormat;
    let dir = scratch_dir("hostile_cli_counts");
    let maps = "1000-2000 r-xp 00000000 00:06 4 /nonexistent/app\n";
    let write = |name: &str, records: &[(u64, Vec<u64>)]| {
        let path = dir.join(name);
        std::fs::write(&path, crafted(SlotFormat::LE64, records, maps)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let over = write("over.prof", &[(u64::MAX - 10, vec![0x1100]), (20, vec![0x1200])]);
    let full = write("full.prof", &[(u64::MAX - 10, vec![0x1100]), (10, vec![0x1200])]);
    let half = write("half.prof", &[(1 << 63, vec![0x1100])]);
    let merged = dir.join("merged.prof");
    let merged = merged.to_str().unwrap();
    for args in [
        vec!["top", &over],
        vec!["check", &over],
        vec!["convert", "--to", "pprof", "-o", merged, &over],
        vec!["merge", "-o", merged, &over],
    ] {
        let run = cpuprof_measured(&dir, &args);
        assert_eq!(run.code, Some(1), "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("at byte offset 64") && run.stderr.contains("past 2^64 - 1"),
            "{args:?}: {}",
            run.stderr
        );
    }
    // Exactly 2^64 - 1 samples is a valid profile, and every total says so.
    let run = cpuprof_measured(&dir, &["top", &full]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("Total: 18446744073709551615 samples"),
        "{}",
        run.stdout
    );
    let run = cpuprof_measured(&dir, &["collapse", &full]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "[app] 18446744073709551615\n");
    // Two profiles whose sum passes 2^64 - 1 are not merged.
    let run = cpuprof_measured(&dir, &["merge", "-o", merged, &half, &half]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("would pass 2^64 - 1"), "{}", run.stderr);
}

#[test]
fn a_connection_descriptor_recycled_mid_request_is_neither_written_nor_closed() {
    let dir = scratch_dir("hostile_squat");
    let program = victim(&dir);
    let d = dir.to_str().unwrap();
    let mut served = Served::start(&program, &["squat", d], &[]);
    let mut stdout = BufReader::new(served.child.stdout.take().unwrap());
    // A request whose head is not complete: its connection thread waits in a read.
    let mut client = TcpStream::connect(&served.address).unwrap();
    client.write_all(b"GET /pprof/cmdline HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The program closes every descriptor and opens files of its own on the numbers.
    let stdin = served.stdin.as_mut().unwrap();
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "squatting\n");
    // The request completes; its response must not go into the program's file.
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = client.write_all(b"\r\n");
    let mut answer = Vec::new();
    let _ = client.read_to_end(&mut answer);
    drop(served.stdin.take());
    let status = served.child.wait().unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "files intact\n", "{status:?}");
    assert!(status.success());
    // Without the profiler: the same output.
    let mut plain = Command::new(&program)
        .args(["squat", d])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    plain.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let plain = plain.wait_with_output().unwrap();
    assert!(plain.status.success());
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "squatting\nfiles intact\n");
}
