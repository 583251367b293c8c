//! The on-demand HTTP endpoint (`CPUPROF_HTTP`) of a running known-answer program: read by go
//! tool pprof and google-pprof over the network, a long series of profiles plus hostile
//! requests that leave the program's output intact and leak no thread or descriptor, and the
//! 409 answers to a second profile while one is being taken; a stripped program's functions
//! named for both readers, and the protobuf checked by pprof's own `profile` package.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// The known-answer program, working until its stdin closes, with the endpoint on a free port.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    address: String,
}

impl Server {
    fn start(name: &str, extra_env: &[(&str, &str)]) -> Server {
        let dir = scratch_dir(name);
        let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
        Server::run(&hot, &["0", "stdin"], extra_env)
    }

    fn run(program: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(program)
            .args(args)
            .env("LD_PRELOAD", lib())
            .env("CPUPROF_HTTP", "127.0.0.1:0")
            .env("CPUPROFILE_FREQUENCY", "1000")
            .envs(extra_env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let address = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no address announced on stderr: {line:?}"))
            .to_string();
        // Keep draining stderr so the program never blocks on it.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Server {
            stdin: child.stdin.take(),
            child,
            address,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Threads and open descriptors of the program.
    fn resources(&self) -> (usize, usize) {
        let count = |dir: String| std::fs::read_dir(dir).unwrap().count();
        let pid = self.child.id();
        (count(format!("/proc/{pid}/task")), count(format!("/proc/{pid}/fd")))
    }

    /// Closes stdin and returns the program's output, asserting a clean exit.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "the program failed: {:?}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// One raw HTTP exchange: the status and the body.
fn exchange(address: &str, request: &[u8]) -> (u16, Vec<u8>) {
    http_exchange(address, request, Duration::from_secs(60))
}

fn get(address: &str, target: &str) -> (u16, Vec<u8>) {
    exchange(address, format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
}

fn assert_three_to_one_flat(reader: &str, output: &str) {
    let table = percentages(output, 1);
    let (a, b) = (share(&table, "hot_a"), share(&table, "hot_b"));
    assert!(
        (a - 75.0).abs() <= 5.0 && (b - 25.0).abs() <= 5.0,
        "{reader}: hot_a {a}%, hot_b {b}% (want 75/25 ± 5)\n{output}"
    );
}

#[test]
fn go_pprof_and_google_pprof_profile_a_running_program() {
    let server = Server::start("http_readers", &[]);
    let home = std::env::temp_dir();
    let home = [("HOME", home.to_str().unwrap())];
    let go = run_ok(
        Path::new("go"),
        &["tool", "pprof", "-top", &server.url("/debug/pprof/profile?seconds=2")],
        &home,
    );
    assert_three_to_one_flat("go tool pprof", &String::from_utf8_lossy(&go.stdout));
    let perl = run_ok(
        Path::new("google-pprof"),
        &["--text", &server.url("/pprof/profile?seconds=2")],
        &home,
    );
    assert_three_to_one_flat("google-pprof", &String::from_utf8_lossy(&perl.stdout));
    assert!(server.finish().contains("checksum 1"));
}

#[test]
fn many_profiles_and_hostile_requests_leave_the_program_alone() {
    let server = Server::start("http_load", &[]);
    let addr = server.address.clone();
    // Before any request: the program's thread and the listener.
    let baseline = server.resources();
    // A slow client: connects, sends half a request line, and goes quiet.
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /pprof/sym").unwrap();
    let hostile: Vec<(Vec<u8>, u16)> = vec![
        (b"DELETE /pprof/profile HTTP/1.1\r\n\r\n".to_vec(), 405),
        (b"BREW /pprof/symbol HTTP/1.1\r\n\r\n".to_vec(), 405),
        (b"GET /pprof/profile?seconds=-1 HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"GET /pprof/profile?seconds=1e9 HTTP/1.1\r\n\r\n".to_vec(), 400),
        (
            b"GET /debug/pprof/profile?seconds=999999999999 HTTP/1.1\r\n\r\n".to_vec(),
            400,
        ),
        (
            [
                b"GET /pprof/symbol HTTP/1.1\r\nX-Big: ".to_vec(),
                vec![b'a'; 64 * 1024],
                b"\r\n\r\n".to_vec(),
            ]
            .concat(),
            431,
        ),
        (
            b"POST /pprof/symbol HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n".to_vec(),
            413,
        ),
        (
            b"POST /pprof/symbol HTTP/1.1\r\nContent-Length: 6\r\n\r\n0xzzzz".to_vec(),
            400,
        ),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n".to_vec(),
            400,
        ),
        (b"GET /pprof/heap HTTP/1.1\r\n\r\n".to_vec(), 501),
        (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n".to_vec(), 404),
    ];
    for round in 0..30 {
        let (status, body) = get(&addr, "/pprof/profile?seconds=1");
        assert_eq!(status, 200, "profile {round}: {}", String::from_utf8_lossy(&body));
        let profile = cpuprof::format::Profile::parse(&body).unwrap();
        assert!(
            profile.total_samples() > 200,
            "profile {round}: {} samples",
            profile.total_samples()
        );
        let (request, want) = &hostile[round % hostile.len()];
        assert_eq!(
            exchange(&addr, request).0,
            *want,
            "{:?}",
            String::from_utf8_lossy(&request[..40.min(request.len())])
        );
    }
    drop(slow);
    // Every connection thread ends (the slow client's by its timeout), the profiles' writer
    // threads are gone, and every descriptor is closed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.resources() != baseline && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(server.resources(), baseline, "(threads, fds) after the load");
    let output = server.finish();
    assert!(output.contains("checksum 1"), "{output}");
}

#[test]
fn one_profile_at_a_time_and_never_over_the_programs_own() {
    let server = Server::start("http_busy", &[]);
    let addr = server.address.clone();
    let first = {
        let addr = addr.clone();
        std::thread::spawn(move || get(&addr, "/debug/pprof/profile?seconds=3"))
    };
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = get(&addr, "/pprof/profile?seconds=1");
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("one profile at a time"));
    assert_eq!(first.join().unwrap().0, 200);
    server.finish();

    // The program profiles itself (CPUPROFILE): an on-demand request is refused, and the
    // program's profile comes out whole.
    let file: PathBuf = scratch_dir("http_own").join("own.prof");
    let server = Server::start("http_own_run", &[("CPUPROFILE", file.to_str().unwrap())]);
    let (status, body) = get(&server.address, "/pprof/profile?seconds=1");
    assert_eq!(status, 409);
    assert!(String::from_utf8_lossy(&body).contains("already being profiled"));
    // ~1000 stack observations (the default timer observes on the 250 Hz tick) for the answer.
    std::thread::sleep(Duration::from_secs(4));
    server.finish();
    assert_three_to_one("CPUPROFILE with the endpoint", &cpuprof_top(&file), &file);
}

#[test]
fn an_address_in_use_is_reported_and_the_program_runs_on() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = scratch_dir("http_in_use");
    let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(&hot)
        .arg("0.2")
        .env("LD_PRELOAD", lib())
        .env("CPUPROF_HTTP", &port)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("checksum 1"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen") && err.contains("in use"), "{err}");
}

#[test]
fn programs_it_runs_do_not_inherit_the_endpoint() {
    let out = Command::new("sh")
        .args(["-c", "echo \"[$CPUPROF_HTTP]\"; sh -c 'echo \"[$CPUPROF_HTTP]\"'"])
        .env("LD_PRELOAD", lib())
        .env("CPUPROF_HTTP", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n[]\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("serving profiles").count(), 1, "{err}");
}

/// `tests/c/stripped_hot.c` built with `-rdynamic` (so `hot_exported` stays in `.dynsym`) and
/// then `strip --strip-all`; returns the stripped program and the unstripped build.
fn stripped_hot(dir: &Path) -> (PathBuf, PathBuf) {
    let flags = ["-O2", "-fno-omit-frame-pointer", "-rdynamic"];
    let full = compile_c(dir, "stripped_hot.c", "stripped_hot.full", &flags, false);
    let stripped = dir.join("stripped_hot");
    run_ok(
        Path::new("strip"),
        &["--strip-all", "-o", stripped.to_str().unwrap(), full.to_str().unwrap()],
        &[],
    );
    let sections = run_ok(Path::new("readelf"), &["-S", stripped.to_str().unwrap()], &[]);
    assert!(!String::from_utf8_lossy(&sections.stdout).contains(".symtab"));
    (stripped, full)
}

/// The address `nm` gives `function` in `binary`.
fn nm_address(binary: &Path, function: &str) -> u64 {
    let nm = run_ok(Path::new("nm"), &[binary.to_str().unwrap()], &[]);
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 3 && cols[2] == function).then(|| u64::from_str_radix(cols[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("nm: no {function} in {}", binary.display()))
}

/// The rows a reader must show for stripped_hot and their shares of the work (3 : 2 : 1):
/// the static functions as `stripped_hot+0xSTART` with START from `nm` of the unstripped
/// build, the exported one by its `.dynsym` name.
fn stripped_rows(full: &Path) -> [(String, f64); 3] {
    [
        (format!("stripped_hot+{:#x}", nm_address(full, "hot_static_a")), 50.0),
        (
            format!("stripped_hot+{:#x}", nm_address(full, "hot_static_b")),
            100.0 / 3.0,
        ),
        ("hot_exported".to_string(), 100.0 / 6.0),
    ]
}

fn assert_stripped_rows(reader: &str, rows: &[(String, f64)], output: &str) {
    let table = percentages(output, 1);
    for (name, want) in rows {
        let got = share(&table, name);
        // ~300 stack observations (3 s on the 250 Hz tick, on a shared machine maybe half):
        // 10 points is over three standard errors of the largest share.
        assert!(
            (got - want).abs() <= 10.0,
            "{reader}: {name} {got}% (want {want:.0} ± 10)\n{output}"
        );
    }
}

/// Runs tests/go/pprof_check.go (pprof's own `profile` package: Parse and CheckValid) on a
/// gzipped protobuf; returns its report.
fn pprof_check(profile: &Path) -> String {
    let root = root();
    let cache = root.join("target/go-build");
    let home = std::env::temp_dir();
    let out = run_ok(
        Path::new("go"),
        &[
            "run",
            root.join("tests/go/pprof_check.go").to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[
            // GOPATH mode: the package comes from Debian's golang-github-google-pprof-dev,
            // without modules or network.
            ("GO111MODULE", "off"),
            ("GOPATH", "/usr/share/gocode"),
            ("GOFLAGS", ""),
            ("GOCACHE", cache.to_str().unwrap()),
            ("HOME", home.to_str().unwrap()),
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn report_value(report: &str, key: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{report}"))
}

/// One running program for both checks: each profile burns the test machine's CPU.
#[test]
fn a_stripped_program_is_named_for_both_readers_and_in_a_valid_protobuf() {
    let dir = scratch_dir("http_stripped");
    let (stripped, full) = stripped_hot(&dir);
    let rows = stripped_rows(&full);
    let server = Server::run(&stripped, &["stdin"], &[("CPUPROFILE_FREQUENCY", "1000")]);
    let home = std::env::temp_dir();
    let home = [("HOME", home.to_str().unwrap())];
    // go tool pprof reads the protobuf (names made here) and the legacy profile (names asked
    // of /pprof/symbol); google-pprof reads the legacy one, by either URL form.
    let readers = [
        (
            "go",
            format!("tool pprof -top {}", server.url("/debug/pprof/profile?seconds=3")),
        ),
        (
            "go",
            format!("tool pprof -top {}", server.url("/pprof/profile?seconds=3")),
        ),
        (
            "google-pprof",
            format!("--text --seconds=3 {}", server.url("/pprof/profile")),
        ),
        (
            "google-pprof",
            format!("--text {}", server.url("/debug/pprof/profile?seconds=3")),
        ),
    ];
    for (program, args) in &readers {
        let out = run_ok(Path::new(program), &args.split(' ').collect::<Vec<_>>(), &home);
        assert_stripped_rows(
            &format!("{program} {args}"),
            &rows,
            &String::from_utf8_lossy(&out.stdout),
        );
    }
    protobuf_is_valid_for_pprofs_profile_package(&server, &dir, &rows);
    symbol_lookups_name_stripped_code(&server, &stripped, &full);
    assert!(server.finish().contains("checksum 1"));

    // The unstripped build (-g) gets source lines from its .debug_line: those of the loop of
    // `burn` (inlined) or of the hot function's own line.
    let server = Server::run(&full, &["stdin"], &[]);
    let (status, body) = get(&server.address, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let file = dir.join("full.pb.gz");
    std::fs::write(&file, &body).unwrap();
    let report = pprof_check(&file);
    assert!(
        report.contains("/stripped_hot.full build_id=") && report.contains(" lines=true\n"),
        "{report}"
    );
    let source = root().join("tests/c/stripped_hot.c");
    let source = std::fs::read_to_string(source).unwrap();
    let line_of = |text: &str| 1 + source.lines().position(|l| l.contains(text)).unwrap() as u64;
    let lines = line_of("for (unsigned long i = 0; i < n; i++)")..=line_of("void hot_static_b");
    let line = report
        .lines()
        .find_map(|l| l.strip_prefix("function hot_static_a "))
        .and_then(|at| at.rsplit_once(':'))
        .filter(|(file, _)| file.ends_with("tests/c/stripped_hot.c"))
        .and_then(|(_, line)| line.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no line for hot_static_a\n{report}"));
    assert!(
        lines.contains(&line),
        "hot_static_a at line {line}, not in {lines:?}\n{report}"
    );
    assert!(server.finish().contains("checksum 1"));
}

/// What go tool pprof sends for a mapping without names: `POST <profile URL>/../symbol` with
/// `0xADDR+0xADDR...`. The static function's address in the running (PIE) program is its
/// `nm` address in the unstripped build plus where the program's first segment is mapped.
fn symbol_lookups_name_stripped_code(server: &Server, stripped: &Path, full: &Path) {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", server.child.id())).unwrap();
    let base = maps
        .lines()
        .find(|l| l.ends_with(stripped.to_str().unwrap()) && l.split_whitespace().nth(2) == Some("00000000"))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .unwrap_or_else(|| panic!("{} not mapped:\n{maps}", stripped.display()));
    let start = nm_address(full, "hot_static_b");
    let body = format!("{:#x}+{:#x}", base + start + 4, base + nm_address(full, "hot_exported"));
    for path in ["/debug/pprof/symbol", "/pprof/symbol"] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (status, answer) = exchange(&server.address, request.as_bytes());
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(status, 200, "{path}: {answer}");
        assert_eq!(
            answer,
            format!(
                "{:#x}\tstripped_hot+{start:#x}\n{:#x}\thot_exported\n",
                base + start + 4,
                base + nm_address(full, "hot_exported")
            ),
            "{path}"
        );
    }
}

/// The endpoint's protobuf of the stripped program, read by pprof's `profile` package: valid,
/// with its start and length, the program's mapping marked as named, and no location without
/// its mapping.
fn protobuf_is_valid_for_pprofs_profile_package(server: &Server, dir: &Path, rows: &[(String, f64)]) {
    let before = std::time::SystemTime::now();
    let (status, body) = get(&server.address, "/debug/pprof/profile?seconds=2");
    let elapsed = before.elapsed().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let file = dir.join("profile.pb.gz");
    std::fs::write(&file, &body).unwrap();
    let report = pprof_check(&file);
    assert!(report.starts_with("valid\n"), "{report}");

    // The profile starts within the request and lasts the seconds asked for, not longer than
    // the request took.
    let since_epoch = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let started = report_value(&report, "time_nanos");
    assert!(
        (since_epoch(before)..=since_epoch(before + elapsed)).contains(&started),
        "{report}"
    );
    let duration = report_value(&report, "duration_nanos");
    assert!(
        (2_000_000_000..=elapsed.as_nanos() as u64).contains(&duration),
        "{report}"
    );

    // The stripped program's mapping is marked as having functions, so go tool pprof does not
    // ask /symbol about it again; its functions are the ones the unwind tables give.
    let main_mapping = report
        .lines()
        .find(|l| l.starts_with("mapping ") && l.contains("/stripped_hot "))
        .unwrap_or_else(|| panic!("no mapping of the program\n{report}"));
    assert!(main_mapping.contains("functions=true"), "{report}");
    for (name, _) in rows {
        assert!(report.contains(&format!("function {name} ")), "{name}\n{report}");
    }
    // Every location keeps its mapping, named or not; no lines without .debug_line.
    assert!(report.contains(" without_mapping 0 "), "{report}");
    assert!(report.contains(" with_lines 0 "), "{report}");
}
