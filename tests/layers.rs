//! The library's layers, checked on its sources: a top-level module uses only modules below
//! it, and the files of one directory have no import cycle among them. (`cli` sits on top of
//! everything and is not checked.)

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Bottom first: each may use only those before it.
const LAYERS: &[&str] = &[
    "metrics",
    "channels",
    "transport",
    "tuning",
    "fsio",
    "error",
    "session",
    "lab",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The Rust files of a top-level module (a file or a directory).
fn files_of(module: &str) -> Vec<PathBuf> {
    let file = src().join(format!("{module}.rs"));
    if file.exists() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src().join(module)];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A file's code without comments (doc links are not dependencies).
fn code(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module names that follow `prefix` in `code`: `crate::tuning::x` gives `tuning`, and
/// `crate::{channels::a, tuning}` gives both. With `super::`, `super::super::x` is skipped
/// (it is not a sibling).
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        if code[..i].ends_with("super::") || code[..i].ends_with(|c: char| c.is_alphanumeric()) {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.push(ident(&item));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty() && n != "super");
    out
}

#[test]
fn top_level_modules_use_only_the_layers_below_them() {
    let mut wrong = Vec::new();
    for (rank, module) in LAYERS.iter().enumerate() {
        for file in files_of(module) {
            {
                for used in names_after(&code(&file), "crate::") {
                    let Some(used_rank) = LAYERS.iter().position(|l| *l == used) else {
                        continue;
                    };
                    if used_rank > rank {
                        wrong.push(format!("{} uses crate::{used}", file.display()));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "layer violations:\n{}", wrong.join("\n"));
}

#[test]
fn files_of_one_directory_have_no_import_cycle() {
    let mut cycles = Vec::new();
    let mut dirs = vec![src()];
    while let Some(dir) = dirs.pop() {
        let mut siblings = BTreeMap::new();
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p.clone());
                if p.join("mod.rs").exists() {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    siblings.insert(name, p.join("mod.rs"));
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                if name != "mod" && name != "lib" && name != "main" {
                    siblings.insert(name, p);
                }
            }
        }
        // A file `super::x` refers to its sibling x (a mod.rs: to its parent's siblings).
        let edges: BTreeMap<&String, BTreeSet<String>> = siblings
            .iter()
            .map(|(name, path)| {
                let used = if path.ends_with("mod.rs") {
                    BTreeSet::new()
                } else {
                    names_after(&code(path), "super::")
                        .into_iter()
                        .filter(|n| n != name && siblings.contains_key(n))
                        .collect()
                };
                (name, used)
            })
            .collect();
        for start in edges.keys() {
            let mut stack = vec![(*start).clone()];
            let mut seen = BTreeSet::new();
            while let Some(n) = stack.pop() {
                for m in edges.get(&n).into_iter().flatten() {
                    if m == *start {
                        cycles.push(format!("{}: {start} reaches itself", dir.display()));
                    } else if seen.insert(m.clone()) {
                        stack.push(m.clone());
                    }
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_import_parser_sees_groups_and_skips_what_is_not_a_sibling() {
    let text = "use crate::{channels::a, tuning::{b, c}, Auth};\nuse super::super::x;\nuse super::{y, z::w};";
    assert_eq!(names_after(text, "crate::"), ["channels", "tuning", "Auth"]);
    assert_eq!(names_after(text, "super::"), ["y", "z"]);
}
