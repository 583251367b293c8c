//! Separate debug info: a program split with `objcopy --only-keep-debug` + `strip` +
//! `--add-gnu-debuglink` is named, with lines and inline frames, exactly as its unsplit build,
//! wherever gdb and perf would find the debug file (beside it, in `.debug/`, by build-id under
//! `--debug-dir`, from a debuginfod server); a debug file of another build is refused; and
//! without `DEBUGINFOD_URLS` nothing touches the network.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};
use support::*;

/// An unsplit build of tests/c/split_debug.c, and a profile of a stripped copy of it run from
/// `dir/name` (after `strip_flag`; the caller places its debug file). The stripped copy and the
/// build have the same code and build-id, so the unsplit build names the profile's addresses
/// as they should be named.
struct Split {
    full: PathBuf,
    stripped: PathBuf,
    debug: PathBuf,
    profile: PathBuf,
    stripped_has_symtab: bool,
}

fn split(dir: &Path, strip_flag: &str, debuglink: bool) -> Split {
    let full = compile_c(dir, "split_debug.c", "full", &["-O1", "-fno-omit-frame-pointer"], false);
    let debug = dir.join("prog.debug");
    let stripped = dir.join("prog");
    run_ok(
        Path::new("objcopy"),
        &["--only-keep-debug", full.to_str().unwrap(), debug.to_str().unwrap()],
        &[],
    );
    run_ok(
        Path::new("strip"),
        &[strip_flag, full.to_str().unwrap(), "-o", stripped.to_str().unwrap()],
        &[],
    );
    if debuglink {
        // objcopy computes the CRC from the file at this path and records its base name.
        let link = format!("--add-gnu-debuglink={}", debug.display());
        run_ok(Path::new("objcopy"), &[&link, stripped.to_str().unwrap()], &[]);
    }
    let profile = dir.join("prog.prof");
    let out = run_preloaded(&stripped, &["0.6"], &profile, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("checksum"));
    Split {
        full,
        stripped,
        debug,
        profile,
        stripped_has_symtab: strip_flag == "--strip-debug",
    }
}

/// Runs the CLI with `args` and `env` (DEBUGINFOD_URLS removed unless `env` sets it).
fn cpuprof(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(cli())
        .args(args)
        .env_remove("DEBUGINFOD_URLS")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cpuprof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What a reader shows of `profile`: the `top` table (names, inline frames included) and the
/// `function file:line` rows of the pprof conversion as go tool pprof reads them (lines).
fn naming(profile: &Path, extra: &[&str], env: &[(&str, &str)]) -> (String, Vec<String>, String) {
    let p = profile.to_str().unwrap();
    let top = cpuprof(&[&["top", "-n", "100", p], extra].concat(), env);
    let pb = profile.with_extension(format!("{}.pb.gz", extra.len()));
    let converted = cpuprof(
        &[&["convert", "--to", "pprof", "-o", pb.to_str().unwrap(), p], extra].concat(),
        env,
    );
    let lines = run_ok(
        Path::new("go"),
        &[
            "tool",
            "pprof",
            "-top",
            "-lines",
            "-symbolize=none",
            "-nodecount=1000",
            pb.to_str().unwrap(),
        ],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let mut rows: Vec<String> = String::from_utf8_lossy(&lines.stdout)
        .lines()
        .filter(|l| l.contains("split_debug.c:"))
        .map(|l| l.split_whitespace().skip(5).collect::<Vec<_>>().join(" "))
        .collect();
    rows.sort();
    let stderr = String::from_utf8_lossy(&top.stderr).into_owned() + &String::from_utf8_lossy(&converted.stderr);
    (String::from_utf8_lossy(&top.stdout).into_owned(), rows, stderr)
}

/// Asserts that `profile`, read with `extra` arguments, is named as the unsplit build names it:
/// the same table, the same lines, and the static functions and inlined helper among them.
fn assert_named_as_unsplit(s: &Split, extra: &[&str], env: &[(&str, &str)]) {
    let full = format!("--binary={}", s.full.display());
    let (want_top, want_lines, _) = naming(&s.profile, &[full.as_str()], &[]);
    for name in ["spin_alpha", "spin_beta", "mix"] {
        assert!(want_top.contains(name), "the unsplit build names {name}:\n{want_top}");
        assert!(
            want_lines.iter().any(|r| r.starts_with(&format!("{name} "))),
            "the unsplit build gives {name} a line: {want_lines:?}"
        );
    }
    let (top, lines, stderr) = naming(&s.profile, extra, env);
    assert_eq!(
        top, want_top,
        "names differ from the unsplit build's; stderr:\n{stderr}"
    );
    assert_eq!(lines, want_lines, "lines differ from the unsplit build's");
}

/// The stripped program alone gives no lines and no inline frames (only DWARF does), and with
/// `--strip-all` not even the static functions' names: so the tests cannot pass without the
/// debug file.
fn assert_unnamed(s: &Split, env: &[(&str, &str)]) -> String {
    let (top, lines, stderr) = naming(&s.profile, &[], env);
    assert!(
        lines.is_empty() && !top.contains("mix"),
        "lines or inline frames without the debug file: {lines:?}\n{top}"
    );
    let all_stripped = !s.stripped_has_symtab;
    assert!(
        !(all_stripped && top.contains("spin_alpha")),
        "named without its debug file:\n{top}"
    );
    stderr
}

fn build_id(file: &Path) -> String {
    let out = run_ok(Path::new("readelf"), &["-n", file.to_str().unwrap()], &[]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the test program has a build-id")
        .to_string()
}

#[test]
fn debuglink_beside_the_object() {
    let dir = scratch_dir("debuglink-beside");
    let s = split(&dir, "--strip-debug", true);
    assert_named_as_unsplit(&s, &[], &[]);
    std::fs::rename(&s.debug, dir.join("elsewhere.debug")).unwrap();
    assert_unnamed(&s, &[]);
}

#[test]
fn debuglink_in_dot_debug() {
    let dir = scratch_dir("debuglink-dot-debug");
    let s = split(&dir, "--strip-all", true);
    std::fs::create_dir(dir.join(".debug")).unwrap();
    std::fs::rename(&s.debug, dir.join(".debug/prog.debug")).unwrap();
    assert_named_as_unsplit(&s, &[], &[]);
}

#[test]
fn debuglink_under_a_debug_dir_mirroring_the_object_path() {
    let dir = scratch_dir("debuglink-debug-dir");
    let s = split(&dir, "--strip-all", true);
    let debug_dir = dir.join("debug-root");
    let mirrored = debug_dir.join(dir.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&mirrored).unwrap();
    std::fs::rename(&s.debug, mirrored.join("prog.debug")).unwrap();
    assert_unnamed(&s, &[]);
    let arg = format!("--debug-dir={}", debug_dir.display());
    assert_named_as_unsplit(&s, &[arg.as_str()], &[]);
}

#[test]
fn build_id_under_a_debug_dir() {
    let dir = scratch_dir("build-id-debug-dir");
    let s = split(&dir, "--strip-all", false);
    let id = build_id(&s.stripped);
    let debug_dir = dir.join("symbols");
    let place = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&place).unwrap();
    std::fs::rename(&s.debug, place.join(format!("{}.debug", &id[2..]))).unwrap();
    assert_unnamed(&s, &[]);
    let arg = format!("--debug-dir={}", debug_dir.display());
    assert_named_as_unsplit(&s, &[arg.as_str()], &[]);
}

#[test]
fn debug_file_of_another_build_is_refused() {
    let dir = scratch_dir("debuglink-wrong-crc");
    let s = split(&dir, "--strip-all", true);
    // Another build's debug file under the linked name: same file name, other contents, so
    // the CRC the link records does not match.
    let other = compile_c(&dir, "split_debug.c", "other", &["-O2", "-DOTHER_BUILD"], false);
    run_ok(
        Path::new("objcopy"),
        &["--only-keep-debug", other.to_str().unwrap(), s.debug.to_str().unwrap()],
        &[],
    );
    let stderr = assert_unnamed(&s, &[]);
    assert!(
        stderr.contains("CRC") && stderr.contains("prog.debug"),
        "the refusal is said: {stderr}"
    );

    // A file at the build-id path whose own build-id differs is refused too.
    let id = build_id(&s.stripped);
    let debug_dir = dir.join("symbols");
    let place = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&place).unwrap();
    std::fs::copy(&s.debug, place.join(format!("{}.debug", &id[2..]))).unwrap();
    let arg = format!("--debug-dir={}", debug_dir.display());
    let (top, _, stderr) = naming(&s.profile, &[arg.as_str()], &[]);
    assert!(!top.contains("spin_alpha"), "named from a wrong build-id file:\n{top}");
    assert!(stderr.contains("build-id"), "the refusal is said: {stderr}");
}

/// Whether a tool the test needs is installed (the skip policy: [`require_tools`]).
fn have(tool: &str) -> bool {
    require_tools(&[tool])
}

/// A debuginfod server on loopback, stopped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `debuginfod` serving `served` and waits (bounded) until its scan has indexed
/// build-id `id`, so that the server answers 200 for it.
fn start_debuginfod(dir: &Path, served: &Path, id: &str) -> (Server, String) {
    let port = free_port();
    let child = Command::new("debuginfod")
        .args(["-F", "-p", &port.to_string(), "-t", "0", "-g", "0", "-d"])
        .arg(dir.join("debuginfod.sqlite"))
        .arg(served)
        .env_remove("DEBUGINFOD_URLS")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("debuginfod.log")).unwrap())
        .spawn()
        .unwrap();
    let server = Server(child);
    let address = format!("127.0.0.1:{port}");
    let request = format!("GET /buildid/{id}/debuginfo HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = std::net::TcpStream::connect(&address).is_ok()
            && http_exchange(&address, request.as_bytes(), Duration::from_secs(10)).0 == 200;
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "debuginfod did not serve {id} within 60 s; its log: {}",
            std::fs::read_to_string(dir.join("debuginfod.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, format!("http://{address}"))
}

#[test]
fn names_arrive_from_debuginfod() {
    if !have("debuginfod") {
        return;
    }
    let dir = scratch_dir("debuginfod");
    let s = split(&dir, "--strip-all", false);
    let id = build_id(&s.stripped);
    let served = dir.join("served");
    std::fs::create_dir(&served).unwrap();
    std::fs::rename(&s.debug, served.join("prog.debug")).unwrap();
    let (server, url) = start_debuginfod(&dir, &served, &id);

    let cache = dir.join("cache");
    let cache_env = cache.to_str().unwrap();
    assert_unnamed(&s, &[("DEBUGINFOD_CACHE_PATH", cache_env)]);
    assert!(!cache.join(&id).exists(), "nothing fetched without DEBUGINFOD_URLS");

    // Two URLs: the first refuses connections (a port nobody listens on), which is warned
    // about; the second has the file.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let urls = format!("{dead} {url}");
    let env = [("DEBUGINFOD_URLS", urls.as_str()), ("DEBUGINFOD_CACHE_PATH", cache_env)];
    assert_named_as_unsplit(&s, &[], &env);
    let cached = cache.join(&id).join("debuginfo");
    assert_eq!(build_id(&cached), id, "the download is cached under its build-id");

    // Served from the cache once the server is gone.
    drop(server);
    let (top, _, _) = naming(&s.profile, &[], &env);
    assert!(top.contains("spin_alpha"), "named from the cache:\n{top}");

    // With the file neither local nor cached and every server down, the failure is said and
    // the profile still reads.
    std::fs::remove_dir_all(&cache).unwrap();
    let (top, _, stderr) = naming(&s.profile, &[], &env);
    assert!(!top.contains("spin_alpha"));
    assert!(stderr.contains("debuginfod"), "the failure is said: {stderr}");
}

#[test]
fn no_network_access_without_debuginfod_urls() {
    if !have("strace") || !have("debuginfod") {
        return;
    }
    let dir = scratch_dir("debuginfod-off");
    let s = split(&dir, "--strip-all", false);
    let id = build_id(&s.stripped);
    let served = dir.join("served");
    std::fs::create_dir(&served).unwrap();
    std::fs::rename(&s.debug, served.join("prog.debug")).unwrap();
    let (_server, url) = start_debuginfod(&dir, &served, &id);

    // The network system calls cpuprof makes, with `env` (DEBUGINFOD_URLS removed unless set
    // there).
    let traced = |name: &str, env: &[(&str, &str)]| -> Vec<String> {
        let trace = dir.join(format!("{name}.strace"));
        let out = Command::new("strace")
            .args(["-f", "-e", "trace=network", "-o"])
            .arg(&trace)
            .arg(cli())
            .args(["top", s.profile.to_str().unwrap()])
            .env_remove("DEBUGINFOD_URLS")
            .env("DEBUGINFOD_CACHE_PATH", dir.join(format!("{name}-cache")))
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .filter(|l| l.contains("socket(") || l.contains("connect("))
            .map(str::to_string)
            .collect()
    };
    // The check sees network access when there is some...
    let with = traced("with", &[("DEBUGINFOD_URLS", url.as_str())]);
    assert!(
        with.iter().any(|l| l.contains("connect(")),
        "strace shows the connection to debuginfod: {with:?}"
    );
    // ...and there is none when the variable is unset or empty.
    assert_eq!(traced("unset", &[]), Vec::<String>::new());
    assert_eq!(traced("empty", &[("DEBUGINFOD_URLS", " ")]), Vec::<String>::new());
}

/// Whether libc's separate debug info (Debian's libc6-dbg) is installed, by the build-id path
/// gdb would use (the skip policy: [`require_file`]).
fn have_libc_debug_info() -> bool {
    let id = build_id(Path::new("/lib/x86_64-linux-gnu/libc.so.6"));
    let debug = Path::new("/usr/lib/debug/.build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    require_file(&debug, "libc6-dbg")
}

/// The bundled demo spends about 45 % of its time inside libc (snprintf, qsort), which a
/// stripped libc showed as one `[libc.so.6]` row: with libc6-dbg its internals are named.
#[test]
fn libc_internals_are_named_from_libc6_dbg() {
    if !have_libc_debug_info() {
        return;
    }
    let dir = scratch_dir("libc-dbg");
    let demo = dir.join("demo");
    run_ok(
        Path::new("cc"),
        &[
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            root().join("examples/demo.c").to_str().unwrap(),
            "-o",
            demo.to_str().unwrap(),
        ],
        &[],
    );
    let profile = dir.join("demo.prof");
    run_preloaded(&demo, &[], &profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
    let top = cpuprof(&["top", "-n", "1000", profile.to_str().unwrap()], &[]);
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(!top.contains("[libc.so.6]"), "an unnamed libc row:\n{top}");
    // Local functions of libc: in no symbol table that libc.so.6 itself carries.
    for internal in ["_itoa_word", "msort_with_tmp"] {
        assert!(top.contains(internal), "{internal} not named:\n{top}");
    }
}

/// Threads start in libc (clone3, start_thread): named, every thread's stack reaches its
/// root, so `collapse` shows complete stacks.
#[test]
fn thread_stacks_reach_clone3() {
    if !have_libc_debug_info() {
        return;
    }
    let dir = scratch_dir("libc-dbg-threads");
    let threads = compile_c(&dir, "threads.c", "threads", &["-O1", "-fno-omit-frame-pointer"], false);
    let profile = dir.join("threads.prof");
    run_preloaded(&threads, &["4", "0.1"], &profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
    let folded = cpuprof(&["collapse", profile.to_str().unwrap()], &[]);
    let (mut rooted, mut total) = (0u64, 0u64);
    for line in String::from_utf8_lossy(&folded.stdout).lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        total += count;
        if stack.starts_with("clone3;") || stack.starts_with("_start;") {
            rooted += count;
        }
    }
    assert!(total > 0);
    assert!(
        rooted * 100 >= total * 95,
        "{rooted} of {total} samples reach clone3 or _start:\n{}",
        String::from_utf8_lossy(&folded.stdout)
    );
}

/// Debian's -dbgsym packages are made with dwz, which moves DWARF shared by several programs
/// into one common file that each debug file names by `.gnu_debugaltlink` (path and build-id):
/// lines need that file too, found at the linked path or by its build-id.
#[test]
fn dwz_common_file_through_debugaltlink() {
    if !have("dwz") {
        return;
    }
    let dir = scratch_dir("dwz");
    let flags = ["-O1", "-fno-omit-frame-pointer"];
    let full = compile_c(&dir, "split_debug.c", "full", &flags, false);
    let sibling = compile_c(
        &dir,
        "split_debug.c",
        "sibling",
        &[&flags[..], &["-DSIBLING"]].concat(),
        false,
    );
    let common = dir.join("common.debug");
    let unsplit = dir.join("unsplit");
    std::fs::copy(&full, &unsplit).unwrap();
    run_ok(
        Path::new("dwz"),
        &[
            "-m",
            common.to_str().unwrap(),
            "-M",
            common.to_str().unwrap(),
            full.to_str().unwrap(),
            sibling.to_str().unwrap(),
        ],
        &[],
    );
    let debug = dir.join("prog.debug");
    let stripped = dir.join("prog");
    run_ok(
        Path::new("objcopy"),
        &["--only-keep-debug", full.to_str().unwrap(), debug.to_str().unwrap()],
        &[],
    );
    run_ok(
        Path::new("strip"),
        &["--strip-all", full.to_str().unwrap(), "-o", stripped.to_str().unwrap()],
        &[],
    );
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run_ok(Path::new("objcopy"), &[&link, stripped.to_str().unwrap()], &[]);
    let profile = dir.join("prog.prof");
    run_preloaded(&stripped, &["0.6"], &profile, &[]);
    // The reference: the same code before dwz and strip (same build-id, DWARF in itself).
    let s = Split {
        full: unsplit,
        stripped,
        debug,
        profile,
        stripped_has_symtab: false,
    };
    assert_named_as_unsplit(&s, &[], &[]);

    // Without the common file the debug file still names the functions (its .symtab) but has
    // no lines...
    let id = build_id(&common);
    let debug_dir = dir.join("symbols");
    let place = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&place).unwrap();
    std::fs::rename(&common, place.join(format!("{}.debug", &id[2..]))).unwrap();
    let (top, lines, _) = naming(&s.profile, &[], &[]);
    assert!(top.contains("spin_alpha") && lines.is_empty(), "{top}\n{lines:?}");
    // ...and with it found by build-id under --debug-dir, all of them again.
    let arg = format!("--debug-dir={}", debug_dir.display());
    assert_named_as_unsplit(&s, &[arg.as_str()], &[]);
}
