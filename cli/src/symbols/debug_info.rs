//! Finds the separate debug info of an object, where gdb and perf look for it: distributions
//! strip their libraries and ship the symbols and DWARF apart (Debian's `libc6-dbg` and
//! `-dbgsym` packages, `objcopy --only-keep-debug`), so without this `libc.so.6` is one
//! unnamed row.
//!
//! In order, the first file that proves to belong to the object wins:
//! 1. by build-id, `DIR/.build-id/xx/rest.debug` for each `--debug-dir` DIR and then
//!    `/usr/lib/debug`; the candidate's own build-id must match;
//! 2. by `.gnu_debuglink` NAME: `NAME` beside the object, `.debug/NAME` beside it, and
//!    `DIR/<object's directory>/NAME` for each debug directory; the candidate's CRC-32 must
//!    equal the one the link records;
//! 3. by build-id from the debuginfod servers in `DEBUGINFOD_URLS` (see [`Debuginfod`]), only
//!    when that variable is set and not empty: nothing here touches the network otherwise.
//!
//! A debug file made with `--only-keep-debug` keeps the section addresses of its object but
//! not its code (`.text` is NOBITS), so the caller keeps taking segments from the object and
//! only symbols and DWARF from the file found here.

use crate::symbols::{open_regular, read_opened};
use cpuprof::format::build_id::hex;
use object::{Object, ObjectSection};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The system's debug directory, as gdb's and perf's default `debug-file-directory`.
const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// A file holding an object's debug info, read whole.
pub struct DebugFile {
    pub path: PathBuf,
    pub data: Vec<u8>,
}

/// Where debug files are searched for, and the debuginfod client if one is configured.
pub struct DebugSearch {
    /// `--debug-dir` directories, then the system's.
    dirs: Vec<PathBuf>,
    debuginfod: Option<Debuginfod>,
}

impl DebugSearch {
    /// A search of `debug_dirs` (then `/usr/lib/debug`), and of debuginfod as the environment
    /// configures it.
    pub fn new(debug_dirs: &[PathBuf]) -> Self {
        let mut dirs = debug_dirs.to_vec();
        dirs.push(PathBuf::from(SYSTEM_DEBUG_DIR));
        DebugSearch {
            dirs,
            debuginfod: Debuginfod::from_env(),
        }
    }

    /// The debug file for `object` (parsed from the file at `path`), if one is found. Files
    /// that look right by name but belong to another build are refused with a warning, since
    /// they would name the code wrongly.
    pub fn find(&mut self, path: &Path, object: &object::File) -> Option<DebugFile> {
        let build_id = object.build_id().ok().flatten().filter(|id| id.len() >= 2);
        if let Some(id) = build_id {
            for dir in &self.dirs {
                if let Some(found) = by_build_id(&build_id_path(dir, id), id) {
                    return Some(found);
                }
            }
        }
        if let Ok(Some((name, crc))) = object.gnu_debuglink() {
            if let Some(found) = self.by_debuglink(path, name, crc) {
                return Some(found);
            }
        }
        let id = build_id?;
        self.debuginfod.as_mut()?.fetch(&hex(id))
    }

    fn by_debuglink(&self, path: &Path, name: &[u8], crc: u32) -> Option<DebugFile> {
        use std::os::unix::ffi::OsStrExt;
        let name = Path::new(std::ffi::OsStr::from_bytes(name));
        // A link is a bare file name; one with directories could point anywhere.
        if name.components().count() != 1 || name.is_absolute() {
            return None;
        }
        let own_identity = open_regular(path).ok().map(|(_, _, identity)| identity);
        let dir = path.parent()?;
        let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
        let relative = dir.strip_prefix("/").unwrap_or(dir);
        candidates.extend(self.dirs.iter().map(|d| d.join(relative).join(name)));
        for candidate in candidates {
            let Ok((file, size, identity)) = open_regular(&candidate) else {
                continue;
            };
            // A link naming the object itself (`libfoo.so` linking `libfoo.so`) is no debug file.
            if Some(identity) == own_identity {
                continue;
            }
            let Some(data) = read_opened(file, size) else { continue };
            let actual = crc32fast::hash(&data);
            if actual == crc {
                return Some(DebugFile { path: candidate, data });
            }
            eprintln!(
                "cpuprof: warning: {}: CRC {actual:08x} differs from the {crc:08x} that {}'s .gnu_debuglink records (another build); not used",
                candidate.display(),
                path.display()
            );
        }
        None
    }

    /// The supplementary file (`dwz`'s common DWARF) that `debug` refers to by
    /// `.gnu_debugaltlink`, if any, found by its path or by its build-id in the debug directories.
    pub fn find_alt(&self, debug: &DebugFile) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let file = object::File::parse(&*debug.data).ok()?;
        let (name, id) = file.gnu_debugaltlink().ok()??;
        let named = debug.path.parent()?.join(Path::new(std::ffi::OsStr::from_bytes(name)));
        let mut candidates = vec![named];
        if id.len() >= 2 {
            candidates.extend(self.dirs.iter().map(|d| build_id_path(d, id)));
        }
        candidates.into_iter().find(|c| by_build_id(c, id).is_some())
    }
}

/// `DIR/.build-id/xx/rest.debug` for build-id `id` (at least 2 bytes).
fn build_id_path(dir: &Path, id: &[u8]) -> PathBuf {
    let hex = hex(id);
    dir.join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]))
}

/// The file at `path` if it is an ELF file with build-id `id`.
fn by_build_id(path: &Path, id: &[u8]) -> Option<DebugFile> {
    let (file, size, _) = open_regular(path).ok()?;
    let data = read_opened(file, size)?;
    let found = object::File::parse(&*data).ok()?.build_id().ok()??.to_vec();
    if found != id {
        eprintln!(
            "cpuprof: warning: {}: build-id {} is not the {} its path says; not used",
            path.display(),
            hex(&found),
            hex(id)
        );
        return None;
    }
    Some(DebugFile {
        path: path.to_path_buf(),
        data,
    })
}

/// Whether `object` carries DWARF of its own (then no separate file is looked for, as gdb
/// does: an unstripped build is complete).
pub fn has_dwarf(object: &object::File) -> bool {
    object
        .section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

/// A client of the debuginfod protocol (`GET URL/buildid/HEX/debuginfo`), configured as
/// elfutils' client is: `DEBUGINFOD_URLS` (space-separated; unset or empty means no network
/// access at all), `DEBUGINFOD_TIMEOUT` (seconds to connect, to get an answer and between two
/// reads of the body; default 30) and `DEBUGINFOD_MAXTIME` (seconds for a whole download;
/// default unlimited). Files are cached in `$DEBUGINFOD_CACHE_PATH`, else
/// `$XDG_CACHE_HOME/cpuprof/debuginfod`, else `~/.cache/cpuprof/debuginfod`, as `HEX/debuginfo`
/// (elfutils' layout, so a shared `DEBUGINFOD_CACHE_PATH` works both ways).
pub struct Debuginfod {
    urls: Vec<String>,
    /// The cache directory: the DWARF reader opens files by path, so a download has to be
    /// stored before it is used.
    cache: PathBuf,
    agent: ureq::Agent,
}

impl Debuginfod {
    fn from_env() -> Option<Self> {
        let urls: Vec<String> = std::env::var("DEBUGINFOD_URLS")
            .ok()?
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let seconds = |var: &str| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&s| s > 0)
                .map(Duration::from_secs)
        };
        let timeout = seconds("DEBUGINFOD_TIMEOUT").unwrap_or(Duration::from_secs(30));
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_resolve(Some(timeout))
            .timeout_connect(Some(timeout))
            .timeout_send_request(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_global(seconds("DEBUGINFOD_MAXTIME"))
            .user_agent(concat!("cpuprof/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let cache = match std::env::var_os("DEBUGINFOD_CACHE_PATH").filter(|p| !p.is_empty()) {
            Some(p) => Some(PathBuf::from(p)),
            None => std::env::var_os("XDG_CACHE_HOME")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("cpuprof").join("debuginfod")),
        };
        let Some(cache) = cache else {
            eprintln!("cpuprof: warning: DEBUGINFOD_URLS is set but there is no cache directory (set DEBUGINFOD_CACHE_PATH or HOME); debuginfod not used");
            return None;
        };
        Some(Debuginfod { urls, cache, agent })
    }

    /// The debug file with build-id `hex`, from the cache or from the first server that has
    /// it. A server that fails (unreachable, times out, answers an error other than "not
    /// found") is warned about once and not asked again in this run, so that a profile of a
    /// hundred objects does not wait a hundred timeouts.
    fn fetch(&mut self, hex: &str) -> Option<DebugFile> {
        let id = decode_hex(hex)?;
        let cached = self.cache.join(hex).join("debuginfo");
        if let Some(found) = by_build_id(&cached, &id) {
            return Some(found);
        }
        let mut i = 0;
        while i < self.urls.len() {
            let url = format!("{}/buildid/{hex}/debuginfo", self.urls[i]);
            match self.download(&url, &id, &cached) {
                Ok(Some(found)) => return Some(found),
                Ok(None) => i += 1,
                Err(why) => {
                    eprintln!("cpuprof: warning: debuginfod {url}: {why}; this server is not asked again");
                    self.urls.remove(i);
                }
            }
        }
        None
    }

    /// `Ok(None)`: the server does not have it. The body is written under a temporary name in
    /// the cache and renamed once complete and checked, so an interrupted download never
    /// leaves a truncated file that a later run would trust.
    fn download(&self, url: &str, id: &[u8], cached: &Path) -> Result<Option<DebugFile>, String> {
        let response = self.agent.get(url).call().map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(None),
            status => return Err(format!("HTTP status {status}")),
        }
        let mut data = Vec::new();
        response
            .into_body()
            .into_reader()
            .read_to_end(&mut data)
            .map_err(|e| format!("reading the answer: {e}"))?;
        let found = object::File::parse(&*data)
            .ok()
            .and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec));
        if found.as_deref() != Some(id) {
            return Err("the answer is not an ELF file with the build-id asked for".into());
        }
        // Not the server's fault: warn, and do not count it against the server.
        if let Err(e) = store(cached, &data) {
            eprintln!(
                "cpuprof: warning: {url}: cannot cache the answer as {}: {e}",
                cached.display()
            );
            return Ok(None);
        }
        Ok(Some(DebugFile {
            path: cached.to_path_buf(),
            data,
        }))
    }
}

/// Writes `data` to `path` atomically: a temporary name in the same directory, then rename.
fn store(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(".debuginfo.{}.tmp", std::process::id()));
    let written = std::fs::write(&temporary, data).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_paths_split_the_first_byte() {
        assert_eq!(
            build_id_path(Path::new("/d"), &[0x93, 0xac, 0x61]),
            PathBuf::from("/d/.build-id/93/ac61.debug")
        );
        assert_eq!(decode_hex("93ac61"), Some(vec![0x93, 0xac, 0x61]));
        assert_eq!(decode_hex("9"), None);
    }
}
