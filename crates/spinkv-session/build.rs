//! Records the source commit in `SPINKV_GIT_COMMIT` for the runtime build hash. Never fails:
//! without git (a source archive, a build sandbox) the commit is "unknown";
//! `SPINKV_BUILD_COMMIT` overrides it (for packagers).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=SPINKV_BUILD_COMMIT");
    let commit = std::env::var("SPINKV_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SPINKV_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves; only name files that exist (a missing one reruns every build).
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        let mut watch = vec![git_dir.join("HEAD"), git_dir.join("packed-refs")];
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(git_dir.join(reference));
        }
        for path in watch.into_iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
