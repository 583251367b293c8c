//! `cpuprof report`: the self-contained HTML page, opened in Debian's headless Chromium by
//! tests/browser/report_page.py (WebDriver through chromedriver: real clicks and key presses)
//! and measured from its DOM. Screenshots are kept under target/tmp/report_html/.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// The known-answer program (hot_a 3 : hot_b 1) and its "new version" whose hot_b does twice
/// the work (hot_a 3 : hot_b 2), each profiled for 3 s at the tick's rate (~750 looks).
fn profiles() -> &'static (PathBuf, PathBuf, PathBuf) {
    static RUN: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = scratch_dir("report_html");
        let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
        let mut flags = FLAGS.to_vec();
        flags.push("-DHOT_B_WORK=2");
        let hot_b2 = compile_c(&dir, "hot.c", "hot_b2", &flags, false);
        let (split, split_b2) = (dir.join("split.prof"), dir.join("splitb2.prof"));
        run_preloaded(&hot, &["3"], &split, &[("CPUPROFILE_FREQUENCY", "250")]);
        run_preloaded(&hot_b2, &["3"], &split_b2, &[("CPUPROFILE_FREQUENCY", "250")]);
        (hot, split, split_b2)
    })
}

/// Screenshots and pages the tests keep.
fn kept(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report_html");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn report(args: &[&str], output: &Path) -> String {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", output.to_str().unwrap()]);
    run_ok(cli(), &all, &[]);
    std::fs::read_to_string(output).unwrap()
}

/// Whether what [`browse`] runs is installed (the skip policy: [`require_tools`]).
fn browser_installed() -> bool {
    require_tools(&["/usr/bin/python3", "/usr/bin/chromium", "/usr/bin/chromedriver"])
}

/// Drives the page in the browser; the script's `key value` lines.
fn browse(mode: &str, page: &Path, screenshot: &Path) -> HashMap<String, String> {
    let out = Command::new("/usr/bin/python3")
        .arg(root().join("tests/browser/report_page.py"))
        .args([mode, page.to_str().unwrap(), screenshot.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "report_page.py {mode} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let shot = std::fs::read(screenshot).unwrap();
    assert!(
        shot.starts_with(b"\x89PNG\r\n\x1a\n") && shot.len() > 10_000,
        "screenshot of {mode}"
    );
    values(&out)
}

fn number(values: &HashMap<String, String>, key: &str) -> f64 {
    values
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {values:?}"))
        .parse()
        .unwrap()
}

/// The page needs nothing beyond itself: no external script, style, image or font.
fn assert_self_contained(page: &str) {
    for reference in ["src=\"http", "href=\"http", "src=\"//", "url(http", "@import"] {
        assert!(!page.contains(reference), "the page refers outside itself: {reference}");
    }
    assert!(page.contains("<script>") && page.contains("<style>"));
}

#[test]
fn the_known_answer_is_drawn_zoomed_and_searched_in_a_browser() {
    let (hot, split, _) = profiles();
    let page_path = kept("known.html");
    let page = report(&[split.to_str().unwrap()], &page_path);
    assert_self_contained(&page);
    // Our reader and a real one on the same profile: the page must draw what they count.
    let top = cpuprof_top(split);
    assert_three_to_one("cpuprof top", &top, split);
    assert_three_to_one("google-pprof", &google_pprof(hot, split), split);
    if !browser_installed() {
        return;
    }
    let v = browse("known", &page_path, &kept("known.png"));

    let (a, b) = (number(&v, "width_hot_a"), number(&v, "width_hot_b"));
    // The known answer, with the tolerance the profile's looks give (as for the readers above:
    // 70.8/28.9 on a loaded CI rehearsal, whose readers said the same).
    let widths = HashMap::from([("hot_a".to_string(), a), ("hot_b".to_string(), b)]);
    assert_three_to_one("the page's widths", &widths, split);
    // Widths are the samples: as our reader's cumulative shares, to the pixel (1000+ px).
    for (f, width) in [("hot_a", a), ("hot_b", b)] {
        assert!((width - top[f]).abs() < 0.3, "{f}: width {width}%, top {}%", top[f]);
    }
    assert!(number(&v, "functions_in_table") >= 5.0, "{v:?}");
    // Clicking hot_a zooms on it: the whole width, hot_b gone, its callers above it dimmed.
    assert!(number(&v, "zoomed_hot_a") > 99.0, "{v:?}");
    assert_eq!(number(&v, "zoomed_hot_b"), 0.0, "{v:?}");
    assert!(
        number(&v, "ancestors_after_zoom") >= 3.0,
        "main, work and the root at least: {v:?}"
    );
    assert_eq!(v["callers_shown"], "True", "{v:?}");
    assert_eq!(v["callers_of"], "hot_a", "{v:?}");
    assert!(
        (number(&v, "reset_hot_b") - b).abs() < 0.01,
        "reset restores the graph: {v:?}"
    );
    // Typing "hot_b" highlights it and totals exactly the samples our reader counts for it.
    let samples = cum_samples(split, "hot_b");
    assert_eq!(number(&v, "search_samples") as u64, samples, "{v:?}");
    assert!((number(&v, "search_percent") - 25.0).abs() <= 4.0, "{v:?}");
    assert!(v["search_highlighted"].split(',').all(|f| f == "hot_b"), "{v:?}");
}

#[test]
fn the_diff_page_colours_the_grown_function() {
    let (_, split, split_b2) = profiles();
    let page_path = kept("diff.html");
    let page = report(
        &[split_b2.to_str().unwrap(), "--base", split.to_str().unwrap()],
        &page_path,
    );
    assert_self_contained(&page);
    assert!(page.contains("id=\"diff\""), "a change table");
    if !browser_installed() {
        return;
    }
    let v = browse("diff", &page_path, &kept("diff.png"));
    // hot_b went from 25 % to 40 %: every hot_b frame is coloured as a significant growth,
    // and the change table marks it so.
    let classes = &v["hot_b_classes"];
    assert!(
        !classes.is_empty() && classes.split(';').all(|c| c.contains("grown")),
        "{v:?}"
    );
    assert!(v["table_grown"].split(',').any(|f| f == "hot_b"), "{v:?}");
    assert!(!v["table_grown"].contains("hot_a"), "hot_a's share shrank: {v:?}");
}

#[test]
fn a_history_adds_its_trend_and_the_growth_hint() {
    let (_, split, split_b2) = profiles();
    let dir = scratch_dir("report_html_history");
    for i in 0..3 {
        std::fs::copy(split, dir.join(format!("run{i}.prof"))).unwrap();
    }
    let page = report(
        &[split_b2.to_str().unwrap(), "--history", dir.to_str().unwrap()],
        &kept("history.html"),
    );
    assert_self_contained(&page);
    assert!(
        page.contains("<section id=\"trend\">") && page.contains("<svg"),
        "a trend chart"
    );
    assert!(page.contains("this profile"), "the profile is the trend's last point");
    // The hints: hot_b grew against the history, linked to the graph and the change table.
    let hints = &page[page.find("id=\"hints\"").unwrap()..page.find("id=\"graph\"").unwrap()];
    assert!(hints.contains("hot_b grew against 3 earlier runs"), "{hints}");
    assert!(
        hints.contains("data-fn=\"hot_b\"") && hints.contains("href=\"#diff\""),
        "{hints}"
    );
}

#[test]
fn record_writes_the_page_beside_the_profile() {
    let (hot, _, _) = profiles();
    let dir = scratch_dir("report_html_record");
    let profile = dir.join("rec.prof");
    let _alone = alone();
    let out = Command::new(cli())
        .args([
            "record",
            "--html",
            "-o",
            profile.to_str().unwrap(),
            "--",
            hot.to_str().unwrap(),
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(dir.join("rec.html")).expect("rec.html beside rec.prof");
    assert_self_contained(&page);
    assert!(
        page.contains("\"hot_a\"") && page.contains("pid "),
        "the page of the run"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("wrote"),
        "the page is announced"
    );
}

#[test]
fn names_that_look_like_markup_stay_text() {
    // An object (and so a function name) with markup in it cannot inject markup or script.
    let dir = scratch_dir("report_html_markup");
    let profile = dir.join("markup.prof");
    let format = cpuprof::format::SlotFormat::NATIVE;
    let mut writer = cpuprof::format::ProfileWriter::new(Vec::new(), format, 1000).unwrap();
    writer.write_record(3, &[0x1000]).unwrap();
    let maps = "00001000-00002000 r-xp 00000000 00:00 0 /nonexistent/x<script>alert(1)<b>\n";
    std::fs::write(&profile, writer.finish(maps.as_bytes()).unwrap()).unwrap();
    let page = report(&[profile.to_str().unwrap()], &dir.join("markup.html"));
    assert!(page.contains("alert(1)"), "the name is in the page");
    assert!(
        !page.contains("<script>alert") && !page.contains("<b>"),
        "raw markup from a name"
    );
    assert_eq!(page.matches("<script").count(), 2, "only the page's own two scripts");
}

/// A function's cumulative samples in `cpuprof top`'s table.
fn cum_samples(profile: &Path, function: &str) -> u64 {
    let out = run_ok(cli(), &["top", "-n", "1000", profile.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().last() == Some(function))
        .unwrap_or_else(|| panic!("{function} not in\n{text}"));
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// The label picker: a profile of tests/c/labels_known.c whose /b requests also call
/// validate() (/a: serve alone; /b: serve and validate, one half each). Picking a value draws
/// that value's samples across the graph's width and states its share.
#[test]
fn a_label_value_picked_shows_its_own_flame_graph_and_share() {
    let dir = scratch_dir("report_html_labels");
    let program = compile_c(&dir, "labels_known.c", "labels_known", &["-O2"], true);
    let profile = dir.join("labels.prof");
    let env = [
        ("CPUPROFILE", profile.to_str().unwrap()),
        ("CPUPROFILE_FREQUENCY", "1000"),
        ("CPUPROFILE_TIMER", "perf"),
    ];
    run_alone(&program, &["2", "1", "b-grows"], &env);
    let page_path = kept("labels.html");
    let page = report(&[profile.to_str().unwrap()], &page_path);
    assert!(
        page.contains("\"labels\":[[\"endpoint\","),
        "the page carries the label groups"
    );
    if !browser_installed() {
        return;
    }
    let v = browse("labels", &page_path, &kept("labels.png"));
    assert_eq!(v["picker_shown"], "True");
    assert!(
        v["options"].starts_with("all;endpoint=/") && v["options"].contains("endpoint=/b ("),
        "{v:?}"
    );
    // /a: serve is the whole graph; /b: serve and validate about half each.
    assert!(number(&v, "serve/a") > 95.0 && number(&v, "validate/a") < 0.5, "{v:?}");
    for f in ["serve/b", "validate/b"] {
        assert!((35.0..65.0).contains(&number(&v, f)), "{f}: {v:?}");
    }
    // The stated shares: /a 7 of 13 units of work, /b 6 of 13.
    let stated = |key: &str| -> f64 {
        let text = &v[key];
        text.split(", ")
            .nth(1)
            .and_then(|p| p.split('%').next())
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!((stated("share/a") - 53.8).abs() < 5.0, "{v:?}");
    assert!((stated("share/b") - 46.2).abs() < 5.0, "{v:?}");
    assert!((20.0..30.0).contains(&number(&v, "validate_all")), "{v:?}");
}
