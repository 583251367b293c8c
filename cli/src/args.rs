//! The command line: what each command takes, as clap reads it. Parsing only; what a
//! command does is in `commands`.

use crate::analysis::{gates, list};
use crate::commands::record;
use crate::input::db;
use crate::model::filters::{self, Filters};
use crate::model::unit::SampleValue;
use crate::symbols::Locator;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

const EXIT_STATUS: &str = "\
Exit status: 0 success; 1 an input is not a valid profile, or a file cannot be read or written;
2 usage error; 3 `diff` found significant changes (with --fail-on: a condition was met), or
`history` flagged an epoch. `record` exits with the recorded program's
status (128 + N if signal N killed it).";

#[derive(Parser)]
#[command(
    name = "cpuprof",
    version,
    about = "Record, read, compare and convert raw CPU profiles (gperftools format); read heap profiles",
    after_help = EXIT_STATUS
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Where to find the binaries a profile names, when they are not at their recorded paths.
#[derive(Args, Clone, Default)]
pub struct Symbols {
    /// Binary to read symbols from: stands for the mapped object of the same file name, else
    /// for the profile's main executable. Repeatable.
    #[arg(long = "binary", value_name = "FILE")]
    pub binaries: Vec<PathBuf>,
    /// Directory searched for objects missing at their recorded path. Repeatable.
    #[arg(long = "search-path", value_name = "DIR")]
    pub search_path: Vec<PathBuf>,
    /// Directory of separate debug info, searched before /usr/lib/debug: by build-id
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink (DIR/<object's directory>/NAME).
    /// Repeatable. DEBUGINFOD_URLS, when set, names debuginfod servers asked last.
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
}

impl From<Symbols> for Locator {
    fn from(s: Symbols) -> Locator {
        Locator {
            binaries: s.binaries,
            search_path: s.search_path,
            debug_dirs: s.debug_dirs,
        }
    }
}

/// `--sample-index`, which every command that reads a heap profile takes.
#[derive(Args, Clone, Copy, Default)]
pub struct SampleIndex {
    /// For a heap profile: the value read, by pprof's names: inuse_space (the default),
    /// inuse_objects, alloc_space or alloc_objects. Each line is scaled back from its samples
    /// before summing, as pprof does. For a contention profile: delay (the default, nanoseconds
    /// waited) or contentions (waits). (Also --sample_index.)
    #[arg(long = "sample-index", alias = "sample_index", value_name = "NAME", value_parser = sample_value)]
    pub value: Option<SampleValue>,
}

fn sample_value(text: &str) -> Result<SampleValue, String> {
    SampleValue::from_name(text).ok_or_else(|| {
        format!("`{text}`: expected inuse_space, inuse_objects, alloc_space or alloc_objects (heap profiles), delay or contentions (contention profiles)")
    })
}

/// `--tick-us`, which every command that judges changes takes.
#[derive(Args, Clone, Copy)]
pub struct Tick {
    /// The kernel tick (us) of the machine that recorded the profiles: the default timer looks
    /// at the stack at most once a tick, which bounds how many independent observations its
    /// samples are. Default: this machine's tick.
    #[arg(long = "tick-us", value_name = "US")]
    tick_us: Option<u64>,
}

impl Tick {
    /// The tick given, else this machine's.
    pub fn us(self) -> u64 {
        self.tick_us.unwrap_or_else(crate::analysis::local_tick_us)
    }
}

/// A profile database read instead of FILE.
#[derive(Args, Clone, Default)]
pub struct DbSource {
    /// A profile database (DIR/<epoch>/<program>.<pid>.prof; see `cpuprof db`), read instead
    /// of FILE: the selected epochs' profiles of one program summed as `merge` sums them.
    #[arg(long, value_name = "DIR", conflicts_with = "file")]
    pub db: Option<PathBuf>,
    #[command(flatten)]
    pub selection: db::Selection,
}

/// How `diff` reads and judges profiles.
#[derive(Args, Clone)]
pub struct DiffCriteria {
    /// Compare flat (self) samples instead of cumulative ones (the function and all it calls,
    /// which inlining cannot hide).
    #[arg(long)]
    pub flat: bool,
    /// The chance, when nothing changed, that anything is marked significant (family-wise,
    /// Holm's correction over the functions compared).
    #[arg(long, default_value_t = 0.001, value_parser = probability)]
    pub alpha: f64,
    /// Coverage of the intervals shown.
    #[arg(long, default_value_t = 0.95, value_parser = probability)]
    pub confidence: f64,
    /// Rows shown besides the significant ones.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub count: usize,
    #[command(flatten)]
    pub tick: Tick,
    /// The work each run did (requests, items, ...), as BASE,NEW: times are then per unit.
    /// Without it, both runs are taken to have done the same work.
    #[arg(long, value_name = "BASE,NEW", value_parser = units, conflicts_with = "history")]
    pub units: Option<(f64, f64)>,
    /// Exit with status 3 when a function grew significantly and by at least this much:
    /// `significant` (any significant growth), `share=POINTS`, `growth=PERCENT%` (of the
    /// baseline's total time), `growth=SECONDS` with s, ms or us; or when the total CPU time
    /// grew by `total=PERCENT%` (a plain threshold: set it above the run-to-run noise).
    /// Repeatable; any condition met fails.
    #[arg(long, value_name = "CONDITION")]
    pub fail_on: Vec<gates::Gate>,
}

fn probability(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p < 1.0)
        .ok_or_else(|| format!("`{text}` is not a probability between 0 and 1"))
}

fn percentage(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| format!("`{text}` is not a percentage between 0 and 100"))
}

fn units(text: &str) -> Result<(f64, f64), String> {
    let positive = |v: &str| v.trim().parse::<f64>().ok().filter(|u| u.is_finite() && *u > 0.0);
    text.split_once(',')
        .and_then(|(a, b)| Some((positive(a)?, positive(b)?)))
        .ok_or_else(|| format!("`{text}`: expected BASE,NEW, two positive numbers"))
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Target {
    /// Gzipped pprof protobuf (go tool pprof, Pyroscope, speedscope), symbolised.
    Pprof,
    /// One DCPI v0.07 profile per image, into a directory.
    Dcpi,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum AdviceFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a program under the profiler, then print a summary and its top functions.
    #[command(after_help = "Example: cpuprof record -F 1000 -o app.prof -- ./app --flag")]
    Record(RecordArgs),
    /// Flat and cumulative samples per function, like `pprof -top` (raw, DCPI or heap
    /// profiles: a heap profile's bytes or objects with --sample-index).
    Top(TopArgs),
    /// Callers and callees of each function matching REGEX, with the samples through each call,
    /// like `pprof -peek`.
    #[command(after_help = "\
A call counts a sample once however often it appears in its stack, and a function calling
itself is no call (recursion counts once). calls% is of the function's cumulative samples;
flat% and cum% of the profile's total (before filters, as in pprof).")]
    Peek(PeekArgs),
    /// What grew and what shrank between two profiles, or against a history of profiles.
    #[command(after_help = "\
For each function: the change in its share (cumulative; --flat: self time) and in its CPU time
(samples x period, per unit of work with --units), each with an interval. Counts are turned into
independent observations first: the default timer looks at the stack once per kernel tick, so at
1000 Hz on a 4 ms tick 1000 samples are ~250 observations. A change of share is marked * when
significant after Holm's correction over all functions (--alpha family-wise); times are not
marked between two runs, whose totals vary by more than sampling. The largest changes are shown
with their intervals whether significant or not, with how many times the samples would settle them.
With --history DIR, NEW is compared with the mean of the profiles in DIR, judged against their
run-to-run spread, and times are marked too. Exit status 3 when something is significant, or with
--fail-on, when a condition is met.

Heap profiles (gperftools' text format, both profiles heap profiles): the value of --sample-index
(inuse_space by default) takes the place of CPU time, and the observations are the sampled
objects, which a sampling heap profiler draws like a Poisson process: each line's objects weighted
by the bytes (or objects) each stands for, Kish's effective number of them. --fail-on growth in
seconds does not apply.")]
    Diff(DiffArgs),
    /// Source lines of each function matching REGEX with their samples, flat and cumulative
    /// (like `pprof -list`); --disasm: per instruction.
    List(ListArgs),
    /// What could be optimised: a short ranked list of hints, each with its numbers.
    #[command(after_help = "\
Hints, ranked by the share of all samples at stake: functions that grew against --history (as
`diff --history` marks them, cumulative, with intervals); a function of the program whose self
time sits on at most 3 source lines (half of it or more); known-costly families of library
functions (allocation, copying, locking, system calls, formatting and parsing, sorting, hashing,
exception unwinding, the dynamic loader) with their share, counted once per sample, and the
program's functions that call them. Functions whose time grew only with the whole run are one
hint. Hints below --min-share get one line each. --format json lists every hint with its counts.")]
    Advise(AdviseArgs),
    /// One self-contained HTML page of a profile: hints, an interactive flame graph, the
    /// function table and the hottest source; with --base or --history, what changed.
    #[command(after_help = "\
The page needs no network and no server: open it in any browser, from any machine. Click a frame
of the flame graph to zoom (Reset zoom returns), type a regular expression to highlight and total
the functions it matches, click a function (in the graph, the table or a hint) for its callers
and callees. With --base, the flame graph is differential: widths are this profile, colours the
change of each stack's share, strong where `diff` finds the function's change significant.
With --history (a directory of profiles or a profile database), the baseline is the history
pooled, growth is judged as `diff --history` judges it, and a trend chart shows the top
functions over the history's profiles with this one last.")]
    Report(ReportArgs),
    /// Folded stacks (`main;f;g 12` per line), for flame graph and other tools.
    Collapse(CollapseArgs),
    /// Draw an SVG flame graph.
    Flamegraph(FlamegraphArgs),
    /// Convert to pprof protobuf or to DCPI profiles.
    #[command(after_help = "\
With filters, the output holds only the samples they keep (readers then take these as the
total), hidden frames taken out of their stacks. A heap profile converts to pprof only, with
pprof's four heap sample types, each line scaled back; --sample-index names the one readers show
by default. With --db and --to dcpi, each selected epoch
becomes a directory of OUTPUT named after it, as in DCPI's own database.")]
    Convert(ConvertArgs),
    /// Sum profiles of the same program into one raw profile.
    Merge(MergeArgs),
    /// List a profile database: its programs (epochs, processes, samples, first and last epoch)
    /// and its epochs. Files that cannot be read are reported and counted, never fatal.
    #[command(after_help = "\
Layout: DIR/<epoch start, UTC, YYYYMMDDTHHMMSSZ>/<program>.<pid>.prof, each file a complete
profile of one process over one epoch. Names not ending in .prof, or starting with '.', are a
writer's unfinished files and are skipped. top, collapse, flamegraph and convert read a
database with --db DIR; diff reads one as --history; history draws one program's epochs.")]
    Db(DbArgs),
    /// One program's epochs in a profile database: samples and top functions' shares per epoch,
    /// as a table and an SVG line chart, flagging where a function left its usual range.
    #[command(after_help = "\
Each epoch after the first 3 is judged as `diff --history` judges a profile, against the
--window epochs before it; only changes of share are flagged (an epoch's CPU time is how busy
the program was). --alpha bounds the chance that anything in the whole table is flagged when
nothing changed: it is divided among the epochs judged (Bonferroni), Holm's correction applies
within each. Exit status 3 when something is flagged.")]
    History(HistoryArgs),
    /// Print the header, every record and the mapped objects.
    Dump(DumpArgs),
    /// Validate a profile; say exactly what is wrong and where. A wall-clock profile most of
    /// whose looks at threads are missing (their state was unreadable) is INCOMPLETE (exit
    /// status 1); fewer missing looks get a WARNING. Of a heap profile: its sampling period,
    /// lines, mappings and totals, as written and scaled back.
    Check(CheckArgs),
}

// The arguments of `cpuprof record`.
#[derive(Args)]
pub struct RecordArgs {
    /// Samples per CPU-second (default 100).
    #[arg(short = 'F', long = "frequency")]
    pub frequency: Option<u32>,
    #[arg(short = 'o', long, default_value = "cpuprof.prof")]
    pub output: PathBuf,
    /// Functions shown after the run.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub count: usize,
    /// How the processes are reported: `auto`, one report per program with the processes
    /// of one executable merged (split by Chromium-style `--type=`); `all` (or `--merge`
    /// alone), all in one; `none`, each alone.
    #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "all")]
    pub merge: record::MergeMode,
    /// Also write each report as a self-contained HTML page beside its profile (`cpuprof
    /// report`): `out.prof` gives `out.html`.
    #[arg(long)]
    pub html: bool,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    pub command: Vec<String>,
}

// The arguments of `cpuprof top`.
#[derive(Args)]
pub struct TopArgs {
    /// A raw profile, a heap profile, a DCPI profile, or a directory of DCPI profiles.
    #[arg(required_unless_present = "db")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub db: DbSource,
    /// Sort by cumulative instead of flat samples.
    #[arg(long)]
    pub cum: bool,
    /// Number of functions to show.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub count: usize,
    /// One table per value of the label KEY (`cpuprof::labels`), largest first, then the
    /// samples without KEY; each value's share of the total in its header.
    #[arg(long, value_name = "KEY")]
    pub by: Option<String>,
    /// Instead of the table, each label key's values and their shares (pprof -tags).
    #[arg(long, conflicts_with = "by")]
    pub tags: bool,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof peek`.
#[derive(Args)]
pub struct PeekArgs {
    /// Regular expression matched against function names (unanchored).
    #[arg(value_parser = filters::regex)]
    pub regex: regex::Regex,
    /// A raw profile, a heap profile, a DCPI profile, or a directory of DCPI profiles.
    pub file: PathBuf,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof diff`.
#[derive(Args)]
pub struct DiffArgs {
    /// The baseline profile (omit with --history).
    #[arg(required_unless_present = "history")]
    pub base: Option<PathBuf>,
    /// The profile to judge.
    pub new: Option<PathBuf>,
    /// Directory of earlier profiles of the same program (at least two), or a profile
    /// database whose epochs (of --program, or of NEW's `<program>.<pid>.prof`) are the runs.
    #[arg(long, value_name = "DIR")]
    pub history: Option<PathBuf>,
    /// With --history DB: the epochs taken as the history.
    #[command(flatten)]
    pub selection: db::Selection,
    /// One comparison per value of the label KEY (`cpuprof::labels`) in either profile, then
    /// the samples without KEY: what changed for each endpoint, tenant, ...
    #[arg(long, value_name = "KEY", conflicts_with = "history")]
    pub by: Option<String>,
    #[command(flatten)]
    pub criteria: DiffCriteria,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof list`.
#[derive(Args)]
pub struct ListArgs {
    /// Functions whose names match (unanchored, as pprof's; `^name$` for one).
    pub regex: regex::Regex,
    /// A raw profile.
    pub file: PathBuf,
    #[command(flatten)]
    pub options: list::Args,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof advise`.
#[derive(Args)]
pub struct AdviseArgs {
    /// A raw profile (cpuprof's or gperftools').
    pub file: PathBuf,
    /// Directory of earlier profiles of the same program (at least two), or a profile
    /// database whose epochs are the runs (as `diff --history`): adds what grew.
    #[arg(long, value_name = "DIR")]
    pub history: Option<PathBuf>,
    /// With --history DB: the epochs taken as the history.
    #[command(flatten)]
    pub selection: db::Selection,
    /// `text`, or `json` (every hint with raw counts).
    #[arg(long, value_enum, default_value = "text")]
    pub format: AdviceFormat,
    /// Hints shown in full.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub count: usize,
    /// Share at stake (%) below which a hint gets one line.
    #[arg(long, default_value_t = 1.0, value_name = "PERCENT", value_parser = percentage)]
    pub min_share: f64,
    #[command(flatten)]
    pub tick: Tick,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof report`.
#[derive(Args)]
pub struct ReportArgs {
    /// A raw profile (cpuprof's or gperftools'), or a heap profile (gperftools' text format).
    pub file: PathBuf,
    /// An earlier profile to compare with.
    #[arg(long, conflicts_with = "history")]
    pub base: Option<PathBuf>,
    /// Directory of earlier profiles of the same program, or a profile database.
    #[arg(long, value_name = "DIR")]
    pub history: Option<PathBuf>,
    /// With --history DB: the epochs taken as the history.
    #[command(flatten)]
    pub selection: db::Selection,
    #[arg(short = 'o', long, default_value = "report.html")]
    pub output: PathBuf,
    #[command(flatten)]
    pub tick: Tick,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof collapse`.
#[derive(Args)]
pub struct CollapseArgs {
    #[arg(required_unless_present = "db")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub db: DbSource,
    /// Output file (default: standard output).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof flamegraph`.
#[derive(Args)]
pub struct FlamegraphArgs {
    #[arg(required_unless_present = "db")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub db: DbSource,
    #[arg(short = 'o', long, default_value = "flamegraph.svg")]
    pub output: PathBuf,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof convert`.
#[derive(Args)]
pub struct ConvertArgs {
    #[arg(required_unless_present = "db")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub db: DbSource,
    #[arg(long = "to", value_enum)]
    pub target: Target,
    /// Output file (pprof) or directory (dcpi).
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub sample_index: SampleIndex,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof merge`.
#[derive(Args)]
pub struct MergeArgs {
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// For profiles cut short without maps: the program's executable.
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof db`.
#[derive(Args)]
pub struct DbArgs {
    pub dir: PathBuf,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof history`.
#[derive(Args)]
pub struct HistoryArgs {
    /// The profile database (see `cpuprof db`).
    #[arg(long, value_name = "DIR")]
    pub db: PathBuf,
    #[command(flatten)]
    pub selection: db::Selection,
    /// Functions shown (those with the largest mean share; flagged ones are added).
    #[arg(short = 'n', long, default_value_t = 8)]
    pub count: usize,
    /// Epochs before each one that make its usual range.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(3..))]
    pub window: u64,
    /// Flat (self) shares instead of cumulative ones.
    #[arg(long)]
    pub flat: bool,
    /// The chance, when nothing changed, that anything in the history is flagged.
    #[arg(long, default_value_t = 0.001, value_parser = probability)]
    pub alpha: f64,
    /// Coverage of the intervals shown.
    #[arg(long, default_value_t = 0.95, value_parser = probability)]
    pub confidence: f64,
    #[command(flatten)]
    pub tick: Tick,
    /// The SVG line chart.
    #[arg(short = 'o', long, default_value = "history.svg")]
    pub output: PathBuf,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub symbols: Symbols,
}

// The arguments of `cpuprof dump`.
#[derive(Args)]
pub struct DumpArgs {
    pub file: PathBuf,
}

// The arguments of `cpuprof check`.
#[derive(Args)]
pub struct CheckArgs {
    pub file: PathBuf,
}
