//! `list`'s source view: each listed function's lines with their samples, the source read
//! once per file (with `--source-path` and `--substitute`), pprof's context around them.

use super::disasm::addresses;
use super::*;

/// Function `f`'s lines, file by file, with its source where it can be read.
pub(super) fn source(tally: &mut Tally, f: u32, sources: &mut Sources, out: &mut String) {
    let mut by_file: HashMap<u32, Vec<(u32, Counts)>> = HashMap::new();
    for (&(function, file, line), &c) in &tally.lines {
        if function == f && line > 0 {
            by_file.entry(file).or_default().push((line, c));
        }
    }
    let no_line = tally
        .lines
        .iter()
        .filter(|(&(function, _, line), _)| function == f && line == 0)
        .fold(Counts::default(), |a, (_, c)| Counts {
            flat: a.flat + c.flat,
            cum: a.cum + c.cum,
        });
    if by_file.is_empty() {
        routine(tally, f, "", out);
        let _ = writeln!(
            out,
            " (no line information: its object has no DWARF line table, e.g. stripped; samples per address below, --disasm shows the instructions)"
        );
        addresses(tally, f, out);
        return;
    }
    let mut files: Vec<(u32, Vec<(u32, Counts)>)> = by_file.into_iter().collect();
    let cum_of = |lines: &[(u32, Counts)]| lines.iter().map(|(_, c)| c.cum).max().unwrap_or(0);
    files.sort_by(|a, b| cum_of(&b.1).cmp(&cum_of(&a.1)).then(a.0.cmp(&b.0)));
    for (i, (file, mut lines)) in files.into_iter().enumerate() {
        lines.sort_unstable_by_key(|&(line, _)| line);
        let path = tally.files.strings()[file as usize].clone();
        if i == 0 {
            routine(tally, f, &format!(" in {path}"), out);
        } else {
            let _ = writeln!(out, " (lines of {path}, inlined into it)");
        }
        let first = lines[0].0.saturating_sub(CONTEXT).max(1);
        let last = lines[lines.len() - 1].0.saturating_add(CONTEXT);
        match sources.get(&path) {
            Ok((read_from, text)) => {
                if read_from.as_path() != Path::new(&path) {
                    let _ = writeln!(out, " (source read from {})", read_from.display());
                }
                let mut counts = lines.iter().peekable();
                for n in first..=last.min(text.len() as u32) {
                    let c = match counts.next_if(|(line, _)| *line == n) {
                        Some(&(_, c)) => c,
                        None => Counts::default(),
                    };
                    let _ = writeln!(
                        out,
                        "{:>10} {:>10} {n:>6}:{}",
                        count(c.flat),
                        count(c.cum),
                        text[n as usize - 1]
                    );
                }
                // Lines past the end of the file read: it is not the source that was built.
                let beyond: Vec<String> = counts.map(|(line, _)| line.to_string()).collect();
                if !beyond.is_empty() {
                    let _ = writeln!(
                        out,
                        " (lines {} have samples but are past the end of {}: a different version of the source?)",
                        beyond.join(", "),
                        read_from.display()
                    );
                }
            }
            Err(why) => {
                let _ = writeln!(out, " (source not available: {why}; samples per line only)");
                for (n, c) in &lines {
                    let _ = writeln!(out, "{:>10} {:>10} {n:>6}:", count(c.flat), count(c.cum));
                }
            }
        }
    }
    if no_line.cum > 0 {
        let _ = writeln!(
            out,
            "{:>10} {:>10}      ?: (code the compiler gave no line)",
            count(no_line.flat),
            count(no_line.cum)
        );
    }
}

/// Source files by the path DWARF gives, read once each.
pub(super) struct Sources<'a> {
    args: &'a Args,
    read: HashMap<String, Result<(PathBuf, Vec<String>), String>>,
}

impl<'a> Sources<'a> {
    pub(super) fn new(args: &'a Args) -> Self {
        Sources {
            args,
            read: HashMap::new(),
        }
    }

    /// The file read for `path` and its lines, or why there is none.
    fn get(&mut self, path: &str) -> Result<&(PathBuf, Vec<String>), &String> {
        if !self.read.contains_key(path) {
            let found = self.find(path);
            self.read.insert(path.to_string(), found);
        }
        self.read[path].as_ref()
    }

    fn find(&self, path: &str) -> Result<(PathBuf, Vec<String>), String> {
        if path.is_empty() {
            return Err("DWARF names no file".to_string());
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some((old, new)) = self
            .args
            .substitutions
            .iter()
            .find(|(old, _)| path.starts_with(old.as_str()))
        {
            candidates.push(PathBuf::from(format!("{new}{}", &path[old.len()..])));
        }
        candidates.push(PathBuf::from(path));
        let parts: Vec<_> = Path::new(path)
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .collect();
        for dir in &self.args.source_dirs {
            for skip in 0..parts.len() {
                candidates.push(parts[skip..].iter().fold(dir.clone(), |p, c| p.join(c)));
            }
        }
        // Why the path DWARF gives could not be read: the first thing a user needs to know.
        let mut why = String::new();
        for candidate in &candidates {
            match read_lines(candidate) {
                Ok(lines) => return Ok((candidate.clone(), lines)),
                Err(e) if candidate.as_path() == Path::new(path) => why = e,
                Err(_) => {}
            }
        }
        let hint = if self.args.source_dirs.is_empty() && self.args.substitutions.is_empty() {
            "; give --source-dir DIR or --substitute OLD=NEW if the tree moved"
        } else {
            "; not found under --source-dir/--substitute either"
        };
        Err(format!("{why}{hint}"))
    }
}

/// The lines of a regular file of at most `MAX_SOURCE_BYTES` (a path from DWARF may name a
/// device or FIFO), or why it is not read.
pub(super) fn read_lines(path: &Path) -> Result<Vec<String>, String> {
    let (file, size, _) = open_regular(path)?;
    if size > MAX_SOURCE_BYTES {
        return Err(format!("{}: larger than {MAX_SOURCE_BYTES} bytes", path.display()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(|l| l.replace('\t', "    "))
        .collect())
}
