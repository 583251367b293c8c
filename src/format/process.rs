//! Which process wrote a profile, recorded after the maps text:
//!
//! ```text
//! # process 4242 4100 started /usr/sbin/nginx -g daemon%20off;
//! ```
//!
//! (`# process`, the process id, its parent's id, `forked` or `started`, then the command line:
//! each argument percent-encoded, separated by single spaces). A program run as a tree of
//! processes (a compiler driver, a prefork server, a browser) writes one profile per process;
//! this line lets a reader tell them apart and name them as their user did, by `argv[0]` and
//! the arguments rather than by the file the kernel mapped (`redis-server` is a symlink to
//! `redis-check-rdb`).
//!
//! * `forked`: the profile continues a profiled parent's across `fork` (a prefork server's
//!   worker); `started`: profiling started in this process image (preloaded at `exec`, or
//!   through the API).
//! * The command line is `/proc/self/cmdline` when the profile was completed: what `ps` shows,
//!   including a title the program wrote over its arguments (`nginx: worker process`). Its
//!   NUL-separated arguments are split; empty arguments at the end (the padding a program
//!   leaves after writing a shorter title) are dropped. Bytes outside `!`..`~` (controls, space,
//!   non-ASCII), and `%`, `=` and `]`, are written `%XX` (upper-case hex); an empty argument
//!   elsewhere is the empty string between two spaces. No argument: nothing after the third
//!   field.
//!
//! The spelling follows the build-id lines' rules (see [`super::build_id`]): it starts with `#`
//! and holds no `=` or `]`, so google-pprof and go tool pprof skip it, whatever the arguments.
//!
//! This module is pure code: the writer reads the process's ids and command line.

const PREFIX: &str = "# process ";

/// Longest command line recorded, in bytes before encoding; longer ones are cut there (a
/// Chromium renderer's is ~2-4 KiB; the kernel allows megabytes).
pub const MAX_COMMAND_LINE: usize = 64 << 10;

/// The process that wrote a profile: a `# process` line.
///
/// ```
/// use cpuprof::format::ProcessLine;
///
/// let p = ProcessLine {
///     pid: 4242,
///     ppid: 4100,
///     forked: false,
///     args: ProcessLine::args_of_cmdline(b"/usr/sbin/nginx\0-g\0daemon off;\0"),
/// };
/// assert_eq!(p.line(), "# process 4242 4100 started /usr/sbin/nginx -g daemon%20off;\n");
/// assert_eq!(ProcessLine::parse_line(&p.line()), Some(p));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessLine {
    /// The process id.
    pub pid: u32,
    /// Its parent's, when the profile was completed (the reaper's if the parent had exited).
    pub ppid: u32,
    /// Whether the profile continues a profiled parent's across `fork`.
    pub forked: bool,
    /// The command line's arguments, `argv[0]` first, as bytes (not necessarily UTF-8).
    pub args: Vec<Vec<u8>>,
}

impl ProcessLine {
    /// The arguments of a `/proc/<pid>/cmdline` text: split at NULs, empty arguments at the end
    /// dropped, at most [`MAX_COMMAND_LINE`] bytes read.
    pub fn args_of_cmdline(cmdline: &[u8]) -> Vec<Vec<u8>> {
        cmdline_args(cmdline).map(<[u8]>::to_vec).collect()
    }

    /// The line (newline included), to append to a profile's maps text.
    pub fn line(&self) -> String {
        let mut out = Vec::new();
        write_line(
            self.pid,
            self.ppid,
            self.forked,
            self.args.iter().map(Vec::as_slice),
            &mut |piece| out.extend_from_slice(piece),
        );
        // Only ASCII is written.
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The process a `# process` line records; `None` for any other line, or one that is not
    /// spelled as [`ProcessLine::line`] writes it.
    pub fn parse_line(line: &str) -> Option<ProcessLine> {
        let rest = line.trim_start().strip_prefix(PREFIX)?;
        let rest = rest.strip_suffix('\n').unwrap_or(rest);
        let mut fields = rest.splitn(4, ' ');
        let pid = number(fields.next()?)?;
        let ppid = number(fields.next()?)?;
        let forked = match fields.next()? {
            "forked" => true,
            "started" => false,
            _ => return None,
        };
        let args = match fields.next() {
            None => Vec::new(),
            Some(args) => args.split(' ').map(decode).collect::<Option<_>>()?,
        };
        Some(ProcessLine {
            pid,
            ppid,
            forked,
            args,
        })
    }

    /// `argv[0]`, read as UTF-8 (lossily); `None` without arguments.
    pub fn argv0(&self) -> Option<String> {
        self.args.first().map(|a| String::from_utf8_lossy(a).into_owned())
    }

    /// The command line for people: the arguments separated by spaces, each as it is if it is
    /// printable UTF-8 without blanks, quotes or backslashes, else in double quotes with Rust's
    /// escapes (`\n`, `\"`, `\u{..}`; `\xNN` for bytes that are not UTF-8).
    ///
    /// ```
    /// use cpuprof::format::ProcessLine;
    ///
    /// let args = vec![b"nginx".to_vec(), b"-g".to_vec(), b"daemon off;".to_vec(), b"\xff\n".to_vec()];
    /// let p = ProcessLine { args, ..ProcessLine::default() };
    /// assert_eq!(p.command_line(), r#"nginx -g "daemon off;" "\xff\n""#);
    /// ```
    pub fn command_line(&self) -> String {
        let shown: Vec<String> = self.args.iter().map(|a| show_arg(a)).collect();
        shown.join(" ")
    }
}

fn show_arg(arg: &[u8]) -> String {
    match std::str::from_utf8(arg) {
        Ok(s)
            if !s.is_empty()
                && s.chars()
                    .all(|c| !c.is_whitespace() && !c.is_control() && !"\"'\\".contains(c)) =>
        {
            s.to_string()
        }
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("\"{}\"", arg.escape_ascii()),
    }
}

/// The arguments of a `/proc/<pid>/cmdline` text, without allocating: split at NULs, empty
/// arguments at the end dropped, at most [`MAX_COMMAND_LINE`] bytes read. Async-signal-safe.
pub fn cmdline_args(cmdline: &[u8]) -> impl Iterator<Item = &[u8]> {
    let cmdline = &cmdline[..cmdline.len().min(MAX_COMMAND_LINE)];
    let end = cmdline.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let cmdline = &cmdline[..end];
    cmdline.split(|&b| b == 0).filter(move |_| end > 0)
}

/// Writes the `# process` line of process `pid` (parent `ppid`, `forked` or not, `args`)
/// through `sink`, piece by piece, without allocating: the one spelling of the line, for
/// [`ProcessLine::line`] and for a profile completed in a signal handler. Async-signal-safe if
/// `sink` is.
pub fn write_line<'a>(
    pid: u32,
    ppid: u32,
    forked: bool,
    args: impl Iterator<Item = &'a [u8]>,
    sink: &mut impl FnMut(&[u8]),
) {
    sink(PREFIX.as_bytes());
    write_number(pid, sink);
    sink(b" ");
    write_number(ppid, sink);
    sink(if forked { b" forked" } else { b" started" });
    for arg in args {
        sink(b" ");
        encode(arg, sink);
    }
    sink(b"\n");
}

fn write_number(value: u32, sink: &mut impl FnMut(&[u8])) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut v = value;
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    sink(&digits[at..]);
}

/// A pid as the line writes it: decimal digits only.
fn number(field: &str) -> Option<u32> {
    field
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| field.parse().ok())
        .flatten()
}

/// Whether `b` is written as itself: printable ASCII other than `%`, `=` and `]`.
fn is_safe(b: u8) -> bool {
    (b'!'..=b'~').contains(&b) && !matches!(b, b'%' | b'=' | b']')
}

/// Writes `arg` percent-encoded through `sink`, runs of safe bytes at once.
fn encode(arg: &[u8], sink: &mut impl FnMut(&[u8])) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut safe_from = 0;
    for (i, &b) in arg.iter().enumerate() {
        if !is_safe(b) {
            sink(&arg[safe_from..i]);
            sink(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            safe_from = i + 1;
        }
    }
    sink(&arg[safe_from..]);
}

/// The bytes of an encoded argument; `None` if it holds a byte that would have been encoded or
/// a `%` not followed by two hex digits.
fn decode(field: &str) -> Option<Vec<u8>> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if is_safe(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(args: &[&[u8]]) -> ProcessLine {
        ProcessLine {
            pid: 17,
            ppid: 1,
            forked: true,
            args: args.iter().map(|a| a.to_vec()).collect(),
        }
    }

    #[test]
    fn the_line_round_trips() {
        let p = process(&[b"/usr/bin/app", b"--flag", b"two words"]);
        assert_eq!(p.line(), "# process 17 1 forked /usr/bin/app --flag two%20words\n");
        assert_eq!(ProcessLine::parse_line(&p.line()), Some(p.clone()));
        assert_eq!(ProcessLine::parse_line(p.line().trim_end()), Some(p));
        let bare = ProcessLine {
            pid: 1,
            ppid: 0,
            forked: false,
            args: Vec::new(),
        };
        assert_eq!(bare.line(), "# process 1 0 started\n");
        assert_eq!(ProcessLine::parse_line(&bare.line()), Some(bare));
    }

    #[test]
    fn hostile_command_lines_stay_on_one_skippable_line_and_round_trip() {
        let hostile: &[&[u8]] = &[
            b"prog",
            b"a=b",
            b"x] y",
            b"line\nbreak\r\n",
            b"\xff\xfe not utf-8 \xc3",
            b"caf\xc3\xa9",
            b"100%",
            b"%41",
            b"",
            b"\t \x7f\x01",
            b"# build-id 1000-2000 abcd",
            b"1000-2000 r-xp 00000000 08:01 5 /bin/app",
            b"$build",
            b"I0101 00:00:00.000 1 x.cc:1] ",
        ];
        let p = process(hostile);
        let line = p.line();
        let body = line.strip_suffix('\n').unwrap();
        assert!(!body.contains(['=', ']', '\n', '\r', '\t']), "{line}");
        assert!(body.bytes().all(|b| (b' '..=b'~').contains(&b)), "{line}");
        assert!(line.starts_with("# process "));
        assert_eq!(ProcessLine::parse_line(&line), Some(p));
        // As the maps text is read: lossily, line by line.
        let maps = crate::format::Maps::parse(line.as_bytes());
        assert!(maps.entries.is_empty());
        assert_eq!(maps.process.unwrap().args[4], b"\xff\xfe not utf-8 \xc3");
    }

    #[test]
    fn cmdline_arguments_are_split_and_padding_dropped() {
        assert_eq!(
            ProcessLine::args_of_cmdline(b"nginx: worker process\0\0\0\0"),
            vec![b"nginx: worker process".to_vec()]
        );
        assert_eq!(
            ProcessLine::args_of_cmdline(b"ssh\0\0host\0"),
            vec![b"ssh".to_vec(), Vec::new(), b"host".to_vec()]
        );
        assert!(ProcessLine::args_of_cmdline(b"").is_empty());
        let long = vec![b'a'; MAX_COMMAND_LINE + 10];
        assert_eq!(ProcessLine::args_of_cmdline(&long)[0].len(), MAX_COMMAND_LINE);
        // An empty argument between others survives the line.
        let p = process(&[b"ssh", b"", b"host"]);
        assert_eq!(p.line(), "# process 17 1 forked ssh  host\n");
        assert_eq!(ProcessLine::parse_line(&p.line()), Some(p));
    }

    #[test]
    fn command_lines_are_shown_unambiguously() {
        let p = process(&[
            b"sh",
            b"-c",
            b"./a 0.6; ./b",
            b"",
            b"it's",
            b"caf\xc3\xa9",
            b"\xc3(\x01",
        ]);
        assert_eq!(p.command_line(), r#"sh -c "./a 0.6; ./b" "" "it's" café "\xc3(\x01""#);
    }

    #[test]
    fn other_lines_are_not_process_lines() {
        for other in [
            "# process",
            "# process 1 2",
            "# process 1 2 spawned x",
            "# process -1 2 started x",
            "# process +1 2 started x",
            "# process 1 99999999999 started x",
            "# process 1 2 started a%4",
            "# process 1 2 started a%zz",
            "# process 1 2 started a=b",
            "# process 1 2 started a]b",
            "# process 1 2 started a\tb",
            "# process 1 2 started caf\u{e9}",
            "# build-id 1000-2000 abcd",
            "# signal-weights 1 2 3",
            "1000-2000 r-xp 00000000 08:01 5 /bin/app",
        ] {
            assert_eq!(ProcessLine::parse_line(other), None, "{other}");
        }
    }
}
