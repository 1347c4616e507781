//! The Markdown pages of the repository: every link resolves to a file in
//! the repository (a clone has nothing beside it), and every `#anchor`
//! into a page names one of its headings.

mod common;

use std::path::{Path, PathBuf};

/// Markdown files under `dir`, leaving out build output and packages.
fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if ![".git", "target", "node_modules", "dist"].contains(&name.as_str()) {
                pages(&p, out);
            }
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

/// The text of `line` outside inline code spans.
fn outside_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links and images of a page (`[text](target)`,
/// `![alt](target)`), outside code blocks and spans, with their lines.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = vec![];
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let line = outside_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push((i + 1, target.to_string()));
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces as `-`, punctuation
/// other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            !fenced && l.starts_with('#')
        })
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_markdown_link_resolves_inside_the_repository() {
    let root = common::root().canonicalize().unwrap();
    let mut all = vec![];
    pages(&root, &mut all);
    assert!(all.len() >= 10, "pages missing: {all:?}");
    let mut bad = vec![];
    let mut checked = 0;
    for page in &all {
        let text = std::fs::read_to_string(page).unwrap();
        let at = page.strip_prefix(&root).unwrap().display();
        for (line, target) in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (file, frag) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let Ok(real) = path.canonicalize() else {
                bad.push(format!("{at}:{line}: `{target}` does not exist"));
                continue;
            };
            if !real.starts_with(&root) {
                bad.push(format!("{at}:{line}: `{target}` is outside the repository"));
                continue;
            }
            if let Some(a) = frag.filter(|_| real.extension().is_some_and(|e| e == "md")) {
                let heads = anchors(&std::fs::read_to_string(&real).unwrap());
                if !heads.iter().any(|h| h == a) {
                    bad.push(format!("{at}:{line}: `{target}`: no heading `#{a}` there"));
                }
            }
        }
        // A path into the workspace's shared folder reads as a link to
        // people even in code spans: a clone has no such folder.
        for (i, l) in text.lines().enumerate() {
            if l.contains("../shared/") {
                bad.push(format!(
                    "{at}:{}: names `../shared/`, outside the repository",
                    i + 1
                ));
            }
        }
    }
    assert!(
        checked >= 30,
        "only {checked} links found: is the parser right?"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_link_parser_finds_links_and_skips_code() {
    let text =
        "see [a](x.md) and ![b](img/y.png#z) but `[c](no)`\n```\n[d](no)\n```\n[e](u.md \"title\")";
    let found: Vec<String> = links(text).into_iter().map(|x| x.1).collect();
    assert_eq!(found, ["x.md", "img/y.png#z", "u.md"]);
    assert_eq!(
        anchor(" Where Kiln differs from eager"),
        "where-kiln-differs-from-eager"
    );
    assert_eq!(anchor(" `run`: the files"), "run-the-files");
}

/// docs/import.md holds the core ATen coverage table as
/// `kiln ops --core tests/fixtures/core_aten_ops.json` prints it.
#[test]
fn the_import_page_has_the_core_coverage_table() {
    let root = common::root();
    let list = std::fs::read_to_string(root.join("tests/fixtures/core_aten_ops.json")).unwrap();
    let (torch, ops) = kiln::import::coverage::parse(&list).unwrap();
    let want = kiln::import::coverage::markdown(&torch, &ops);
    let doc = std::fs::read_to_string(root.join("docs/import.md")).unwrap();
    assert!(
        doc.contains(&want),
        "docs/import.md must hold the coverage table (kiln ops --core \
         tests/fixtures/core_aten_ops.json):\n{want}"
    );
}
