//! The skip policy (tests/README.md): a test that needs a tool not installed here, or root, is
//! skipped with the reason printed, except under `CI=true`, where it fails: CI installs every
//! tool (.ci/run) and runs as root, so a skip there would hide a test that never ran.

use std::path::Path;

/// Whether this run is CI's (`CI=true`), where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips the calling test with `reason` printed, or fails it under `CI=true`. Returns false, for
/// `if !ok { return skip(...) }`-style use; see [`require_tools`] and [`require_root`].
pub fn skip(reason: &str) -> bool {
    assert!(!in_ci(), "CI=true, so this test may not be skipped: {reason}");
    eprintln!("skipped: {reason}");
    false
}

/// Whether `tool` (a name looked up in PATH, or a path) is an executable file.
pub fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if tool.contains('/') {
        return executable(Path::new(tool));
    }
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| executable(&d.join(tool))))
}

/// True if every tool is installed; otherwise [`skip`]s naming the missing ones.
/// Usage: `if !require_tools(&["perf"]) { return; }`.
pub fn require_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    missing.is_empty() || skip(&format!("{missing:?} not installed (.ci/run installs them)"))
}

/// True if `path` exists; otherwise [`skip`]s: `what` (a package, say) is not installed.
pub fn require_file(path: &Path, what: &str) -> bool {
    path.exists() || skip(&format!("{what} is not installed (no {})", path.display()))
}

/// True if the test runs as root; otherwise [`skip`]s: `needs` says what needs root.
pub fn require_root(needs: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root || skip(&format!("{needs} needs root (CI runs as root)"))
}
