//! The on-demand HTTP endpoint (`CPUPROF_HTTP`) of a running known-answer program: read by go
//! tool pprof and google-pprof over the network, a long series of profiles plus hostile
//! requests that leave the program's output intact and leak no thread or descriptor, and the
//! 409 answers to a second profile while one is being taken; a stripped program's functions
//! named for both readers, and the protobuf checked by pprof's own `profile` package. Process
//! trees: the endpoint moves from a launcher to the server it started, a prefork server's
//! workers neither keep nor take the port, and every answer names the process that gave it.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// The known-answer program, working until its stdin closes, with the endpoint on a free port.
struct Server(HttpChild);

impl std::ops::Deref for Server {
    type Target = HttpChild;
    fn deref(&self) -> &HttpChild {
        &self.0
    }
}

impl Server {
    fn start(name: &str, extra_env: &[(&str, &str)]) -> Server {
        let dir = scratch_dir(name);
        let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
        Server::run(&hot, &["0", "stdin"], extra_env)
    }

    fn run(program: &Path, args: &[&str], extra_env: &[(&str, &str)]) -> Server {
        let env = [&[("CPUPROFILE_FREQUENCY", "1000")][..], extra_env].concat();
        Server(HttpChild::start(program, args, &env))
    }

    /// Threads and open descriptors of the program.
    fn resources(&self) -> (usize, usize) {
        let count = |dir: String| std::fs::read_dir(dir).unwrap().count();
        let pid = self.child.id();
        (count(format!("/proc/{pid}/task")), count(format!("/proc/{pid}/fd")))
    }

    /// Closes stdin and returns the program's output, asserting a clean exit.
    fn finish(self) -> String {
        let (out, _) = self.0.finish();
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
        // The endpoint samples the heap (issue 27): a heap profile, however often asked.
        (b"GET /pprof/heap HTTP/1.1\r\n\r\n".to_vec(), 200),
        (b"GET /debug/pprof/goroutine HTTP/1.1\r\n\r\n".to_vec(), 501),
        (b"GET /pprof/contention?seconds=0 HTTP/1.1\r\n\r\n".to_vec(), 400),
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
    let address = taken.local_addr().unwrap().to_string();
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

    // A program that runs on (idle: the tests beside this one need the CPU) serves there once
    // the port is free.
    let mut child = Command::new("sleep")
        .arg("60")
        .env("LD_PRELOAD", lib())
        .env("CPUPROF_HTTP", &port)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _leftover = KillOnDrop(vec![child.id()]);
    let stderr = lines_of(child.stderr.take().unwrap());
    let said = stderr.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(
        said.contains("cannot listen") && said.contains("until the port is free"),
        "{said}"
    );
    drop(taken);
    let freed = Instant::now();
    let (pid, _) = reach_process(&address, child.id(), Duration::from_secs(10));
    eprintln!(
        "served by the waiting program {:?} after the port was freed",
        freed.elapsed()
    );
    assert_eq!(pid, child.id());
    let said = stderr.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        said.contains(&format!("serving profiles on http://{address}/")),
        "{said}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn programs_it_runs_inherit_the_endpoint_and_wait_quietly() {
    // bash replaces getenv/setenv with its own (and with CPUPROFILE, cpuprof's constructor
    // calls its setenv before reading CPUPROF_HTTP); it also execs the last command of `-c` in
    // its own process, which then binds the port again without saying so twice.
    let dir = scratch_dir("http_shells");
    let profile = dir.join("shell.prof");
    let with_profile = [("CPUPROFILE", profile.to_str().unwrap())];
    for (shell, env) in [("sh", &[][..]), ("bash", &[][..]), ("bash", &with_profile[..])] {
        let script =
            r#"echo "[$CPUPROF_HTTP] [$CPUPROF_HTTP_TREE]"; sh -c 'echo "[$CPUPROF_HTTP] [$CPUPROF_HTTP_TREE]"'"#;
        let child = Command::new(shell)
            .args(["-c", script])
            .env("LD_PRELOAD", lib())
            .env("CPUPROF_HTTP", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("serving profiles").count(), 1, "{shell}: {err}");
        assert!(!err.contains("cannot listen"), "{shell}: {err}");
        let address = address_in(&err);
        // CPUPROF_HTTP as given; the port picked is the tree's, and the shell the one that
        // started it.
        let line = format!("[127.0.0.1:0] [{pid} {address} 127.0.0.1:0]\n");
        assert_eq!(String::from_utf8_lossy(&out.stdout), line.repeat(2), "{shell}: {err}");
    }
}

/// Processes a test started but does not wait for (a launcher's grandchildren, forked
/// workers): killed if the test ends before they do.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: plain kill(2); a pid already gone gets ESRCH.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Waits up to `limit` for `pid` to be gone (a process this test does not wait for).
fn wait_gone(pid: u32, limit: Duration) {
    let end = Instant::now() + limit;
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) != Some("Z"))
    };
    while alive() {
        assert!(Instant::now() < end, "process {pid} still runs after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One GET over a new connection: the status, the process that answered (`X-Cpuprof-Pid`) and
/// the body; `None` if nobody accepts the connection.
fn reach(address: &str, target: &str, timeout: Duration) -> Option<(u16, Option<u32>, Vec<u8>)> {
    use std::io::Read;
    let mut conn = TcpStream::connect(address).ok()?;
    conn.set_read_timeout(Some(timeout)).unwrap();
    conn.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response);
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let pid = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case(cpuprof::http::PID_HEADER)
            .then(|| value.trim().parse().ok())?
    });
    Some((status, pid, response[head_end + 4..].to_vec()))
}

/// Asks `/pprof/cmdline` at `address` until process `pid` answers (within `limit`); its pid
/// and command line.
fn reach_process(address: &str, pid: u32, limit: Duration) -> (u32, Vec<String>) {
    let end = Instant::now() + limit;
    let mut last = None;
    loop {
        if let Some((200, Some(answered), body)) = reach(address, "/pprof/cmdline", Duration::from_secs(5)) {
            let cmdline = String::from_utf8_lossy(&body).lines().map(String::from).collect();
            if answered == pid {
                return (answered, cmdline);
            }
            last = Some((answered, cmdline));
        }
        assert!(
            Instant::now() < end,
            "process {pid} did not answer at {address} within {limit:?}; last answer: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_single_process_names_itself_in_every_answer() {
    // An idle program: the tests beside this one need the CPU.
    let HttpChild {
        mut child,
        announced,
        address,
        ..
    } = HttpChild::start(Path::new("sleep"), &["60"], &[]);
    let _leftover = KillOnDrop(vec![child.id()]);
    // As before: the process started serves, and says so without a pid.
    assert!(announced.ends_with("/debug/pprof/profile"), "{announced}");
    let (status, pid, body) = reach(&address, "/pprof/cmdline", Duration::from_secs(10)).unwrap();
    assert_eq!((status, pid), (200, Some(child.id())));
    assert_eq!(String::from_utf8_lossy(&body), "sleep\n60\n");
    let (status, pid, _) = reach(&address, "/nope", Duration::from_secs(10)).unwrap();
    assert_eq!((status, pid), (404, Some(child.id())));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn the_endpoint_moves_from_a_launcher_to_the_server_it_started() {
    let dir = scratch_dir("http_launcher");
    let launcher = compile_c(&dir, "launcher.c", "launcher", FLAGS, false);
    let HttpChild {
        mut child,
        stdin,
        stderr,
        announced,
        address,
    } = HttpChild::start(&launcher, &["launch", "1"], &[("CPUPROFILE_FREQUENCY", "1000")]);
    let stdout = lines_of(child.stdout.take().unwrap());
    let server: u32 = stdout
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .strip_prefix("server ")
        .and_then(|p| p.parse().ok())
        .expect("server PID");
    let _leftover = KillOnDrop(vec![server]);
    // The server works until its standard input closes (`wait` would close it): `stdin` is
    // held until the end.
    // The launcher holds the port for a second, then exits; the server (through `sh -c exec`)
    // waited on standby meanwhile.
    assert!(child.wait().unwrap().success());
    let exited = Instant::now();
    let (_, cmdline) = reach_process(&address, server, Duration::from_secs(10));
    eprintln!("the server answered {:?} after the launcher exited", exited.elapsed());
    assert_eq!(cmdline, [launcher.to_str().unwrap(), "server"]);

    let (status, pid, body) = reach(&address, "/pprof/profile?seconds=1", Duration::from_secs(60)).unwrap();
    assert_eq!((status, pid), (200, Some(server)), "{}", String::from_utf8_lossy(&body));
    let file = dir.join("server.prof");
    std::fs::write(&file, &body).unwrap();
    let profile = read_profile(&file);
    assert!(profile.total_samples() > 50, "{} samples", profile.total_samples());
    let table = cpuprof_top(&file);
    assert!(share(&table, "server_busy") > 50.0, "{table:?}");

    drop(stdin);
    wait_gone(server, Duration::from_secs(10));
    // The launcher said where it served; the shell and the server waited without a word, and
    // the server said once that it serves now.
    let said: Vec<String> = std::iter::from_fn(|| stderr.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert_eq!(said.len(), 1, "{announced}\n{said:?}");
    assert!(
        said[0].contains(&format!("http://{address}/"))
            && said[0].contains(&format!("pid {server}; the port was freed")),
        "{said:?}"
    );
}

/// The inode of the socket listening on `port` (from /proc/net/tcp).
fn listening_inode(port: u16) -> Option<u64> {
    std::fs::read_to_string("/proc/net/tcp")
        .ok()?
        .lines()
        .skip(1)
        .find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(cols.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && cols.get(3) == Some(&"0A")).then(|| cols.get(9)?.parse().ok())?
        })
}

/// Whether process `pid` holds a descriptor of socket `inode`.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| target.to_str() == Some(wanted.as_str()))
}

#[test]
fn a_prefork_servers_workers_neither_keep_nor_take_the_port() {
    let dir = scratch_dir("http_prefork");
    let launcher = compile_c(&dir, "launcher.c", "launcher", FLAGS, false);
    let HttpChild {
        child: mut parent,
        stdin,
        stderr,
        address,
        ..
    } = HttpChild::start(&launcher, &["prefork"], &[]);
    let stdout = lines_of(parent.stdout.take().unwrap());
    let mut workers = Vec::new();
    while workers.len() < 2 {
        let line = stdout.recv_timeout(Duration::from_secs(30)).unwrap();
        if let Some(pid) = line.strip_prefix("worker ") {
            workers.push(pid.parse::<u32>().unwrap());
        }
    }
    let _leftover = KillOnDrop(workers.clone());
    // The parent serves, and only it holds the listening socket.
    let (_, cmdline) = reach_process(&address, parent.id(), Duration::from_secs(10));
    assert_eq!(cmdline, [launcher.to_str().unwrap(), "prefork"]);
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    let inode = listening_inode(port).expect("a listening socket");
    assert!(holds_socket(parent.id(), inode));
    for &w in &workers {
        assert!(!holds_socket(w, inode), "worker {w} holds the listening socket");
    }

    // The parent dies; its workers run on and nobody answers, then or after the workers
    // would have retried (they never do: forked children do not wait for the port).
    parent.kill().unwrap();
    parent.wait().unwrap();
    for pause in [
        Duration::ZERO,
        2 * cpuprof::http::STANDBY_RETRY + Duration::from_millis(500),
    ] {
        std::thread::sleep(pause);
        let refused = TcpStream::connect(&address).map(|_| ()).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "after {pause:?}");
        for &w in &workers {
            assert!(std::fs::metadata(format!("/proc/{w}")).is_ok(), "worker {w} ended");
        }
    }
    // The port is anyone's.
    drop(std::net::TcpListener::bind(&address).unwrap());
    drop(stdin);
    for &w in &workers {
        wait_gone(w, Duration::from_secs(10));
    }
    // The workers said nothing.
    let said: Vec<String> = std::iter::from_fn(|| stderr.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert!(said.is_empty(), "{said:?}");
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
