//! Checks of the repository's own text that run as ordinary tests: the
//! dependency list in `docs/ARCHITECTURE.md` is the workspace's.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::process::Command;

    use crate::shell;

    /// `crate: deps (optional: deps) (dev: deps)` for every workspace crate,
    /// from `cargo metadata`: the workspace crates each depends on, those
    /// behind a feature, then those only its tests and examples use.
    fn dependency_lines() -> Vec<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(shell::root())
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let packages = metadata["packages"].as_array().expect("packages");
        let ours: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
        let mut lines: Vec<String> = packages
            .iter()
            .map(|p| {
                let of_kind = |kind: Option<&str>, optional: bool| -> BTreeSet<&str> {
                    p["dependencies"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|d| d["kind"].as_str() == kind)
                        .filter(|d| d["optional"].as_bool().unwrap_or(false) == optional)
                        .filter_map(|d| d["name"].as_str())
                        .filter(|n| ours.contains(n))
                        .collect()
                };
                let normal = of_kind(None, false);
                let optional: Vec<&str> =
                    of_kind(None, true).difference(&normal).copied().collect();
                let mut dev = of_kind(Some("dev"), false);
                dev.extend(of_kind(Some("dev"), true));
                let dev: Vec<&str> = dev
                    .difference(&normal)
                    .filter(|n| !optional.contains(n))
                    .copied()
                    .collect();
                let mut line = format!("{}:", p["name"].as_str().unwrap_or("?"));
                if normal.is_empty() {
                    line.push_str(" (none)");
                } else {
                    line.push(' ');
                    line.push_str(&normal.into_iter().collect::<Vec<_>>().join(", "));
                }
                if !optional.is_empty() {
                    line.push_str(&format!(" (optional: {})", optional.join(", ")));
                }
                if !dev.is_empty() {
                    line.push_str(&format!(" (dev: {})", dev.join(", ")));
                }
                line
            })
            .collect();
        lines.sort();
        lines
    }

    /// The lines of the ```text block under "### Dependency list".
    fn documented_lines() -> Vec<String> {
        let doc = std::fs::read_to_string(shell::root().join("docs").join("ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
        let section = doc
            .split("### Dependency list")
            .nth(1)
            .expect("a \"### Dependency list\" section");
        let block = section
            .split("```text\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("a ```text block in it");
        block.lines().map(str::to_owned).collect()
    }

    #[test]
    fn architecture_lists_every_workspace_dependency() {
        let actual = dependency_lines();
        assert_eq!(
            documented_lines(),
            actual,
            "docs/ARCHITECTURE.md's dependency list is stale; it should read:\n{}",
            actual.join("\n")
        );
    }
}
