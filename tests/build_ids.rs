//! Build-ids recorded in profiles (tests/c/build_ids.c): what the profiler records is checked
//! against `readelf -n`, the real readers must not notice the added lines, the CLI warns about
//! a binary rebuilt in place (same path, same inode, other code), and profiles without the
//! lines (gperftools') read as before.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

const FLAGS: &[&str] = &["-O1", "-fno-omit-frame-pointer", "-ldl"];

/// `build_ids.c` compiled into `dir/prog` (over any file there, as `gcc -o` does).
fn build(dir: &Path, variant: bool) -> PathBuf {
    let mut flags = FLAGS.to_vec();
    if variant {
        flags.push("-DVARIANT");
    }
    compile_c(dir, "build_ids.c", "prog", &flags, false)
}

/// The variant of `dir/prog` written into the same file, so that path and inode stay the same
/// for certain (`gcc -o` unlinks the old file; the file system often, not always, hands its
/// inode number to the new one).
fn rebuild_in_place(dir: &Path) -> PathBuf {
    let prog = dir.join("prog");
    let before = inode(&prog);
    let scratch = dir.join("variant");
    std::fs::create_dir_all(&scratch).unwrap();
    let built = build(&scratch, true);
    std::fs::copy(built, &prog).unwrap();
    assert_eq!(inode(&prog), before, "rebuilt in place: same path, same inode");
    prog
}

/// The build-id `readelf -n` prints for `path`.
fn readelf_build_id(path: &Path) -> String {
    let out = run_ok(Path::new("readelf"), &["-n", path.to_str().unwrap()], &[]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("readelf -n {}: no build-id", path.display()))
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn cpuprof(args: &[&str]) -> Output {
    run_ok(cli(), args, &[])
}

/// The `# build-id` lines of a profile file.
fn build_id_lines(profile: &Path) -> Vec<String> {
    String::from_utf8_lossy(&std::fs::read(profile).unwrap())
        .lines()
        .filter(|l| l.starts_with("# build-id "))
        .map(str::to_string)
        .collect()
}

/// (path, build-id) of each mapping of a pprof protobuf, as `go tool pprof -raw` prints them.
fn pprof_mappings(pb: &Path) -> Vec<(String, String)> {
    let out = run_ok(
        Path::new("go"),
        &["tool", "pprof", "-raw", pb.to_str().unwrap()],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mappings = text
        .split("Mappings")
        .nth(1)
        .expect("go tool pprof -raw lists mappings");
    mappings
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let id = fields.get(3).filter(|f| !f.starts_with('['))?;
            Some((fields[2].to_string(), id.to_string()))
        })
        .collect()
}

/// The path of libc in a profile's maps.
fn libc_of(profile: &Path) -> String {
    read_profile(profile)
        .maps
        .entries
        .iter()
        .find(|e| e.is_executable() && e.path.contains("/libc.so"))
        .expect("libc mapped")
        .path
        .clone()
}

#[test]
fn protobuf_carries_the_recorded_build_ids_checked_against_readelf() {
    let dir = scratch_dir("bids-pprof");
    let prog = build(&dir, false);
    let profiled_id = readelf_build_id(&prog);
    let profile = dir.join("prog.prof");
    // A second of CPU: enough samples of hot_b (a quarter) even when sibling tests or a busy
    // machine leave the timer few looks (0.3 s once gave it none under load).
    run_preloaded(&prog, &["hot", "1"], &profile, &[]);
    let libc = libc_of(&profile);
    let libc_id = readelf_build_id(Path::new(&libc));

    // Rebuilt in place with other code after profiling: the protobuf must still name the code
    // that ran (the recorded build-id), not the file now on disk.
    rebuild_in_place(&dir);
    let rebuilt_id = readelf_build_id(&prog);
    assert_ne!(rebuilt_id, profiled_id, "the variant is other code");

    let pb = dir.join("prog.pb.gz");
    let out = cpuprof(&[
        "convert",
        "--to",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
        profile.to_str().unwrap(),
    ]);
    assert!(stderr(&out).contains("rebuilt since profiling"), "{}", stderr(&out));
    let mappings = pprof_mappings(&pb);
    let id_of = |path: &str| {
        mappings
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, id)| id.clone())
            .unwrap_or_else(|| panic!("no build-id for {path} in {mappings:?}"))
    };
    assert_eq!(id_of(prog.to_str().unwrap()), profiled_id);
    assert_eq!(id_of(&libc), libc_id);

    // merge keeps the recorded build-ids of the mappings it keeps.
    let merged = dir.join("merged.prof");
    let m = merged.to_str().unwrap();
    cpuprof(&["merge", "-o", m, profile.to_str().unwrap(), profile.to_str().unwrap()]);
    let merged_maps = read_profile(&merged).maps;
    let merged_id = |path: &str| {
        merged_maps
            .entries
            .iter()
            .find(|e| e.is_executable() && e.path == path)
            .and_then(|e| e.build_id.clone())
    };
    assert_eq!(merged_id(prog.to_str().unwrap()), Some(profiled_id.clone()));
    assert_eq!(merged_id(&libc), Some(libc_id.clone()));

    // dump shows each executable mapping's recorded build-id.
    let dump = String::from_utf8_lossy(&cpuprof(&["dump", profile.to_str().unwrap()]).stdout).into_owned();
    for (path, id) in [(prog.to_str().unwrap(), &profiled_id), (libc.as_str(), &libc_id)] {
        assert!(
            dump.lines()
                .any(|l| l.contains(" r-xp ") && l.contains(path) && l.ends_with(&format!(" build-id={id}"))),
            "{path} {id} in:\n{dump}"
        );
    }
}

#[test]
fn a_binary_rebuilt_in_place_is_warned_about_and_a_matching_copy_is_preferred() {
    let dir = scratch_dir("bids-rebuilt");
    let prog = build(&dir, false);
    let profiled_id = readelf_build_id(&prog);
    let saved = dir.join("saved");
    std::fs::create_dir_all(&saved).unwrap();
    std::fs::copy(&prog, saved.join("prog")).unwrap();
    let profile = dir.join("prog.prof");
    // A second of CPU: enough samples of hot_b (a quarter) even when sibling tests or a busy
    // machine leave the timer few looks (0.3 s once gave it none under load).
    run_preloaded(&prog, &["hot", "1"], &profile, &[]);
    let top = |extra: &[&str]| {
        let mut args = vec!["top", "-n", "50"];
        args.extend_from_slice(extra);
        args.push(profile.to_str().unwrap());
        cpuprof(&args)
    };
    let names_hot_functions = |out: &Output| {
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("hot_a") && text.contains("hot_b")
    };

    let fresh = top(&[]);
    assert!(!stderr(&fresh).contains("warning"), "{}", stderr(&fresh));
    assert!(names_hot_functions(&fresh));

    // The same source rebuilt with gcc -o (whatever the inode is now): same code, same
    // build-id, no warning.
    build(&dir, false);
    assert_eq!(readelf_build_id(&prog), profiled_id, "gcc builds the same code alike");
    let unchanged = top(&[]);
    assert!(!stderr(&unchanged).contains("warning"), "{}", stderr(&unchanged));

    // Other code at the same path and inode: the inode check cannot see it, the build-id does.
    // And other code from gcc -o, whatever its inode.
    for rebuild in [rebuild_in_place, |dir: &Path| build(dir, true)] {
        rebuild(&dir);
        let rebuilt_id = readelf_build_id(&prog);
        assert_ne!(rebuilt_id, profiled_id);
        let warned = top(&[]);
        let expected = format!(
            "{}: rebuilt since profiling: build-id {profiled_id} recorded, {rebuilt_id} on disk; names may be wrong",
            prog.display()
        );
        assert!(stderr(&warned).contains(&expected), "{}", stderr(&warned));
    }

    // A copy of the code that ran, given with --binary or found on the search path, is taken
    // instead of the rebuilt file, without a warning.
    for extra in [
        ["--binary", saved.join("prog").to_str().unwrap()],
        ["--search-path", saved.to_str().unwrap()],
    ] {
        let out = top(&extra);
        assert!(!stderr(&out).contains("warning"), "{extra:?}: {}", stderr(&out));
        assert!(names_hot_functions(&out), "{extra:?}");
    }
}

/// `profile` without its `# build-id` lines and the `# signal-weights` and `# process` lines
/// after them (all of cpuprof's additions to the maps text), written beside it.
fn without_build_ids(profile: &Path) -> PathBuf {
    let bytes = std::fs::read(profile).unwrap();
    let at = bytes
        .windows(12)
        .position(|w| w == b"\n# build-id ")
        .expect("the profile records build-ids")
        + 1;
    let stripped = profile.with_extension("without-ids.prof");
    std::fs::write(&stripped, &bytes[..at]).unwrap();
    stripped
}

/// Arguments the `# process` line must carry without a reader noticing: `=` (go pprof's
/// `attr=value`), `]` (its glog prefix), line breaks, lines of the other kinds, and bytes that
/// are not UTF-8.
fn hostile_arguments() -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    let args: [&[u8]; 8] = [
        b"a=b",
        b"x:1] y",
        b"two\nlines\r\n",
        b"\n1000-2000 r-xp 00000000 08:01 5 /bin/fake\n",
        b"\n# build-id 1000-2000 abcd\nbuild=/x",
        b"\xff\xfe\x80 %41 $build",
        b"",
        b"caf\xc3\xa9",
    ];
    args.iter().map(|a| std::ffi::OsString::from_vec(a.to_vec())).collect()
}

#[test]
fn readers_read_the_same_profile_with_and_without_the_build_id_lines() {
    let dir = scratch_dir("bids-readers");
    let prog = build(&dir, false);
    let profile = dir.join("prog.prof");
    // build_ids.c ignores arguments after its own: a hostile command line for the process line.
    let out = {
        let _alone = alone();
        Command::new(&prog)
            .args(["hot", "0.5"])
            .args(hostile_arguments())
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE", &profile)
            .output()
            .unwrap()
    };
    assert!(out.status.success(), "{out:?}");
    assert!(build_id_lines(&profile).len() >= 2, "the program and libc at least");
    let text = String::from_utf8_lossy(&std::fs::read(&profile).unwrap()).into_owned();
    let process = read_profile(&profile).maps.process.expect("a # process line");
    let args: Vec<Vec<u8>> = [prog.as_os_str().to_owned(), "hot".into(), "0.5".into()]
        .into_iter()
        .chain(hostile_arguments())
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .collect();
    assert_eq!(process.args, args, "{text}");
    assert_eq!((process.ppid, process.forked), (std::process::id(), false));
    let line = text.lines().find(|l| l.starts_with("# process ")).unwrap();
    assert!(!line.contains(['=', ']']), "{line}");
    // The arguments' line breaks stay inside the line: no fake mapping or build-id.
    let maps = read_profile(&profile).maps;
    assert!(maps.entries.iter().all(|e| e.path != "/bin/fake"), "{line}");
    assert_eq!(text.matches("\n# build-id 1000-2000").count(), 0, "{line}");
    let stripped = without_build_ids(&profile);
    assert!(build_id_lines(&stripped).is_empty());
    assert!(text.contains("\n# signal-weights "));
    let stripped_text = String::from_utf8_lossy(&std::fs::read(&stripped).unwrap()).into_owned();
    assert!(!stripped_text.contains("# signal-weights") && !stripped_text.contains("# process"));
    let (prog_s, with, without) = (
        prog.to_str().unwrap(),
        profile.to_str().unwrap(),
        stripped.to_str().unwrap(),
    );
    let home = [("HOME", std::env::temp_dir().to_str().unwrap().to_string())];
    let home: Vec<(&str, &str)> = home.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let readers: [(&str, Vec<&str>); 4] = [
        ("google-pprof", vec!["--text", prog_s]),
        ("go", vec!["tool", "pprof", "-top", prog_s]),
        ("go", vec!["tool", "pprof", "-raw", prog_s]),
        (cli().to_str().unwrap(), vec!["top"]),
    ];
    for (reader, args) in readers {
        let output = |file: &str| {
            let mut all = args.clone();
            all.push(file);
            let out = run_ok(Path::new(reader), &all, &home);
            // -raw names the profile file it read.
            String::from_utf8_lossy(&out.stdout).replace(file, "PROFILE")
        };
        let (a, b) = (output(with), output(without));
        assert!(a.contains("hot_a"), "{reader} {args:?}:\n{a}");
        assert_eq!(a, b, "{reader} {args:?}");
    }
}

#[test]
fn a_gperftools_profile_reads_as_before() {
    let libprofiler = Path::new("/usr/lib/x86_64-linux-gnu/libprofiler.so");
    if !require_file(libprofiler, "gperftools' libprofiler.so (libgoogle-perftools-dev)") {
        return;
    }
    let dir = scratch_dir("bids-gperftools");
    let prog = build(&dir, false);
    let profile = dir.join("prog.prof");
    run_ok(
        &prog,
        &["hot", "0.3"],
        &[
            ("LD_PRELOAD", libprofiler.to_str().unwrap()),
            ("CPUPROFILE", profile.to_str().unwrap()),
        ],
    );
    assert!(build_id_lines(&profile).is_empty());
    assert!(read_profile(&profile).maps.entries.iter().all(|e| e.build_id.is_none()));
    let top = cpuprof(&["top", profile.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&top.stdout).contains("hot_a"));
    assert!(!stderr(&top).contains("warning"), "{}", stderr(&top));
    let dump = String::from_utf8_lossy(&cpuprof(&["dump", profile.to_str().unwrap()]).stdout).into_owned();
    assert!(!dump.contains(" build-id="), "{dump}");
    // Without recorded ones, the protobuf has the files' build-ids, as before.
    let pb = dir.join("prog.pb.gz");
    cpuprof(&[
        "convert",
        "--to",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
        profile.to_str().unwrap(),
    ]);
    let mappings = pprof_mappings(&pb);
    let expected = (prog.to_str().unwrap().to_string(), readelf_build_id(&prog));
    assert!(mappings.contains(&expected), "{expected:?} in {mappings:?}");
}

/// Runs `args` plainly and under the profiler at 100 and 4000 Hz; asserts the same exit
/// status and output, and returns the profiles. `args` and `before_each` are given the run's
/// name: "plain", "100" or "4000".
fn behaves_the_same(prog: &Path, args: impl Fn(&str) -> Vec<String>, before_each: impl Fn(&str)) -> Vec<PathBuf> {
    PlainVsProfiled::new("build_ids", prog.parent().unwrap())
        .across("CPUPROFILE_FREQUENCY", &["100", "4000"])
        .plain_succeeds()
        .run(|run| {
            before_each(&run.name);
            let args = args(&run.name);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_program(prog, &args, &run.env, &[])
        })
        .profiled
        .into_iter()
        .map(|p| {
            read_profile(&p.profile);
            p.profile
        })
        .collect()
}

#[test]
fn a_library_unloaded_and_deleted_while_profiling_keeps_its_build_id() {
    let dir = scratch_dir("bids-dlopen");
    let prog = build(&dir, false);
    let pristine = dir.join("pristine.so");
    let cc = Command::new("cc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-o"])
        .arg(&pristine)
        .arg(root().join("tests/c/plugin.c"))
        .status()
        .unwrap();
    assert!(cc.success());
    let plugin_id = readelf_build_id(&pristine);
    let plugin = |run: &str| dir.join(format!("libplugin-{run}.so"));
    let profiles = behaves_the_same(
        &prog,
        |run| vec!["dlopen".into(), plugin(run).to_str().unwrap().into(), "0.3".into()],
        |run| {
            std::fs::copy(&pristine, plugin(run)).unwrap();
        },
    );
    for (profile, hz) in profiles.iter().zip(["100", "4000"]) {
        let path = plugin(hz);
        assert!(!path.exists(), "the program deleted it");
        let p = read_profile(profile);
        let ids: Vec<_> = p
            .maps
            .entries
            .iter()
            .filter(|e| e.is_executable() && Path::new(&e.path) == path)
            .map(|e| e.build_id.clone())
            .collect();
        assert_eq!(ids, vec![Some(plugin_id.clone())], "{hz} Hz");
    }
}

#[test]
fn code_mapped_from_a_file_truncated_under_it_is_read_without_a_fault() {
    // The copy's pages now raise SIGBUS when touched: the profiler reads mapped images through
    // /proc/self/mem, which fails instead. The program must not notice; the copy has no build-id.
    let dir = scratch_dir("bids-truncated");
    let prog = build(&dir, false);
    let copy = |run: &str| dir.join(format!("copy-{run}"));
    let profiles = behaves_the_same(
        &prog,
        |run| vec!["truncated".into(), copy(run).to_str().unwrap().into(), "0.3".into()],
        |_| {},
    );
    let prog_id = readelf_build_id(&prog);
    for (profile, hz) in profiles.iter().zip(["100", "4000"]) {
        let p = read_profile(profile);
        let truncated: Vec<_> = p
            .maps
            .entries
            .iter()
            .filter(|e| e.is_executable() && Path::new(&e.path) == copy(hz))
            .collect();
        assert_eq!(truncated.len(), 1, "{hz} Hz: the copy is mapped as code");
        assert_eq!(truncated[0].build_id, None);
        let main = p
            .maps
            .entries
            .iter()
            .find(|e| e.is_executable() && Path::new(&e.path) == prog);
        assert_eq!(main.and_then(|e| e.build_id.clone()), Some(prog_id.clone()), "{hz} Hz");
    }
}

#[test]
fn the_endpoint_protobuf_carries_build_ids_checked_against_readelf() {
    let dir = scratch_dir("bids-endpoint");
    let prog = build(&dir, false);
    let served = HttpChild::start(&prog, &["hot", "6"], &[]);
    let address = served.address.clone();
    let request = b"GET /debug/pprof/profile?seconds=1 HTTP/1.1\r\n\r\n";
    let (status, body) = http_exchange(&address, request, std::time::Duration::from_secs(60));
    assert_eq!(status, 200);
    let pb = dir.join("endpoint.pb.gz");
    std::fs::write(&pb, body).unwrap();
    let (out, _) = served.finish();
    assert!(out.status.success());
    let mappings = pprof_mappings(&pb);
    let libc = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .find(|l| l.contains("/libc.so"))
        .and_then(|l| l.split_whitespace().nth(5))
        .unwrap()
        .to_string();
    for path in [prog.to_str().unwrap(), libc.as_str()] {
        let expected = (path.to_string(), readelf_build_id(Path::new(path)));
        assert!(mappings.contains(&expected), "{expected:?} in {mappings:?}");
    }
}
