//! Shared helpers for end-to-end tests: build libcpuprof.so and the cpuprof CLI, compile C
//! workloads, run programs under the profiler, and read profiles with our reader and with the
//! real ones (google-pprof, go tool pprof). The skip policy is in `skip.rs`, plain-against-profiled
//! runs and a full disk in `compare.rs`, heap profiles' known answer read by google-pprof in
//! `heap_readers.rs`, a program serving the HTTP endpoint in `http_child.rs`;
//! tests/README.md says which to use where.
#![allow(dead_code)] // each test binary uses a different subset

mod compare;
mod heap_readers;
mod http_child;
mod skip;

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use compare::*;
#[allow(unused_imports)]
pub use heap_readers::*;
#[allow(unused_imports)]
pub use http_child::*;
#[allow(unused_imports)]
pub use skip::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>/ of this test run.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf() // target/<profile>/deps/.. -> target/<profile>
}

/// Builds libcpuprof.so and the cpuprof binary once per test binary (cargo test does not
/// build a cdylib or another package's binary for us). Returns (lib, cli).
pub fn artifacts() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Prebuilt ones: tests/aarch64.rs runs a test binary under qemu-aarch64, where cargo
        // cannot build, and the host's own libcpuprof.so and cpuprof (which qemu runs natively).
        if let (Some(lib), Some(cli)) = (
            std::env::var_os("CPUPROF_TEST_LIB"),
            std::env::var_os("CPUPROF_TEST_CLI"),
        ) {
            return (lib.into(), cli.into());
        }
        let profile_dir = target_dir();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(root())
            .args(["build", "-q", "-p", "cpuprof-preload", "-p", "cpuprof-cli"]);
        if profile_dir.file_name().unwrap() == "release" {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building libcpuprof.so and cpuprof failed");
        let lib = profile_dir.join("libcpuprof.so");
        provide_soname(&lib);
        (lib, profile_dir.join("cpuprof"))
    })
}

/// Builds `examples/<name>.rs` with `features`, in this test run's profile; returns its path.
pub fn build_example(name: &str, features: &[&str]) -> PathBuf {
    let profile_dir = target_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(root())
        .args(["build", "-q", "-p", "cpuprof", "--example", name]);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    if profile_dir.file_name().unwrap() == "release" {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("run cargo build").success(),
        "building example {name} failed"
    );
    profile_dir.join("examples").join(name)
}

/// The soname cdylib/build.rs gives libcpuprof.so: what a program linked with `-lcpuprof`
/// records as NEEDED, and so the name the loader looks for in its run path.
pub const SONAME: &str = "libcpuprof.so.0";

/// Makes [`SONAME`] a symlink to `library` in its directory, as `make install` does: cargo
/// writes only libcpuprof.so, and a program linked with `-L that_dir -lcpuprof` loads
/// libcpuprof.so.0 from there.
pub fn provide_soname(library: &Path) {
    let link = library.with_file_name(SONAME);
    let target = library.file_name().unwrap();
    if let Err(e) = std::os::unix::fs::symlink(target, &link) {
        // Made by an earlier run, or by another test binary just now.
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{}: {e}", link.display());
    }
    assert_eq!(
        std::fs::read_link(&link).ok().as_deref(),
        Some(Path::new(target)),
        "{} must point at {}",
        link.display(),
        target.to_string_lossy()
    );
}

pub fn lib() -> &'static Path {
    &artifacts().0
}

pub fn cli() -> &'static Path {
    &artifacts().1
}

/// A fresh directory for one test's files.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("e2e").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `tests/c/<source>` into `dir/<name>` with `flags` (plus -g, our header, and with
/// `link_api`, -lcpuprof).
pub fn compile_c(dir: &Path, source: &str, name: &str, flags: &[&str], link_api: bool) -> PathBuf {
    let out = dir.join(name);
    let mut cmd = Command::new("cc");
    cmd.arg("-g")
        .args(flags)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("tests/c").join(source));
    cmd.arg("-o").arg(&out).arg("-lpthread");
    if link_api {
        let libdir = lib().parent().unwrap();
        cmd.arg("-DUSE_API")
            .arg("-L")
            .arg(libdir)
            .arg("-lcpuprof")
            .arg(format!("-Wl,-rpath,{}", libdir.display()));
    }
    let result = cmd.output().expect("run cc");
    assert!(
        result.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// Runs `program args` with `env`, asserting it exits 0; returns its output.
pub fn run_ok(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (.ci/run installs what the tests run)", program.display()));
    assert!(
        out.status.success(),
        "{} {:?} failed: {:?}\nstdout: {}\nstderr: {}",
        program.display(),
        args,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `program` under LD_PRELOAD=libcpuprof.so with CPUPROFILE=profile.
pub fn run_preloaded(program: &Path, args: &[&str], profile: &Path, extra_env: &[(&str, &str)]) -> Output {
    let mut env = vec![
        ("LD_PRELOAD", lib().to_str().unwrap()),
        ("CPUPROFILE", profile.to_str().unwrap()),
    ];
    env.extend_from_slice(extra_env);
    run_alone(program, args, &env)
}

/// [`run_ok`] while no other profiled run of this test binary runs (see [`PROFILED_RUN`]):
/// for programs that profile themselves (the C API, `CPUPROFILE` set by hand).
pub fn run_alone(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let _alone = alone();
    run_ok(program, args, env)
}

/// Held while a profiled program this test binary runs by other means than [`run_alone`] runs
/// (see [`PROFILED_RUN`]).
pub fn alone() -> std::sync::MutexGuard<'static, ()> {
    PROFILED_RUN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `key value` lines a test program printed.
pub fn values(out: &Output) -> HashMap<String, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// Parses a complete profile, panicking with the file name and the defect.
pub fn read_profile(path: &Path) -> cpuprof::format::Profile {
    cpuprof::format::Profile::parse(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Reads a `cpu SECONDS` line printed by the workloads.
pub fn reported_cpu_seconds(out: &Output) -> f64 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|v| v.trim().parse().ok())
        .expect("workload prints 'cpu SECONDS'")
}

/// Cumulative percentage per function from a pprof-style table whose 5th column is cum%
/// and whose function name starts at the 6th (cpuprof top, google-pprof --text, go tool pprof -top).
pub fn cum_percentages(table: &str) -> HashMap<String, f64> {
    percentages(table, 4)
}

/// Percentages from column `col` of a `flat flat% sum% cum cum% name` table (`cpuprof top` of
/// a wall-clock profile has four columns of thread states before the name).
pub fn percentages(table: &str, col: usize) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    let name_col = if table.contains(" on-CPU runnable blocked ") {
        9
    } else {
        5
    };
    for line in table.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() <= name_col || !cols[col].ends_with('%') {
            continue;
        }
        if let Ok(p) = cols[col].trim_end_matches('%').parse::<f64>() {
            let name = cols[name_col..].join(" ");
            out.entry(name).or_insert(p);
        }
    }
    out
}

/// Share of the named function (exact name, or a Rust path ending in `::name`).
pub fn share(table: &HashMap<String, f64>, function: &str) -> f64 {
    table
        .iter()
        .filter(|(n, _)| *n == function || n.ends_with(&format!("::{function}")))
        .map(|(_, &p)| p)
        .fold(0.0, f64::max)
}

/// Our reader and symboliser: `cpuprof top --cum`.
pub fn cpuprof_top(profile: &Path) -> HashMap<String, f64> {
    let out = run_ok(cli(), &["top", "--cum", "-n", "1000", profile.to_str().unwrap()], &[]);
    cum_percentages(&String::from_utf8_lossy(&out.stdout))
}

/// The text `cpuprof top --cum -n 1000` prints for `profile` with `extra` options (a heap
/// profile's `--sample-index`, `--binary`).
pub fn cpuprof_top_text(profile: &Path, extra: &[&str]) -> String {
    let args = [&["top", "--cum", "-n", "1000"], extra, &[profile.to_str().unwrap()]].concat();
    String::from_utf8_lossy(&run_ok(cli(), &args, &[]).stdout).into_owned()
}

/// Flat percentage per function from `cpuprof top`.
pub fn flat_percentages(profile: &Path) -> HashMap<String, f64> {
    let out = run_ok(cli(), &["top", "-n", "1000", profile.to_str().unwrap()], &[]);
    percentages(&String::from_utf8_lossy(&out.stdout), 1)
}

pub fn google_pprof(binary: &Path, profile: &Path) -> HashMap<String, f64> {
    let out = run_ok(
        Path::new("google-pprof"),
        &["--text", "--cum", binary.to_str().unwrap(), profile.to_str().unwrap()],
        &[],
    );
    cum_percentages(&String::from_utf8_lossy(&out.stdout))
}

pub fn go_pprof(binary: &Path, profile: &Path) -> HashMap<String, f64> {
    let out = run_ok(
        Path::new("go"),
        &[
            "tool",
            "pprof",
            "-top",
            "-cum",
            "-nodecount=1000",
            binary.to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    cum_percentages(&String::from_utf8_lossy(&out.stdout))
}

/// Asserts the 3:1 known answer (hot_a 75 %, hot_b 25 % cumulative) in `table`, read from
/// `profile`: within 4 points, or 4.5 standard errors of a share of 25 % if the profile holds
/// fewer looks at the stacks than that needs. The looks are the effective number of its
/// weighted signals (its `# signal-weights` line): a run competing for the CPU gets fewer
/// signals from its CPU timer, each weighing more (59-70 instead of 248 per CPU-second beside 4
/// busy loops on 2 cores), and ±4 points would then be under two standard errors. 4.5 standard
/// errors: a false failure for 1 assertion in 150,000.
pub fn assert_three_to_one(reader: &str, table: &HashMap<String, f64>, profile: &Path) {
    let looks = effective_observations(profile);
    let tolerance = looks.map_or(4.0, |n| (4.5 * 100.0 * (0.75f64 * 0.25 / n).sqrt()).max(4.0));
    let (a, b) = (share(table, "hot_a"), share(table, "hot_b"));
    assert!(
        (a - 75.0).abs() <= tolerance && (b - 25.0).abs() <= tolerance,
        "{reader}: hot_a {a}%, hot_b {b}% (want 75/25 ± {tolerance:.1}, {looks:?} looks): {table:?}"
    );
}

/// The effective number of independent looks at the stacks behind `profile`'s samples, from
/// its `# signal-weights` line (see cpuprof::format::signal_weights); `None` without one.
pub fn effective_observations(profile: &Path) -> Option<f64> {
    read_profile(profile).maps.signal_weights?.effective_observations()
}

/// Held while a profiled program runs ([`run_preloaded`]): a test binary's tests run in
/// parallel, and profiled runs competing for the 2 CPUs get a few heavy signals instead of one
/// per tick, so their known answers would rest on a quarter of the looks.
static PROFILED_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One HTTP exchange over a new connection with a read timeout: the status (0 if none came)
/// and the body.
pub fn http_exchange(address: &str, request: &[u8], timeout: std::time::Duration) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(address).unwrap();
    conn.set_read_timeout(Some(timeout)).unwrap();
    let _ = conn.write_all(request);
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response);
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(response.len());
    let status = String::from_utf8_lossy(&response[..head_end])
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response[(head_end + 4).min(response.len())..].to_vec())
}
